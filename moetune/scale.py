"""Many ranks: each rank's trace summarised on a worker (the map), the summaries cached as Parquet
keyed by the trace's content hash, then reduced across ranks (`analyzer/cross_rank.py`).

Engine: Dask `distributed` (the `scale` extra). A handful of files left to summarise runs
in-process (no Dask needed); more start a `LocalCluster` (one single-threaded worker process per
core, each under a memory limit; without Dask and without `workers=`, in-process one at a
time); `scheduler=`/`scheduler_file=` attach to a running cluster
(`dask scheduler` + `dask worker`, or `dask-jobqueue` on Slurm: docs/scale.md). Workers write the
summary and return only where it is, so the client never holds a trace.

Cache: `<cache>/v<SUMMARY_VERSION>/<sha[:2]>/<sha256>-<options>-<position>/<table>.parquet`,
plus `<cache>/index.parquet` (path, size, mtime, position → summary directory), so a re-run finds
its summaries without hashing or reading a trace. Default `<trace dir>/.moetune-cache/`;
nothing a user gave is modified. Options are part of the key: `--window` or `--step-range` give
other summaries.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import resource
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from moetune import __version__
from moetune.errors import UserError
from moetune.progress import DELAY_S, SPIN, TICK_S

if TYPE_CHECKING:  # polars and the analyzer load on use: every command's parser imports this
    from moetune.analyzer.rank_summary import Summaries

IN_PROCESS_MAX = 4  # files left to summarise at or below which no cluster is started
SCALE_ABOVE_FILES = 8  # commands take this path for directories of more files than this
WORKER_MEMORY = 1_500_000_000  # bytes per LocalCluster worker: no process above 1.5 GB
MIN_WORKER_GB = 0.5
CONNECT_TIMEOUT_S = 10
INSTALL_HINT = "pip install 'moetune[scale]'"
CACHE_NAME = ".moetune-cache"


@dataclass(frozen=True)
class ScaleOptions:
    """How to run the map (see the module doc); every field has a working default."""

    cache: Path | None = None
    scheduler: str | None = None
    scheduler_file: Path | None = None
    workers: int | None = None  # LocalCluster workers (default: the cores)
    worker_memory: int = WORKER_MEMORY
    in_process_max: int = IN_PROCESS_MAX
    window: str | None = None
    step_range: str | None = None
    progress: bool = True

    @property
    def attached(self) -> bool:
        return bool(self.scheduler or self.scheduler_file)


@dataclass
class MapResult:
    """The summaries of every rank and how they were obtained."""

    summaries: Summaries
    files: list[Path]  # in the order given (a file's index is its default rank)
    rank_file: dict[int, Path]  # rank → the file it came from
    rank_in_file: dict[int, int]  # rank → its number in that file (differs where renumbered)
    engine: str  # "cached", "in-process", "local cluster, N workers", "scheduler ADDRESS"
    cache_dir: Path
    computed: int  # files summarised in this run
    cached: int  # files served from the cache
    seconds: float
    worker_peak_rss: dict[str, int] = field(default_factory=dict)  # worker → bytes (Dask only)
    warnings: list[str] = field(default_factory=list)


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
    cache, warnings = _cache_dir(files, opts.cache)
    okey = _options_key(opts)
    index = _read_index(cache)
    found: dict[int, Path] = {}
    todo: list[int] = []
    for i, f in enumerate(files):
        d = index.get(_stat_key(f, i, okey))
        if d is not None and (d / "meta.parquet").is_file():
            found[i] = d
        else:
            todo.append(i)
    engine = "cached"
    peak: dict[str, int] = {}
    computed = 0
    cached = len(found)
    if todo:
        with _Progress(len(files), len(found), opts.progress, stream) as prog:
            local = len(todo) <= opts.in_process_max
            if not opts.attached and not local and opts.workers is None and not _has_dask():
                # no cluster asked for and none possible: one rank after the other, here
                local = True
                warnings.append(f"Dask not installed: {len(todo)} ranks summarised in this "
                                f"process, one at a time ({INSTALL_HINT} for a local cluster)")
            if opts.attached:
                engine, out, peak = _on_dask(files, todo, cache, okey, opts, prog)
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
                engine, out, peak = _on_dask(files, todo, cache, okey, opts, prog)
        for i in todo:
            r = out[i]
            if "error" in r:
                raise UserError(r["error"])
            found[i] = Path(r["dir"])
            cached += bool(r["cached"])
            computed += not r["cached"]
        _write_index(cache, {_stat_key(files[i], i, okey): found[i] for i in todo}, index)
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
        from moetune.analyzer.readers.kineto import trim_heap

        trim_heap()  # the trace's freed memory back to the OS before the next file


def summary_dir(cache: Path, sha: str, okey: str, index: int) -> Path:
    """Where the summary of a file with this content is kept. The file's position is part of
    the key because a file whose metadata names no rank takes its position as its rank."""
    from moetune.analyzer import rank_summary

    return cache / f"v{rank_summary.SUMMARY_VERSION}" / sha[:2] / f"{sha}-{okey}-{index}"


def _options_key(opts: ScaleOptions) -> str:
    from moetune.analyzer import rank_summary

    blob = json.dumps({"v": rank_summary.SUMMARY_VERSION, "moetune": __version__,
                       "window": opts.window, "step_range": opts.step_range}, sort_keys=True,
                      default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def _cache_dir(files: list[Path], cache: Path | None) -> tuple[Path, list[str]]:
    """The cache directory, created if need be: the one given, else `.moetune-cache/` beside
    the first trace, else (that directory read-only) the user's cache directory."""
    if cache is not None:
        try:
            cache.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UserError(f"cannot create the cache directory: {exc.strerror or exc}",
                            path=cache) from None
        if not os.access(cache, os.W_OK):
            raise UserError("cache directory is not writable", path=cache)
        return cache, []
    beside = files[0].parent / CACHE_NAME
    with contextlib.suppress(OSError):
        beside.mkdir(exist_ok=True)
        if os.access(beside, os.W_OK):
            return beside, []
    home = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "moetune" / "scale"
    try:
        home.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"no writable cache directory (give --cache DIR): {exc.strerror or exc}",
                        path=beside) from None
    return home, [f"{files[0].parent}: not writable, summaries cached in {home}"]


