"""Many ranks: each rank's trace summarised on a worker (the map), the summaries cached as Parquet
keyed by the trace's content hash, then reduced across ranks (`analyzer/cross_rank.py`).

Engine (`moetune/scale_cluster.py`): Dask `distributed` (the `scale` extra). A handful of files
left to summarise runs in-process (no Dask needed); more start a `LocalCluster` (one
single-threaded worker process per core, each under a memory limit; without Dask and without
`workers=`, in-process one at a time); `scheduler=`/`scheduler_file=` attach to a running cluster
(`dask scheduler` + `dask worker`, or `dask-jobqueue` on Slurm: docs/scale.md). Workers write the
summary and return only where it is, so the client never holds a trace.

Cache (`moetune/scale_cache.py`): `<cache>/v<SUMMARY_VERSION>/<sha[:2]>/<sha256>-<options>-
<position>/<table>.parquet`, plus `<cache>/index.parquet` (path, size, mtime, position → summary
directory), so a re-run finds its summaries without hashing or reading a trace. Default `<trace
dir>/.moetune-cache/`; nothing a user gave is modified. Options are part of the key: `--window`
or `--step-range` give other summaries.

Reduce (`moetune/scale_reduce.py`): the sections that speak of every rank.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from moetune.errors import UserError
from moetune.scale_cache import (
    CACHE_NAME,
    cache_dir,
    options_key,
    read_index,
    stat_key,
    summary_dir,
    write_index,
)
from moetune.scale_cluster import (
    IN_PROCESS_MAX,
    INSTALL_HINT,
    MIN_WORKER_GB,
    WORKER_MEMORY,
    Progress,
    ScaleOptions,
    has_dask,
    on_dask,
)
from moetune.scale_reduce import (
    MapResult,
    cross_rank_lines,
    cross_rank_section,
    inputs,
    load_rank_fn,
    rank_breakdown_section,
    ranks_section,
    representative_rank,
)

if TYPE_CHECKING:  # polars and the analyzer load on use: every command's parser imports this
    from moetune.analyzer.rank_summary import Summaries

SCALE_ABOVE_FILES = 8  # commands take this path for directories of more files than this
__all__ = ["CACHE_NAME", "IN_PROCESS_MAX", "SCALE_ABOVE_FILES", "MapResult", "ScaleOptions",
           "cross_rank_lines", "load_rank_fn", "summary_dir"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The scale flags every command that reads rank directories takes."""
    g = p.add_argument_group("many ranks (docs/scale.md)")
    g.add_argument("--cache", metavar="DIR", type=Path,
                   help="per-rank summary cache (default: .moetune-cache/ beside the traces); "
                   "giving it, or a scheduler, takes the many-ranks path")
    g.add_argument("--scheduler", metavar="ADDRESS",
                   help="summarise the ranks on this Dask scheduler (tcp://host:8786)")
    g.add_argument("--scheduler-file", metavar="FILE", type=Path,
                   help="summarise the ranks on the Dask cluster this scheduler file names")
    g.add_argument("--workers", type=int, metavar="N",
                   help="local cluster workers (default: one per core)")
    g.add_argument("--worker-memory", type=float, metavar="GB", default=WORKER_MEMORY / 1e9,
                   help=f"memory limit of each local worker (default {WORKER_MEMORY / 1e9:g})")


def options_from_args(args: argparse.Namespace) -> ScaleOptions:
    if args.workers is not None and args.workers < 1:
        raise UserError("--workers must be at least 1")
    if args.worker_memory < MIN_WORKER_GB:
        # below it a worker is killed for memory as it starts, before any task: no error, a hang
        raise UserError(f"--worker-memory must be at least {MIN_WORKER_GB:g} (GB): a worker "
                        "process holds ~0.2 GB before it reads a trace")
    return ScaleOptions(cache=args.cache, scheduler=args.scheduler,
                        scheduler_file=args.scheduler_file, workers=args.workers,
                        worker_memory=int(args.worker_memory * 1e9),
                        window=getattr(args, "window", None),
                        step_range=getattr(args, "step_range", None),
                        progress=not getattr(args, "quiet", False))


