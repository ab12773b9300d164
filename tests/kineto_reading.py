"""Reading the public corpus's Kineto traces once per session, and the frame views the Kineto
reader's tests share (tests/test_reader_kineto*.py)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import polars as pl
import pytest
from moetune.analyzer.frames import Trace
from moetune.analyzer.readers import load_trace
from moetune.analyzer.readers.kineto import read_kineto

from moetune.errors import UserError

ROOT = Path(__file__).resolve().parents[1]
CORPUS_FILES = [
    "hta_a100_2rank_nccl",
    "hta_a100_alltoall_rank3of8",
    "hta_sampled_rank0",
    "hta_v100_ddp_allreduce_rank1",
    "hta_alexnet",
    "hta_simple_add",
    "hta_cuda_event_sync",
    "hta_cpu_only",
    "hta_mi250_minitoy",
    "tracelens_h100_qwen05b_inference",
]
_CACHE: dict[str, Trace] = {}


def kineto(corpus: Path, stem: str, default_rank: int = 0) -> Trace:
    key = f"{stem}:{default_rank}"
    if key not in _CACHE:
        _CACHE[key] = read_kineto(
            corpus / "public" / "kineto" / f"{stem}.json.gz", default_rank=default_rank
        )
    return _CACHE[key]


def kind(t: Trace, k: str) -> pl.DataFrame:
    return t.events.filter(pl.col("kind") == k)


def steps(t: Trace) -> list[int]:
    names = kind(t, "annotation").get_column("name")
    return sorted(int(n.split("#")[1]) for n in names if n.startswith("ProfilerStep#"))


def all_strings(t: Trace) -> pl.Series:
    """Every distinct string cell of every frame."""
    parts = [
        df.get_column(c).cast(pl.String).drop_nulls().unique()
        for df in (t.events, t.comms, t.flows, t.ranks)
        for c, dt in df.schema.items()
        if dt in (pl.String,) or isinstance(dt, pl.Enum)
    ]
    return pl.concat(parts).unique()


# written inputs: a file in tmp_path, a minimal event, a bad file's one-line error


def write(tmp_path: Path, name: str, content: bytes | str | dict, *, gz: bool = False) -> Path:
    if isinstance(content, dict):
        content = json.dumps(content)
    data = content.encode() if isinstance(content, str) else content
    p = tmp_path / name
    p.write_bytes(gzip.compress(data) if gz else data)
    return p


def ev(**kw: object) -> dict:
    base = {
        "ph": "X",
        "cat": "cpu_op",
        "name": "aten::mm",
        "pid": 10,
        "tid": 11,
        "ts": 100,
        "dur": 5,
    }
    base.update(kw)
    return base


def one_line_error(path: Path, needle: str) -> None:
    with pytest.raises(UserError) as info:
        load_trace([path])
    msg = str(info.value)
    assert "\n" not in msg
    assert str(path) in msg
    assert needle in msg