def _stat_key(f: Path, index: int, okey: str) -> tuple[str, int, int, int, str]:
    try:
        st = f.stat()
    except OSError as exc:
        raise UserError(f"cannot read: {exc.strerror or exc}", path=f) from None
    return (str(f.resolve()), st.st_size, st.st_mtime_ns, index, okey)


def _index_schema() -> Any:
    import polars as pl

    return pl.Schema({"path": pl.String, "size": pl.Int64, "mtime_ns": pl.Int64,
                      "index": pl.Int64, "okey": pl.String, "dir": pl.String})


def _read_index(cache: Path) -> dict[tuple[str, int, int, int, str], Path]:
    import polars as pl

    f = cache / "index.parquet"
    try:
        df = pl.read_parquet(f) if f.is_file() else pl.DataFrame(schema=_index_schema())
        rows = df.select(_index_schema().names()).iter_rows()
    except (OSError, pl.exceptions.PolarsError):
        return {}  # a damaged index costs a re-hash, nothing more
    return {(p, s, m, i, k): Path(d) for p, s, m, i, k, d in rows}


def _write_index(cache: Path, new: dict[tuple[str, int, int, int, str], Path],
                 old: dict[tuple[str, int, int, int, str], Path]) -> None:
    import polars as pl

    rows = [(*k, str(d)) for k, d in {**old, **new}.items()]
    df = pl.DataFrame(rows, schema=_index_schema(), orient="row")
    tmp = cache / f".index.{os.getpid()}.parquet"
    try:
        df.write_parquet(tmp)
        tmp.replace(cache / "index.parquet")  # atomic: a concurrent run reads one or the other
    except OSError:
        tmp.unlink(missing_ok=True)  # no index: the next run hashes the files again


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


def _has_dask() -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec("distributed") is not None
    except (ImportError, ValueError):  # a blocked or broken install counts as none
        return False


def _dask() -> Any:
    try:
        import distributed
    except ImportError:
        raise UserError(f"summarising many ranks needs Dask: {INSTALL_HINT}") from None
    return distributed