def wanted(paths: Sequence[str | Path], opts: ScaleOptions) -> bool:
    """Whether a command should take the many-ranks path: a flag asked for it, or a directory
    holds more trace files than the in-process pipeline should hold at once."""
    if opts.attached or opts.cache is not None:
        return True
    from moetune.analyzer.readers import expand

    if not any(Path(p).is_dir() for p in paths):
        return False
    try:
        return len(expand(paths)) > SCALE_ABOVE_FILES
    except UserError:
        return False  # the ordinary path says what is wrong with the input


def rank_files(paths: Sequence[str | Path]) -> list[Path]:
    """Trace files of the inputs (directories expanded as the readers do), in the order given."""
    from moetune.analyzer.readers import expand

    return expand(paths)


def summarize_ranks(paths: Sequence[str | Path], opts: ScaleOptions | None = None,
                    *, stream: TextIO | None = None) -> MapResult:
    """The map: every file's summary, from the cache or computed (in-process or on Dask)."""
    opts = opts or ScaleOptions()
    t0 = time.perf_counter()
    files = rank_files(paths)
    if opts.scheduler_file is not None and not opts.scheduler_file.is_file():
        raise UserError("no such scheduler file", path=opts.scheduler_file)
    cache, warnings = cache_dir(files, opts.cache)
    okey = options_key(opts)
    index = read_index(cache)
    found: dict[int, Path] = {}
    todo: list[int] = []
    for i, f in enumerate(files):
        d = index.get(stat_key(f, i, okey))
        if d is not None and (d / "meta.parquet").is_file():
            found[i] = d
        else:
            todo.append(i)
    engine = "cached"
    peak: dict[str, int] = {}
    computed = 0
    cached = len(found)
    if todo:
        with Progress(len(files), len(found), opts.progress, stream) as prog:
            local = len(todo) <= opts.in_process_max
            if not opts.attached and not local and opts.workers is None and not has_dask():
                # no cluster asked for and none possible: one rank after the other, here
                local = True
                warnings.append(f"Dask not installed: {len(todo)} ranks summarised in this "
                                f"process, one at a time ({INSTALL_HINT} for a local cluster)")
            if opts.attached:
                engine, out, peak = on_dask(_map_one, files, todo, cache, okey, opts, prog)
            elif local:
                engine = "in-process"
                out = {}
                for i in todo:
                    out[i] = _map_one(str(files[i]), i, str(cache), okey, opts.window,
                                      opts.step_range)
                    if "error" in out[i]:
                        raise UserError(out[i]["error"])  # the first bad file stops the run
                    prog.advance(out[i]["cached"])
            else:
                engine, out, peak = on_dask(_map_one, files, todo, cache, okey, opts, prog)
        for i in todo:
            r = out[i]
            if "error" in r:
                raise UserError(r["error"])
            found[i] = Path(r["dir"])
            cached += bool(r["cached"])
            computed += not r["cached"]
        write_index(cache, {stat_key(files[i], i, okey): found[i] for i in todo}, index)
    summaries, rank_file, rank_in_file = _as_given([found[i] for i in range(len(files))], files)
    return MapResult(summaries=summaries, files=files, rank_file=rank_file,
                     rank_in_file=rank_in_file, engine=engine,
                     cache_dir=cache, computed=computed, cached=cached,
                     seconds=time.perf_counter() - t0, worker_peak_rss=peak, warnings=warnings)


