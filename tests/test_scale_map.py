"""The map of `moetune.scale`: one rank's trace → its summary tables (analyzer/rank_summary.py),
checked against what `moetune diagnose` says of the same real trace, and the Parquet round trip."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import polars as pl
import pytest
from moetune.analyzer import rank_summary as rs
from moetune.analyzer.diagnose import diagnose

from moetune.errors import UserError

ROOT = Path(__file__).resolve().parents[1]
EP2 = ROOT / "fixtures" / "traces" / "gpu_ep2_alltoall_overlap"
NSYS = ROOT / "fixtures" / "nsys" / "h200_eager_2steps.sqlite.gz"
CPU = ROOT / "fixtures" / "traces" / "cpu_moe"


def make_job(out: Path, n: int, *, src: Path = EP2) -> list[Path]:
    """`n` rank files from the real 2-rank EP trace: rank i is rank i % 2's trace with its
    `distributedInfo` saying rank i of n (a replicated job, as the scale bench builds it)."""
    out.mkdir(parents=True, exist_ok=True)
    docs = [json.loads(gzip.decompress((src / f"rank{r}.pt.trace.json.gz").read_bytes()))
            for r in (0, 1)]
    files = []
    for i in range(n):
        d = docs[i % 2]
        d["distributedInfo"] = {**d["distributedInfo"], "rank": i, "world_size": n}
        f = out / f"rank{i:04d}.pt.trace.json.gz"
        f.write_bytes(gzip.compress(json.dumps(d).encode(), compresslevel=1))
        files.append(f)
    return files


@pytest.fixture(scope="module")
def rank0() -> tuple[rs.Summaries, dict]:
    f = EP2 / "rank0.pt.trace.json.gz"
    return rs.summarize(f), diagnose([f])


def test_tables_follow_the_shared_schemas(rank0: tuple[rs.Summaries, dict]) -> None:
    s, _ = rank0
    for name, schema in rs.SCHEMAS.items():
        df = getattr(s, name)
        assert df.schema == schema, name
        assert df.height > 0, name
        assert df.get_column("rank").unique().to_list() == [0], name


def test_walls_and_host_idle_are_the_diagnosis_figures(rank0: tuple[rs.Summaries, dict]) -> None:
    s, doc = rank0
    for row in doc["per_step"]:
        w = s.walls.filter(pl.col("step") == row["step"])
        total = w.get_column("s").sum()
        assert total == pytest.approx(row["wall_s"], abs=2e-6)
        for wall, frac in row["walls"].items():
            got = w.filter(pl.col("wall") == wall).get_column("s").item() / total
            assert got == pytest.approx(frac, abs=1e-4), wall
    step = s.steps.row(0, named=True)
    assert (step["end_ns"] - step["start_ns"]) * 1e-9 == pytest.approx(doc["step_time_s"],
                                                                       abs=2e-6)
    idle = dict(s.host_idle.select("cause", "s").iter_rows())
    assert len(doc["per_step"]) == 1  # one step: its sums are the median step's figures
    assert idle["launch_starved"] == pytest.approx(doc["host"]["launch_starved_s"], abs=2e-6)
    assert idle["sync_blocked"] == pytest.approx(doc["host"]["sync_blocked_s"], abs=2e-6)
    assert idle["other"] == pytest.approx(doc["host"]["other_s"], abs=2e-6)


def test_kernels_memory_collectives_meta(rank0: tuple[rs.Summaries, dict]) -> None:
    s, doc = rank0
    classes = doc["evidence"]["classes"]
    assert set(s.kernels.get_column("cls")) == set(classes)
    for cls, n, t in s.kernels.select("cls", "n", "s").iter_rows():
        assert n == classes[cls]["count"]
        assert t == pytest.approx(classes[cls]["time_s"], abs=2e-6)
    m = s.memory.row(0, named=True)
    assert m["source"] == doc["memory"]["source"] == "allocator_events"
    assert m["peak_reserved"] / 2**30 == pytest.approx(doc["memory"]["peak_reserved_gib"],
                                                       abs=1e-4)
    c = s.collectives
    a2a = c.filter(pl.col("collective") == "all_to_allv")
    assert a2a.height > 0
    assert a2a.get_column("pg_desc").unique().to_list() == ["EXPERT_MODEL_PARALLEL_GROUP"]
    # bytes = elements × dtype size: the all-to-all moves bf16 tokens (2 bytes each)
    assert a2a.get_column("bytes").min() > 0
    assert (a2a.get_column("bytes") % 2 == 0).all()
    # k numbers each group's instances 0, 1, 2, … on the rank
    ks = c.group_by("group").agg(ok=(pl.col("k").sort() == pl.int_range(pl.len())).all())
    assert ks.get_column("ok").all()
    meta = s.meta.row(0, named=True)
    assert meta["file"] == "rank0.pt.trace.json.gz"
    assert meta["sha256"] == doc["inputs"][0]["sha256"]
    assert meta["world_size"] == 2 and meta["format"] == "kineto"


def test_parquet_round_trip(tmp_path: Path, rank0: tuple[rs.Summaries, dict]) -> None:
    s, _ = rank0
    rs.write(s, tmp_path / "a")
    back = rs.read(tmp_path / "a")
    for name in rs.SCHEMAS:
        assert getattr(back, name).equals(getattr(s, name)), name
    rs.write(rs.Summaries.empty(), tmp_path / "e")
    both = rs.read([tmp_path / "a", tmp_path / "e"])
    assert both.meta.height == 1 and both.collectives.height == s.collectives.height
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "e"]  # no temporary left


def test_nsys_export_and_default_rank() -> None:
    s = rs.summarize(NSYS, default_rank=7)
    assert s.meta.get_column("format").to_list() == ["nsys"] * s.meta.height
    assert set(s.steps.get_column("rank")) <= set(s.meta.get_column("rank"))
    assert s.steps.height > 0 and s.walls.height == 4 * s.steps.height
    assert s.memory.height == s.meta.height


def test_replicated_ranks_keep_their_rank(tmp_path: Path) -> None:
    files = make_job(tmp_path, 3)
    s = rs.Summaries.concat([rs.summarize(f, default_rank=i) for i, f in enumerate(files)])
    assert s.ranks == [0, 1, 2]
    assert s.meta.get_column("world_size").unique().to_list() == [3]
    # rank 2 is rank 0's trace again: the same figures under another rank
    w = s.walls.filter(pl.col("rank").is_in([0, 2])).pivot("rank", index=["step", "wall"],
                                                          values="s")
    assert (w.get_column("0") == w.get_column("2")).all()


def test_bad_input_is_one_user_error(tmp_path: Path) -> None:
    cpu = next(p for p in sorted(CPU.iterdir()) if p.name.endswith((".json", ".json.gz")))
    with pytest.raises(UserError, match="no GPU events"):
        rs.summarize(cpu)
    bad = tmp_path / "rank9.pt.trace.json.gz"
    bad.write_bytes(b"\x1f\x8b\x08\x00garbage")
    with pytest.raises(UserError, match=r"rank9\.pt\.trace\.json\.gz"):
        rs.summarize(bad)