def _on_dask(files: list[Path], todo: list[int], cache: Path, okey: str, opts: ScaleOptions,
             prog: _Progress) -> tuple[str, dict[int, dict[str, Any]], dict[str, int]]:
    """The files of `todo` mapped on a cluster: attached, or a LocalCluster started here."""
    distributed = _dask()
    with _client(distributed, opts, len(todo)) as (client, engine):
        prog.engine = engine
        futures = {}
        run = uuid.uuid4().hex[:12]  # keys unique to this run: a shared scheduler never
        # hands one run's result to another that mapped a file at the same position
        _reset_peaks(client)
        for i in todo:
            fut = client.submit(_map_one, str(files[i]), i, str(cache), okey, opts.window,
                                opts.step_range, pure=False, key=f"moetune-map-{run}-{i}")
            futures[fut.key] = (i, fut)
        out: dict[int, dict[str, Any]] = {}
        try:
            for fut in distributed.as_completed([f for _, f in futures.values()],
                                               loop=client.loop):
                i = futures[fut.key][0]
                try:
                    out[i] = fut.result()
                except distributed.KilledWorker:
                    more = ("give the cluster's workers more memory" if opts.attached else
                            f"its limit is {opts.worker_memory / 1e9:g} GB: --worker-memory GB")
                    raise UserError(f"the workers summarising it were killed (out of memory? "
                                    f"{more})", path=files[i]) from None
                if "error" in out[i]:
                    raise UserError(out[i]["error"])  # the first bad file stops the run
                prog.advance(out[i]["cached"])
        finally:
            for _, f in futures.values():
                f.cancel()
        peak = _worker_peaks(client)
    return engine, out, peak


@contextlib.contextmanager
def _client(distributed: Any, opts: ScaleOptions, n: int) -> Iterator[tuple[Any, str]]:
    """A connected client and the engine's name; a LocalCluster lives as long as the block."""
    import logging

    if opts.attached:
        address = _scheduler_address(distributed, opts)
        try:
            client = distributed.Client(address, timeout=CONNECT_TIMEOUT_S, set_as_default=False)
        except (OSError, TimeoutError, ValueError) as exc:
            text = " ".join(str(exc).split()) or type(exc).__name__
            raise UserError(f"cannot reach the Dask scheduler ({text[:200]})",
                            path=opts.scheduler_file or address) from None
        try:
            yield client, f"scheduler {client.scheduler.address}"
        finally:
            client.close()
        return
    workers = max(1, min(opts.workers or _cores(), n))
    # Workers are single-threaded processes: polars in each gets one thread, so N workers use
    # N cores rather than N² threads fighting over them.
    saved = os.environ.get("POLARS_MAX_THREADS")
    os.environ["POLARS_MAX_THREADS"] = "1"
    try:
        cluster = distributed.LocalCluster(
            n_workers=workers, threads_per_worker=1, processes=True,
            memory_limit=opts.worker_memory, dashboard_address=None,
            # no dashboard; the scheduler's HTTP endpoint on a free port, not 8787, which
            # another cluster on this machine may hold
            scheduler_kwargs={"dashboard": False, "dashboard_address": "127.0.0.1:0"},
            silence_logs=logging.CRITICAL, host="127.0.0.1")  # our one line says it
    finally:
        if saved is None:
            os.environ.pop("POLARS_MAX_THREADS", None)
        else:
            os.environ["POLARS_MAX_THREADS"] = saved
    try:
        client = distributed.Client(cluster, set_as_default=False)
        try:
            yield client, f"local cluster, {workers} worker{'s' if workers != 1 else ''}"
        finally:
            client.close()
    finally:
        cluster.close()