def _map_one(path: str, index: int, cache: str, okey: str, window: str | None,
             step_range: str | None) -> dict[str, Any]:
    """One file on a worker: its summary directory (computed and written unless the cache has
    it). Bad input comes back as `{"error": line}` so that the client says it in one line."""
    from moetune.analyzer import rank_summary

    try:
        sha = rank_summary.file_sha256(path)
        d = summary_dir(Path(cache), sha, okey, index)
        if (d / "meta.parquet").is_file():
            return {"dir": str(d), "cached": True}
        s = rank_summary.summarize(path, default_rank=index, window=window,
                                   step_range=step_range, sha256=sha)
        rank_summary.write(s, d)
        return {"dir": str(d), "cached": False}
    except UserError as exc:
        return {"error": exc.message if exc.path else f"{path}: {exc.message}"}
    except OSError as exc:  # the cache, not the trace: full, or not writable from this worker
        return {"error": f"{cache}: cannot write the summary of {Path(path).name} "
                         f"({exc.strerror or exc})"}
    finally:
        from moetune.analyzer.readers.kineto_scan import trim_heap

        trim_heap()  # the trace's freed memory back to the OS before the next file


def _as_given(dirs: list[Path], files: list[Path]
              ) -> tuple[Summaries, dict[int, Path], dict[int, int]]:
    """The summaries of `dirs` (one per file) as this run names the files (a cached summary may
    have been written for a copy under another name), and each rank's (file, rank in the file).

    Ranks are numbered as the one-process readers number them (`run_identity._renumber_all`):
    ranks a file's metadata declares stay; a file whose undeclared ranks (`file_order`, e.g. an
    nsys export without NCCL's rank) collide with others' takes the lowest free numbers; two
    files declaring one rank are not ranks of one run."""
    import polars as pl

    from moetune.analyzer import rank_summary
    from moetune.analyzer.rank_summary import Summaries

    s = rank_summary.read(dirs, source="_src")
    at = {str(d): i for i, d in enumerate(dirs)}
    meta = s.meta.with_columns(_i=pl.col("_src").replace_strict(at, return_dtype=pl.Int64))
    parts: list[tuple[list[int], bool]] = [([], True) for _ in files]
    for rank, i, origin in meta.select("rank", "_i", "rank_from").iter_rows():
        parts[i][0].append(int(rank))
        parts[i] = (parts[i][0], parts[i][1] and origin not in (None, "file_order"))
    owner: dict[int, int] = {}
    mapping: dict[int, dict[int, int]] = {}
    for i, (ranks, declared) in enumerate(parts):  # declared ranks first: they keep theirs
        if not declared:
            continue
        for r in ranks:
            if r in owner:
                raise UserError(f"holds rank {r}, as does {files[owner[r]]}: not ranks of one "
                                "run", path=files[i])
            owner[r] = i
    for i, (ranks, declared) in enumerate(parts):
        if declared:
            continue
        if set(ranks) & set(owner):
            free = (n for n in range(len(owner) + len(ranks) + 1) if n not in owner)
            mapping[i] = {r: next(free) for r in ranks}
        for r in ranks:
            owner[mapping.get(i, {}).get(r, r)] = i
    names = {str(d): f.name for d, f in zip(dirs, files, strict=True)}
    out = {}
    for name in rank_summary.SCHEMAS:
        df = getattr(s, name)
        if mapping:
            remap = pl.DataFrame(
                [(str(dirs[i]), old, new) for i, m in mapping.items() for old, new in m.items()],
                schema={"_src": pl.String, "rank": pl.Int32, "_new": pl.Int32}, orient="row")
            df = (df.join(remap, on=["_src", "rank"], how="left")
                  .with_columns(rank=pl.coalesce("_new", "rank")).drop("_new"))
        if name == "meta":
            df = df.with_columns(file=pl.col("_src").replace_strict(names))
        out[name] = df.drop("_src").sort("rank", maintain_order=True)
    rank_file: dict[int, Path] = {}
    rank_in_file: dict[int, int] = {}
    for i, (ranks, _) in enumerate(parts):
        for r in ranks:
            rank_file[mapping.get(i, {}).get(r, r)] = files[i]
            rank_in_file[mapping.get(i, {}).get(r, r)] = r
    return Summaries(**out), rank_file, rank_in_file


