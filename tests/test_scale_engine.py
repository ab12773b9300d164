"""The engine of `moetune.scale`: in-process, a LocalCluster, and a real `dask scheduler` +
`dask worker` started separately on localhost, attached through a scheduler file and an
address; the hash-keyed cache; bad input as one line and exit 2. Real files, real Dask."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import polars as pl
import pytest
from moetune.analyzer import rank_summary as rs

from moetune import scale
from moetune.cli import main
from moetune.errors import UserError
from tests.test_scale_map import make_job

ROOT = Path(__file__).resolve().parents[1]
GB = 1_500_000_000


def _digests(d: Path) -> dict[str, str]:
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(d.iterdir())
            if f.is_file()}


def _same(a: rs.Summaries, b: rs.Summaries) -> None:
    for name in rs.SCHEMAS:
        x, y = getattr(a, name), getattr(b, name)
        keys = [c for c in ("rank", "step", "group", "k", "wall", "cls", "cause", "kind", "name")
                if c in x.columns]
        assert x.sort(keys).equals(y.sort(keys)), name


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("job6")
    make_job(d, 6)
    return d


@pytest.fixture(scope="module")
def reference(job: Path) -> rs.Summaries:
    """Every rank summarised directly, one file after the other: what any engine must give."""
    return rs.Summaries.concat([rs.summarize(f, default_rank=i)
                                for i, f in enumerate(sorted(job.iterdir()))])


def test_in_process_then_cached(tmp_path: Path) -> None:
    job = tmp_path / "job"
    files = make_job(job, 3)
    before = _digests(job)
    first = scale.summarize_ranks([job])
    assert first.engine == "in-process" and (first.computed, first.cached) == (3, 0)
    assert first.cache_dir == job / scale.CACHE_NAME  # default: beside the traces
    assert first.summaries.ranks == [0, 1, 2]
    again = scale.summarize_ranks([job])
    assert again.engine == "cached" and (again.computed, again.cached) == (0, 3)
    _same(first.summaries, again.summaries)
    assert _digests(job) == before  # the user's files untouched; only the cache dir was added
    assert sorted(p.name for p in job.iterdir()) == sorted([*before, scale.CACHE_NAME])
    # new content under the same name: that file alone is summarised again, under its new hash
    make_job(tmp_path / "other", 2)
    files[1].write_bytes((tmp_path / "other" / "rank0001.pt.trace.json.gz").read_bytes())
    os.utime(files[1], ns=(time.time_ns(), time.time_ns() + 10**9))
    third = scale.summarize_ranks([job])
    assert (third.computed, third.cached) == (1, 2)
    assert third.summaries.meta.filter(pl.col("rank") == 1).get_column("world_size").item() == 2
    # a copy of the job under other names is served by content hash, with its own file names
    copy = tmp_path / "copy"
    copy.mkdir()
    for f in sorted(job.glob("*.json.gz")):
        (copy / f"x_{f.name}").write_bytes(f.read_bytes())
    served = scale.summarize_ranks([copy], scale.ScaleOptions(cache=job / scale.CACHE_NAME))
    assert (served.computed, served.cached) == (0, 3)
    assert served.summaries.meta.get_column("file").str.starts_with("x_").all()


def test_local_cluster_matches_in_process(job: Path, reference: rs.Summaries,
                                          tmp_path: Path) -> None:
    pytest.importorskip("distributed")

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    err = Tty()
    res = scale.summarize_ranks([job], scale.ScaleOptions(cache=tmp_path / "c", in_process_max=0,
                                                          workers=2), stream=err)
    assert res.engine == "local cluster, 2 workers" and res.computed == 6
    _same(res.summaries, reference)
    assert len(res.worker_peak_rss) == 2
    assert all(0 < v < GB for v in res.worker_peak_rss.values()), res.worker_peak_rss
    shown = err.getvalue()
    assert "summarising ranks" in shown and "local cluster, 2 workers" in shown
    assert shown.endswith("\r\033[K")  # the progress line erased at the end


@pytest.fixture(scope="module")
def dask_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A real scheduler and worker, each its own process, as `dask scheduler` and `dask worker`
    are started by hand or by a batch script."""
    pytest.importorskip("distributed")
    d = tmp_path_factory.mktemp("dask")
    sched_file = d / "scheduler.json"
    procs = [subprocess.Popen(
        [sys.executable, "-m", "dask", "scheduler", "--scheduler-file", str(sched_file),
         "--host", "127.0.0.1", "--port", "0", "--no-dashboard"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    try:
        deadline = time.monotonic() + 60
        while not sched_file.exists():
            assert time.monotonic() < deadline, "dask scheduler did not start"
            time.sleep(0.2)
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "dask", "worker", "--scheduler-file", str(sched_file),
             "--nworkers", "1", "--nthreads", "1", "--memory-limit", "1.5GB", "--no-dashboard"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        from distributed import Client

        with Client(scheduler_file=str(sched_file), timeout=30, set_as_default=False) as c:
            c.wait_for_workers(1, timeout=60)
        yield sched_file
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in reversed(procs):
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()


def test_attached_scheduler_file_and_address(job: Path, reference: rs.Summaries,
                                             dask_cluster: Path, tmp_path: Path) -> None:
    res = scale.summarize_ranks([job], scale.ScaleOptions(cache=tmp_path / "a",
                                                          scheduler_file=dask_cluster))
    address = json.loads(dask_cluster.read_text())["address"]
    assert res.engine == f"scheduler {address}" and res.computed == 6
    _same(res.summaries, reference)
    assert len(res.worker_peak_rss) == 1  # the one worker we started
    by_addr = scale.summarize_ranks([job], scale.ScaleOptions(cache=tmp_path / "b",
                                                              scheduler=address))
    assert by_addr.engine == f"scheduler {address}" and by_addr.computed == 6


def test_cli_diagnose_attached(job: Path, dask_cluster: Path, tmp_path: Path,
                               capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["diagnose", str(job), "--scheduler-file", str(dask_cluster),
               "--cache", str(tmp_path / "c"), "--json"])
    out = capsys.readouterr().out
    assert rc == 0
    doc = json.loads(out)
    schema = json.loads((ROOT / "schemas" / "diagnosis.schema.json").read_text())
    jsonschema.validate(doc, schema)
    assert doc["ranks_analyzed"] == list(range(6))
    assert [i["ranks"] for i in doc["inputs"]] == [[i] for i in range(6)]
    assert any("per-step walls" in w and "cross_rank covers all 6" in w for w in doc["warnings"])
    try:
        import moetune.analyzer.cross_rank  # noqa: F401 - the reduce, shipped beside the map
    except ModuleNotFoundError:
        return
    assert "cross_rank" in doc


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "moetune", *args], capture_output=True,
                          text=True, timeout=120, env=env, cwd=ROOT)


def _one_line(p: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in p.stderr, p.stderr
    for n in needles:
        assert n in lines[0], lines[0]


def test_bad_scheduler_is_one_line(job: Path, tmp_path: Path) -> None:
    pytest.importorskip("distributed")
    c = str(tmp_path / "c")
    _one_line(_cli("diagnose", str(job), "--cache", c, "--scheduler", "tcp://127.0.0.1:9"),
              "tcp://127.0.0.1:9", "cannot reach the Dask scheduler")
    _one_line(_cli("diagnose", str(job), "--cache", c, "--scheduler-file",
                   str(tmp_path / "none.json")), "none.json", "no such scheduler file")
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    _one_line(_cli("diagnose", str(job), "--cache", c, "--scheduler-file", str(bad)),
              "bad.json", "not a Dask scheduler file")
    _one_line(_cli("diagnose", str(job), "--cache", c, "--scheduler", "nope://x"),
              "nope://x", "not a Dask scheduler address")


def test_unreadable_trace_in_directory(tmp_path: Path) -> None:
    pytest.importorskip("distributed")
    job = tmp_path / "job"
    make_job(job, 9)  # more than SCALE_ABOVE_FILES: the many-ranks path without any flag
    assert scale.SCALE_ABOVE_FILES < 9
    (job / "rank0004.pt.trace.json.gz").write_bytes(gzip.compress(b'{"traceEvents": [')[:40])
    before = _digests(job)
    _one_line(_cli("diagnose", str(job), "--cache", str(tmp_path / "c"), "--workers", "2"),
              "rank0004.pt.trace.json.gz")
    assert _digests(job) == before


def test_without_dask(tmp_path: Path) -> None:
    """Dask is optional: the plain diagnose runs without it, many ranks are summarised in the
    process one at a time (a warning says so), and asking for a cluster names the extra to
    install, in one line."""
    job = tmp_path / "job"
    make_job(job, 6)
    block = ("import sys; sys.modules['distributed'] = None; sys.modules['dask'] = None; "
             "from moetune.cli import main; sys.exit(main(sys.argv[1:]))")

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-c", block, *args], capture_output=True,
                              text=True, timeout=120, cwd=ROOT)

    plain = cli("diagnose", "--quiet", str(job / "rank0000.pt.trace.json.gz"))
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout.startswith("step ")
    # 6 files, more than IN_PROCESS_MAX, no cluster asked for: summarised here, one at a time
    many = cli("diagnose", "--json", str(job), "--cache", str(tmp_path / "c1"))
    assert many.returncode == 0, many.stderr
    doc = json.loads(many.stdout)
    assert doc["ranks"]["count"] == 6
    assert any(w.startswith("Dask not installed: 6 ranks summarised in this process")
               for w in doc["warnings"])
    for ask in (["--workers", "2"], ["--scheduler", "tcp://127.0.0.1:9"]):
        _one_line(cli("diagnose", str(job), "--cache", str(tmp_path / "c2"), *ask),
                  "pip install 'moetune[scale]'")


def test_diff_and_report_through_the_map(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    """`diff` and `report` take a directory through the map as `diagnose` does (`--cache`
    asks for it; three files are summarised in-process, no Dask needed)."""
    job = tmp_path / "job"
    make_job(job, 3)
    cache = str(tmp_path / "c")
    assert main(["diff", str(job), str(job), "--cache", cache, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["a"]["ranks"] == doc["b"]["ranks"] == [0, 1, 2]
    assert len(doc["a"]["inputs"]) == 3
    assert main(["diff", str(job), str(job), "--cache", cache]) == 0
    out = capsys.readouterr().out
    assert "A: summaries: 3 ranks from 3 files · all 3 files from the cache" in out
    pytest.importorskip("plotly")
    page = tmp_path / "r.html"
    assert main(["report", str(job), "--cache", cache, "-o", str(page)]) == 0
    err = capsys.readouterr().err
    assert "its cross-rank view covers all 3" in err
    html = page.read_text()
    # the page's "Across ranks" chart has a bar for every rank, not only the typical one's
    assert '"x":["rank 0","rank 1","rank 2"]' in html


def test_ranks_numbered_as_the_readers_number_them(tmp_path: Path) -> None:
    """A file whose metadata names no rank (Kineto without distributedInfo, an nsys export
    without NCCL's rank) takes the lowest free number when its position's rank is taken, as
    `load_trace` numbers it (which, for Kineto, merges such a mix only when asked); two files
    declaring one rank are refused."""
    from moetune.analyzer.readers import load_trace

    job = tmp_path / "job"
    files = make_job(job, 3)
    doc = json.loads(gzip.decompress(files[0].read_bytes()))
    del doc["distributedInfo"]  # rank from file order: position 0
    files[0].write_bytes(gzip.compress(json.dumps(doc).encode(), compresslevel=1))
    doc = json.loads(gzip.decompress(files[1].read_bytes()))
    doc["distributedInfo"]["rank"] = 0  # declares rank 0: position 0's rank is taken
    files[1].write_bytes(gzip.compress(json.dumps(doc).encode(), compresslevel=1))
    res = scale.summarize_ranks([job], scale.ScaleOptions(cache=tmp_path / "c"))
    want = {int(r): Path(src).name for r, src in
            load_trace([job], allow_mixed_runs=True).ranks.select("rank", "source").iter_rows()}
    got = {r: f.name for r, f in res.rank_file.items()}
    assert got == want == {0: files[1].name, 1: files[0].name, 2: files[2].name}
    meta = dict(res.summaries.meta.select("rank", "file").iter_rows())
    assert meta == want
    for name in rs.SCHEMAS:  # every table renumbered alike
        assert set(getattr(res.summaries, name).get_column("rank")) == {0, 1, 2}, name
    # the reduce's re-read of the renumbered rank gives it under its number in the run
    assert scale.load_rank_fn(res)(1).ranks.get_column("rank").to_list() == [1]
    # cached: the same numbering again
    again = scale.summarize_ranks([job], scale.ScaleOptions(cache=tmp_path / "c"))
    assert again.engine == "cached" and dict(again.summaries.meta.select("rank", "file")
                                             .iter_rows()) == want
    doc["distributedInfo"]["rank"] = 2  # now files 1 and 2 both declare rank 2
    files[1].write_bytes(gzip.compress(json.dumps(doc).encode(), compresslevel=1))
    with pytest.raises(UserError, match="holds rank 2, as does"):
        scale.summarize_ranks([job], scale.ScaleOptions(cache=tmp_path / "c"))