def _scheduler_address(distributed: Any, opts: ScaleOptions) -> str:
    """The scheduler's address, from the option or its scheduler file, checked before Dask gets
    it: a plain TCP connect says at once that nobody listens (Dask would retry until its
    timeout, and a client that never connected leaves noise on stderr at exit)."""
    import socket

    where: str | Path
    if opts.scheduler_file is not None:
        where = opts.scheduler_file
        try:
            info = json.loads(opts.scheduler_file.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise UserError("no such scheduler file", path=where) from None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise UserError(f"not a Dask scheduler file ({exc})".splitlines()[0],
                            path=where) from None
        address = info.get("address") if isinstance(info, dict) else None
        if not isinstance(address, str) or not address:
            raise UserError("not a Dask scheduler file (no address in it)", path=where)
    else:
        where = address = str(opts.scheduler)
    try:
        scheme, _ = distributed.comm.parse_address(address)
        distributed.comm.registry.get_backend(scheme)  # an unknown scheme: ValueError here
        host, port = (distributed.comm.get_address_host_port(address) if scheme in ("tcp", "tls")
                      else (None, None))
    except (ValueError, TypeError) as exc:
        raise UserError(f"not a Dask scheduler address {address!r} ({exc})", path=where) from None
    if host is not None:
        try:
            socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S).close()
        except OSError as exc:
            raise UserError(f"cannot reach the Dask scheduler at {address} "
                            f"({exc.strerror or exc})", path=where) from None
    return address


def _reset_peaks(client: Any) -> None:
    """Start every worker's peak from its resident memory now, so the peak is this run's."""
    with contextlib.suppress(Exception):  # a measurement, never a reason to fail the run
        client.run(_reset_peak_rss)


def _reset_peak_rss() -> None:
    # a spawned worker inherits its parent's high-water mark across fork and exec;
    # Linux ≥ 4.0 resets it to the current RSS on "5" (proc(5), clear_refs)
    with contextlib.suppress(OSError), open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _worker_peaks(client: Any) -> dict[str, int]:
    """Peak resident memory of every worker process (bytes), as its kernel counted it."""
    try:
        return {str(k): int(v) for k, v in client.run(_peak_rss).items()}
    except Exception:  # a measurement, never a reason to fail the run
        return {}


def _peak_rss() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def _cores() -> int:
    from moetune.analyzer.readers.cores import cpu_count

    return cpu_count()