def summary_lines(result: MapResult) -> list[str]:
    """The terminal's line on how the ranks were summarised."""
    n = result.summaries.meta.height
    how = (f"{result.computed} summarised ({result.engine}), {result.cached} from the cache"
           if result.computed else f"all {result.cached} files from the cache")
    return [f"summaries: {n} ranks from {len(result.files)} files · {how} in "
            f"{result.seconds:,.1f} s · cache {result.cache_dir}"]


def map_reduce(paths: Sequence[str | Path], opts: ScaleOptions, contract: Any = None, *,
               stream: TextIO | None = None) -> tuple[MapResult, int, dict[str, Any]]:
    """Every rank summarised (the map, over the contract's steady window unless a flag gives
    one) and reduced: the map's result, the typical rank (`representative_rank`, whose full
    trace stands for the run in the per-step views) and `{"cross_rank": …, "ranks": …}`."""
    from moetune.progress import progress

    result = summarize_ranks(paths, contract_window(opts, contract), stream=stream)
    s = result.summaries
    if s.steps.height == 0:
        raise UserError(f"no rank of the {len(result.files)} files has a complete step",
                        path=Path(paths[0]) if len(paths) == 1 else None)
    with progress(f"reducing {s.meta.height} ranks", enabled=opts.progress, stream=stream):
        cross = cross_rank_section(result)
    cross["ranks"] = ranks_section(s, cross)
    cross.update(rank_breakdown_section(s))
    return result, representative_rank(s), cross


def diagnose_many(paths: Sequence[str | Path], opts: ScaleOptions, contract: Any = None, *,
                  audit: bool = False, extra_sections: Sequence[Any] = (),
                  stream: TextIO | None = None) -> tuple[Any, MapResult]:
    """(Analysis, MapResult) of a run of many ranks: every rank summarised (the map), the
    cross-rank view from all summaries (`cross_rank`), and the per-step sections (walls,
    critical path, what-if, …) from the full trace of one typical rank
    (`representative_rank`), which a warning names; `inputs` and `ranks_analyzed` list all."""
    from dataclasses import replace as dc_replace

    from moetune.analysis import analyze
    from moetune.analyzer.diagnose import normalize
    from moetune.progress import progress

    result, rep, cross = map_reduce(paths, opts, contract, stream=stream)
    opts = contract_window(opts, contract)
    s = result.summaries
    rep_file = result.rank_file[rep]
    with progress(f"analysing rank {rep} ({rep_file.name})", enabled=opts.progress,
                  stream=stream):
        an = analyze([rep_file], contract, window=opts.window, step_range=opts.step_range,
                     audit=audit, extra_sections=extra_sections)
    doc = dict(an.diagnosis or {})
    doc["inputs"] = inputs(result)
    doc["ranks_analyzed"] = sorted(set(s.steps.get_column("rank").to_list()))
    n = s.meta.height
    doc["warnings"] = [*doc.get("warnings", []), *result.warnings,
                       f"{n} ranks: per-step walls, critical path, what-if and top tables are "
                       f"of rank {rep} ({rep_file.name}, the median rank by step time); "
                       f"cross_rank covers all {n}"]
    doc.update(cross)
    return dc_replace(an, files=tuple(result.files), diagnosis=normalize(doc)), result


def contract_window(opts: ScaleOptions, contract: Any) -> ScaleOptions:
    """The contract's steady window and step range where no flag gives them, as the diagnosis
    itself reads them, so that the summaries cover the steps the diagnosis analyses."""
    if contract is None or (opts.window is not None and opts.step_range is not None):
        return opts
    from dataclasses import replace as dc_replace

    from moetune.analysis import read_contract
    from moetune.analyzer.contract import thaw

    con = read_contract(contract)
    win = (thaw(con).get("window") or {}) if con is not None else {}
    return dc_replace(opts, window=opts.window if opts.window is not None else win.get("steady"),
                      step_range=opts.step_range or win.get("step_range"))