class _Progress:
    """`⠋ summarising ranks 37/512 (12 cached) · local cluster, 2 workers … 12.3 s` on stderr,
    as `moetune.progress` does it: a terminal only, after a second, erased at the end."""

    def __init__(self, total: int, done: int, enabled: bool, stream: TextIO | None) -> None:
        self.total, self.done, self.cached = total, done, done
        self.engine = "in-process"
        self.err = stream or sys.stderr
        self.enabled = enabled and getattr(self.err, "isatty", lambda: False)()
        self._stop = threading.Event()
        self._shown = False
        self._t0 = time.monotonic()
        self._thread: threading.Thread | None = None

    def advance(self, cached: bool) -> None:
        self.done += 1
        self.cached += bool(cached)

    def line(self) -> str:
        return (f"summarising ranks {self.done}/{self.total} ({self.cached} cached) · "
                f"{self.engine} … {time.monotonic() - self._t0:,.1f} s")

    def _tick(self) -> None:
        if self._stop.wait(DELAY_S):
            return
        i = 0
        while not self._stop.is_set():
            self.err.write(f"\r{SPIN[i % len(SPIN)]} {self.line()} ")
            self.err.flush()
            self._shown = True
            i += 1
            self._stop.wait(TICK_S)

    def __enter__(self) -> _Progress:
        if self.enabled:
            self._thread = threading.Thread(target=self._tick, name="moetune-scale-progress",
                                            daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._shown:
            self.err.write("\r\033[K")
            self.err.flush()


def load_rank_fn(result: MapResult) -> Callable[[int], Any]:
    """`load_rank(rank) -> Trace` for the reduce: the full trace of one rank, re-read from its
    file (only for the ranks the cross-rank critical path passes through)."""
    from moetune.analyzer.frames import Trace
    from moetune.analyzer.readers import sniff
    from moetune.analyzer.readers.kineto import read_kineto
    from moetune.analyzer.readers.nsys import read_nsys

    index = {f: i for i, f in enumerate(result.files)}

    def load_rank(rank: int) -> Trace:
        import polars as pl

        from moetune.analyzer.run_identity import renumber

        f = result.rank_file.get(int(rank))
        if f is None:
            raise UserError(f"no file holds rank {rank}")
        i, own = index[f], result.rank_in_file[int(rank)]
        t = (read_kineto(f, default_rank=i) if sniff(f) == "kineto"
             else read_nsys(f, first_rank=i))
        if t.ranks.height > 1:  # a multi-rank export: the one rank asked for
            keep = pl.col("rank") == own
            t = Trace(events=t.events.filter(keep), comms=t.comms.filter(keep),
                      flows=t.flows.filter(keep), ranks=t.ranks.filter(keep),
                      memory=t.memory.filter(keep), warnings=t.warnings)
        return t if own == int(rank) else renumber(t, {own: int(rank)})

    return load_rank


def cross_rank_section(result: MapResult) -> dict[str, Any]:
    """`{"cross_rank": {...}}` from the summaries (`moetune.analyzer.cross_rank`)."""
    from moetune.analyzer.cross_rank import cross_rank

    return cross_rank(result.summaries, load_rank=load_rank_fn(result))


def representative_rank(s: Summaries) -> int:
    """The rank whose median step time is the median over ranks (lower median): a typical rank,
    whose full trace stands for the run in the per-step sections of the diagnosis."""
    import polars as pl

    if s.steps.height == 0:
        return int(s.meta.get_column("rank").min())
    per = (s.steps.group_by("rank")
           .agg(((pl.col("end_ns") - pl.col("start_ns")).sort().get(
               (pl.len() - 1) // 2)).alias("t"))
           .sort("t", "rank"))
    return int(per.get_column("rank")[(per.height - 1) // 2])


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
    doc["inputs"] = _inputs(result)
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


def ranks_section(s: Summaries, cross: dict[str, Any] | None) -> dict[str, Any]:
    """The diagnosis' `ranks` section (analyzer/ranks.py's figures: step time by rank,
    stragglers, collective arrival skew) over every rank, from the summaries, on the clocks the
    cross-rank reduce aligned, so `ranks` speaks of all ranks as it does in-process."""
    from moetune.analyzer.collectives import match_collectives
    from moetune.analyzer.ranks import arrival_skew, step_time_by_rank, straggler_fields

    al = ((cross or {}).get("cross_rank") or {}).get("alignment") or {}
    offsets = {int(k): int(v) for k, v in (al.get("offsets_ns") or {}).items()}
    inst = s.collectives.select("rank", "group", "k", "ts_ns", "end_ns")
    unlinked: dict[str, int] = {}
    matched = match_collectives(inst, offsets, unlinked)
    st = step_time_by_rank(s.steps)
    # one verdict with the cross-rank view's: ranks that no collective joins are not peers
    why = (((cross or {}).get("cross_rank") or {}).get("stragglers") or {}).get("unobservable")
    return {
        "count": s.meta.height,
        "step_time_s_by_rank": {str(k): round(v, 9) for k, v in st.items()},
        **straggler_fields(st, unobservable=why),
        "collective_arrival_skew_s": arrival_skew(matched),
        "alignment": {"method": al.get("method", "none"),
                      "offsets_ns": {str(k): v for k, v in sorted(offsets.items())},
                      "unaligned": list(al.get("unaligned", []))},
        "unlinked": {"collectives_unmatched": unlinked.get("collectives_unmatched", 0),
                     "collectives": inst.height},
    }


def cross_rank_lines(doc: dict[str, Any]) -> list[str]:
    """The terminal's lines for the `cross_rank` section."""
    from moetune.analyzer.cross_rank import summary_lines

    return list(summary_lines(doc)) if doc.get("cross_rank") else []


def _inputs(result: MapResult) -> list[dict[str, Any]]:
    """The diagnosis' `inputs`: one entry per file, from the summaries' meta."""
    by: dict[str, dict[str, Any]] = {}
    for r in result.summaries.meta.sort("rank").iter_rows(named=True):
        e = by.setdefault(r["file"], {"file": r["file"], "format": r["format"], "ranks": [],
                                      "bytes": int(r["bytes"]), "sha256": r["sha256"]})
        e["ranks"].append(int(r["rank"]))
    return [by[k] for k in sorted(by)]
