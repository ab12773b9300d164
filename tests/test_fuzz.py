"""Property-based fuzzing of the CLI over structurally mutated real inputs (docs/robustness.md).

Inputs: Kineto JSON traces, nsys SQLite exports, measurement contracts, Megatron logs and tune
ledgers, each a real file from fixtures/ (and the public corpus when present) mutated by
tests/fuzz_mutate.py. Commands: `diagnose --json`, `audit`, `recommend`, `contract check`,
`contract from-log`, `ledger`, run through `moetune.cli.main` in a worker process under a time
limit (tests/fuzz_runner.py). The property, per case:

- no exception escapes, no hang, no crash; exit code 0 or 2, or 1 or 3 where the command
  documents it (`audit`: 1 a contradicted claim, 3 no claim could be checked; `contract check`:
  1 an invalid contract);
- exit 2 prints one line (warnings aside), `moetune: …`, naming the file;
- exit 0 with `--json` prints strict JSON (no NaN/Infinity) that validates against its schema;
- the input file is byte-identical afterwards and no file appears beside it; a failed
  `contract from-log -o` writes nothing.

CI runs a few hundred cases (`test_fuzz`, derandomized: the same cases each run). The slow run,
`MOETUNE_FUZZ_SLOW=1 python -m pytest -q -m slow tests/test_fuzz.py`, runs ≥ 10,000 fresh ones;
`MOETUNE_FUZZ_REPORT=FILE` writes its counts as JSON, `MOETUNE_FUZZ_COLLECT=FILE` records
failures there (one JSON line each, the input kept beside it) instead of stopping at the first,
and `MOETUNE_FUZZ_SCALE=0.1` runs a tenth of the slow run.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import sqlite3
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from fuzz_mutate import (
    alias_bomb,
    byte_ops,
    dump_json,
    dump_yaml,
    line_op,
    maybe_gzip,
    mutate_bytes,
    mutate_lines,
    mutate_sqlite,
    mutate_tree,
    sql_op,
    tree_op,
)
from fuzz_runner import Outcome, Runner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from moetune.rules.load import schema

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "fixtures"
CORPUS = Path(os.environ.get("MOETUNE_CORPUS", ROOT.parent / "shared" / "corpus")) / "public"
CONTRACT = FIXTURES / "contracts" / "mcore_h200_hostbound.yaml"
SMALL_TRACE = FIXTURES / "traces" / "gpu_gemm_bf16" / "trace.json.gz"
CASE_TIMEOUT_S = float(os.environ.get("MOETUNE_FUZZ_TIMEOUT", "30"))
SLOW = os.environ.get("MOETUNE_FUZZ_SLOW") == "1"
SCALE = float(os.environ.get("MOETUNE_FUZZ_SCALE", "1"))  # the slow run's size, for exploring

# Cases per input kind: CI (a few hundred in all, ~2 min on 2 cores) and the slow run (≥ 10,000).
CI_CASES = {"kineto": 90, "nsys": 60, "contract": 60, "log": 50, "ledger": 50}
SLOW_CASES = {"kineto": 3000, "nsys": 2200, "contract": 2000, "log": 1500, "ledger": 1500}

JSON_SCHEMAS = {"diagnose": "diagnosis", "audit": "audit", "recommend": "recommendation",
                "ledger": "ledger"}
GATE_EXIT_1 = {("audit",), ("contract", "check")}  # commands whose exit 1 is documented
GATE_EXIT_3 = {("audit",)}  # commands whose exit 3 (the gate could not decide) is documented


# --- seeds: real inputs -------------------------------------------------------------------------


def _corpus(*names: str) -> list[Path]:
    return [CORPUS / n for n in names if (CORPUS / n).is_file()]


@cache
def kineto_seeds() -> tuple[tuple[str, Any], ...]:
    paths = [FIXTURES / "traces" / "cpu_moe" / "trace.json.gz", SMALL_TRACE,
             FIXTURES / "traces" / "gpu_experts_sequential" / "trace.json.gz",
             *_corpus("kineto/hta_simple_add.json.gz")]
    seeds = [(p.name, json.loads(gzip.decompress(p.read_bytes()))) for p in paths]
    return (*seeds, ("mcore_hostbound_cut", _cut_gpu_trace(
        FIXTURES / "traces" / "gpu_mcore_hostbound" / "trace.json.gz", 500)))


def _cut_gpu_trace(path: Path, n: int) -> dict[str, Any]:
    """The first `n` timed events of a real Megatron-Core GPU trace from its first profiler step,
    with every metadata event and the step annotation itself (its span reaches past the cut)."""
    doc = json.loads(gzip.decompress(path.read_bytes()))
    events = doc["traceEvents"]
    meta = [e for e in events if e.get("ph") == "M"]
    timed = sorted((e for e in events if e.get("ph") != "M" and "ts" in e), key=lambda e: e["ts"])
    step = next(e for e in timed if str(e.get("name", "")).startswith("ProfilerStep#"))
    after = [e for e in timed if e["ts"] >= step["ts"] and e is not step][:n]
    return {**doc, "traceEvents": [*meta, step, *after]}


@cache
def nsys_seeds(cache_dir: str) -> tuple[Path, ...]:
    out = []
    for name in ("h200_graphs_replay_graph.sqlite.gz",):
        target = Path(cache_dir) / name.removesuffix(".gz")
        target.write_bytes(gzip.decompress((FIXTURES / "nsys" / name).read_bytes()))
        out.append(target)
    return (*out, *_corpus("nsys/nsysai_synthetic_healthy.sqlite", "nsys/nsysai_mock.sqlite"))


@cache
def nsys_tables() -> frozenset[str]:
    """Tables the nsys reader names: mutations prefer them (most of an export is never read)."""
    text = "".join(p.read_text() for p in (ROOT / "analyzer" / "readers").glob("nsys*.py"))
    return frozenset(text.split())


@cache
def _nsys_hot(table: str) -> bool:
    return any(table in word for word in nsys_tables())


CONTRACT_SEEDS = tuple(sorted((FIXTURES / "contracts").glob("*.yaml")))
LOG_SEEDS = (*sorted((FIXTURES / "logs").glob("*.log")),
             FIXTURES / "traces" / "gpu_ep2_allgather" / "train.log")
LEDGER_SEEDS = tuple(sorted((FIXTURES / "ledgers").glob("*.sqlite")))


# --- the property -------------------------------------------------------------------------------


@dataclass
class Tally:
    cases: Counter = field(default_factory=Counter)
    exits: Counter = field(default_factory=Counter)
    failures: list[dict[str, Any]] = field(default_factory=list)


TALLY = Tally()


def _strict_json(text: str) -> Any:
    def refuse(name: str) -> Any:
        raise ValueError(f"non-standard JSON constant {name}")

    return json.loads(text, parse_constant=refuse)


@cache
def _validator(name: str) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(schema(name))


def problems(argv: list[str], out: Outcome, inputs: list[Path]) -> list[str]:
    """Everything wrong with one CLI outcome (empty: the property holds)."""
    if out.crash:
        return [out.crash]
    found = []
    allowed = {0, 2}
    for code, gates in ((1, GATE_EXIT_1), (3, GATE_EXIT_3)):
        if tuple(argv[:1]) in gates or tuple(argv[:2]) in gates:
            allowed.add(code)
    if out.rc not in allowed:
        found.append(f"exit code {out.rc} (allowed {sorted(allowed)})")
    if "Traceback" in out.stderr:
        found.append("a traceback on stderr")
    if out.rc == 2:
        lines = [ln for ln in out.stderr.splitlines() if ln.strip() and not ln.startswith("warning:")]
        if len(lines) != 1 or not lines[0].startswith("moetune: "):
            found.append(f"exit 2 must print one `moetune: …` line, printed {lines[:4]!r}")
        elif not any(p.name in lines[0] for p in inputs):
            found.append(f"exit 2 message names no input file: {lines[0][:300]!r}")
    if out.rc == 0 and "--json" in argv:
        try:
            doc = _strict_json(out.stdout)
        except ValueError as exc:
            found.append(f"--json output is not strict JSON: {exc}")
        else:
            name = JSON_SCHEMAS.get(argv[0])
            if name and "--by-rule" not in argv:
                err = jsonschema.exceptions.best_match(_validator(name).iter_errors(doc))
                if err is not None:
                    where = ".".join(map(str, err.absolute_path)) or "(top)"
                    found.append(f"--json output breaks schemas/{name}: {where}: {err.message[:200]}")
    return found


@dataclass(frozen=True)
class Case:
    """One mutated input in its own folder and the commands to run on it."""

    kind: str
    path: Path
    commands: list[list[str]]
    must_not_exist: tuple[Path, ...] = ()


def run_case(runner: Runner, case: Case) -> None:
    folder = case.path.parent
    before = case.path.read_bytes()
    listing = sorted(os.listdir(folder))
    for argv in case.commands:
        out = runner.run(argv, CASE_TIMEOUT_S)
        given = [Path(a) for a in argv[1:] if not a.startswith("-") and Path(a).is_file()]
        found = problems(argv, out, [case.path, *given])
        if case.path.read_bytes() != before:
            found.append("the input file changed")
        if sorted(os.listdir(folder)) != listing:
            found.append(f"files appeared beside the input: "
                         f"{sorted(set(os.listdir(folder)) - set(listing))}")
        if out.rc not in (0, None):
            found += [f"{p.name} written on failure" for p in case.must_not_exist if p.exists()]
        TALLY.cases[case.kind] += 1
        TALLY.exits[f"{case.kind}:{argv[0]}:{out.rc if not out.crash else 'crash'}"] += 1
        if found:
            record = {"kind": case.kind, "argv": [str(a) for a in argv], "problems": found,
                      "stderr": out.stderr[-2000:]}
            collect = os.environ.get("MOETUNE_FUZZ_COLLECT")
            if collect:
                TALLY.failures.append(record)
                keep = Path(collect + ".inputs")
                keep.mkdir(exist_ok=True)
                record["input"] = str(keep / f"{len(TALLY.failures)}-{case.path.name}")
                shutil.copyfile(case.path, record["input"])
                with open(collect, "a") as fh:
                    fh.write(json.dumps(record) + "\n")
                return
            pytest.fail(f"{case.kind}: moetune {' '.join(map(str, argv))}\n" + "\n".join(found)
                        + f"\nstderr: {out.stderr[-1500:]}")


# --- builders: hypothesis draws → a Case on disk -------------------------------------------------

BuildFn = Callable[[Any, Path, dict[str, Path]], Case]


FILE_DAMAGE = st.lists(st.tuples(st.sampled_from(("truncate", "flip")), st.floats(0, 1),
                                 st.binary(min_size=1, max_size=4)), min_size=1, max_size=1)


def _sometimes(draw: Any, ops: st.SearchStrategy[list]) -> list:
    """Byte-level damage in one case of four: most cases should get past the parser."""
    return draw(ops) if draw(st.integers(0, 3)) == 0 else []


def _pick(draw: Any, options: list[list[str]]) -> list[list[str]]:
    return [draw(st.sampled_from(options))]


def build_kineto(draw: Any, folder: Path, shared: dict[str, Path]) -> Case:
    seeds = kineto_seeds()
    name, tree = seeds[draw(st.integers(0, len(seeds) - 1))]
    tree = mutate_tree(tree, draw(st.lists(tree_op, max_size=4)))
    data = dump_json(tree, ascii_only=draw(st.booleans()))
    gz = draw(st.booleans())
    raw, packed = _sometimes(draw, byte_ops), draw(st.lists(st.tuples(st.just("truncate"), st.floats(0, 1),
                                                          st.just(b"\x00")), max_size=1))
    data = mutate_bytes(maybe_gzip(mutate_bytes(data, raw), gz), packed if gz else [])
    path = folder / (name.split(".")[0] + (".pt.trace.json.gz" if gz else ".pt.trace.json"))
    path.write_bytes(data)
    f = str(path)
    return Case("kineto", path, _pick(draw, [
        ["diagnose", "--json", f],
        ["audit", "--json", "--contract", str(CONTRACT), f],
        ["recommend", "--json", "--contract", str(CONTRACT), f],
    ]))


def build_nsys(draw: Any, folder: Path, shared: dict[str, Path]) -> Case:
    seeds = nsys_seeds(str(shared["cache"]))
    seed = seeds[draw(st.integers(0, len(seeds) - 1))]
    path = folder / seed.name
    shutil.copyfile(seed, path)
    mutate_sqlite(path, draw(st.lists(sql_op, min_size=1, max_size=4)), _nsys_hot)
    data = mutate_bytes(path.read_bytes(), _sometimes(draw, FILE_DAMAGE))
    if draw(st.booleans()):
        path.unlink()
        path = path.with_name(path.name + ".gz")
        data = gzip.compress(data, mtime=0)
    path.write_bytes(data)
    f = str(path)
    return Case("nsys", path, _pick(draw, [
        ["diagnose", "--json", f],
        ["audit", "--json", "--contract", str(CONTRACT), f],
        ["recommend", "--json", "--contract", str(CONTRACT), f],
    ]))


def build_contract(draw: Any, folder: Path, shared: dict[str, Path]) -> Case:
    seed = draw(st.sampled_from(CONTRACT_SEEDS))
    tree = mutate_tree(yaml.safe_load(seed.read_text()), draw(st.lists(tree_op, max_size=4)))
    fmt = draw(st.sampled_from(("yaml", "yaml", "json")))
    if fmt == "json":
        data = dump_json(tree, ascii_only=draw(st.booleans()))
    else:
        data = dump_yaml(tree)
        text = mutate_lines(data.decode("utf-8", "surrogatepass"),
                            draw(st.lists(line_op, max_size=2)))
        data = text.encode("utf-8", "surrogatepass")
    data = mutate_bytes(data, _sometimes(draw, byte_ops))
    path = folder / f"{seed.stem}.{fmt}"
    path.write_bytes(data)
    f = str(path)
    return Case("contract", path, _pick(draw, [
        ["contract", "check", f],
        ["contract", "check", "--strict", "--json", f],
        ["audit", "--json", "--contract", f, str(SMALL_TRACE)],
        ["recommend", "--json", "--contract", f, str(shared["diagnosis"])],
    ]))


def build_log(draw: Any, folder: Path, shared: dict[str, Path]) -> Case:
    seed = draw(st.sampled_from(LOG_SEEDS))
    text = mutate_lines(seed.read_text(), draw(st.lists(line_op, max_size=6)))
    data = mutate_bytes(text.encode("utf-8", "surrogatepass"), _sometimes(draw, byte_ops))
    path = folder / seed.name
    path.write_bytes(data)
    (folder / "out").mkdir()  # -o goes one folder down: the input's folder must stay as it was
    target = folder / "out" / "contract.yaml"
    f = str(path)
    return Case("log", path, _pick(draw, [
        ["contract", "from-log", f],
        ["contract", "from-log", f, "-o", str(target)],
        ["recommend", "--json", str(shared["diagnosis"]), "--log", f],
    ]), must_not_exist=(target,))


def build_ledger(draw: Any, folder: Path, shared: dict[str, Path]) -> Case:
    seed = draw(st.sampled_from(LEDGER_SEEDS))
    path = folder / seed.name
    shutil.copyfile(seed, path)
    mutate_sqlite(path, draw(st.lists(sql_op, min_size=1, max_size=4)), lambda t: True)
    data = mutate_bytes(path.read_bytes(), _sometimes(draw, FILE_DAMAGE))
    path.write_bytes(data)
    f = str(path)
    return Case("ledger", path, _pick(draw, [
        ["ledger", "--json", "--ledger", f],
        ["ledger", "--ledger", f],
        ["ledger", "--by-rule", "--ledger", f],
        ["ledger", "--by-rule", "--json", "--ledger", f],
        ["ledger", "--json", "--session", "tune-d1d8ad4b93bc", "--ledger", f],
    ]))


BUILDERS: dict[str, BuildFn] = {"kineto": build_kineto, "nsys": build_nsys,
                                "contract": build_contract, "log": build_log,
                                "ledger": build_ledger}


# --- fixtures and tests -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def runner() -> Iterator[Runner]:
    r = Runner()
    yield r
    r.close()
    report = os.environ.get("MOETUNE_FUZZ_REPORT")
    if report:
        Path(report).write_text(json.dumps(
            {"cases": dict(TALLY.cases), "total": sum(TALLY.cases.values()),
             "exits": dict(sorted(TALLY.exits.items())), "failures": len(TALLY.failures)},
            indent=1) + "\n")


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory, runner: Runner) -> dict[str, Path]:
    """A saved diagnosis of a small real GPU trace (recommend's fast input), a seed cache, and
    the folder under which every case gets its own."""
    base = tmp_path_factory.mktemp("fuzz")
    (base / "cache").mkdir()
    diag = base / "cache" / "diagnosis.json"
    out = runner.run(["diagnose", "--json", str(SMALL_TRACE)], 120)
    assert out.rc == 0, out.stderr or out.crash
    diag.write_text(out.stdout)
    return {"base": base, "cache": base / "cache", "diagnosis": diag}


def _fuzz(kind: str, runner: Runner, shared: dict[str, Path], data: st.DataObject) -> None:
    folder = Path(tempfile.mkdtemp(dir=shared["base"]))
    try:
        case = BUILDERS[kind](data.draw, folder, shared)
        run_case(runner, case)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


_COMMON = {"deadline": None, "database": None, "suppress_health_check": list(HealthCheck),
           "print_blob": False}


@pytest.mark.parametrize("kind", list(CI_CASES))
def test_fuzz(kind: str, runner: Runner, shared: dict[str, Path]) -> None:
    @settings(max_examples=CI_CASES[kind], derandomize=True, **_COMMON)
    @given(data=st.data())
    def check(data: st.DataObject) -> None:
        _fuzz(kind, runner, shared, data)

    check()


@pytest.mark.slow
@pytest.mark.skipif(not SLOW, reason="the ≥ 10,000-case run: MOETUNE_FUZZ_SLOW=1 (docs/robustness.md)")
@pytest.mark.parametrize("kind", list(SLOW_CASES))
def test_fuzz_slow(kind: str, runner: Runner, shared: dict[str, Path]) -> None:
    @settings(max_examples=max(1, round(SLOW_CASES[kind] * SCALE)), **_COMMON)
    @given(data=st.data())
    def check(data: st.DataObject) -> None:
        _fuzz(kind, runner, shared, data)

    check()


def test_runner_reports_hangs_and_escapes() -> None:
    """The harness can fail: a command that outlives its limit is a hang, not a pass."""
    r = Runner()
    try:
        assert problems(["ledger"], Outcome(3, "", "", None), []) == [
            "exit code 3 (allowed [0, 2])"]
        assert problems(["diagnose", "--json", "x"], Outcome(2, "", "boom\nmoetune: x: bad", None),
                        [Path("x")])[0].startswith("exit 2 must print one")
        assert problems(["diagnose", "--json", "x"], Outcome(0, '{"a": NaN}', "", None), [])[0] \
            .startswith("--json output is not strict JSON")
        out = r.run(["diagnose", "--json", str(SMALL_TRACE)], 0.001)
        assert out.crash is not None and out.crash.startswith("hang")
        out = r.run(["contract", "check", str(CONTRACT)], 60)
        assert out.crash is None and out.rc == 0
    finally:
        r.close()


# --- what the fuzzer found: each a minimal real-shaped input, kept as a regression test -----------


def _trace_with(splice: bytes) -> bytes:
    """The small real GPU trace with `splice` as the `args` of its first event."""
    doc = json.loads(gzip.decompress(SMALL_TRACE.read_bytes()))
    doc["traceEvents"][0]["args"] = "@@SPLICE@@"
    return json.dumps(doc).encode().replace(b'"@@SPLICE@@"', splice)


def _trace_without_kernel_names() -> bytes:
    doc = json.loads(gzip.decompress(SMALL_TRACE.read_bytes()))
    for e in doc["traceEvents"]:
        if e.get("cat") == "kernel":
            e.pop("name", None)
    return json.dumps(doc).encode()


def _contract_with(line: str, suffix: str = ".yaml") -> bytes:
    text = (FIXTURES / "contracts" / "qwen3_30b_h100.yaml").read_text()
    if suffix == ".json":
        doc = yaml.safe_load(text)
        return json.dumps(doc).replace('"megatron_args": {', '"megatron_args": {' + line + ", ",
                                       1).encode()
    return (text.replace("megatron_args:\n", f"megatron_args:\n  {line}\n", 1)).encode()


def _ledger_with(*sql: str) -> Callable[[Path], None]:
    def make(path: Path) -> None:
        shutil.copyfile(LEDGER_SEEDS[0], path)
        mutate = sqlite3.connect(path, isolation_level=None)
        try:
            mutate.execute("PRAGMA journal_mode=DELETE")
            for stmt in sql:
                mutate.execute(stmt)
        finally:
            mutate.close()
    return make


def _log_with_long_line() -> bytes:
    """A real log whose first iteration line ends in a million dots (a terminal's runaway line)."""
    lines = (FIXTURES / "logs" / "h200_mcore_no_te_profile.log").read_text().split("\n")
    i = next(i for i, line in enumerate(lines) if "elapsed time per iteration" in line)
    lines[i] += "." * (1 << 20)
    return "\n".join(lines).encode()


def _command_line_with_long_word() -> bytes:
    """A `set -x` echo of the launch (as fixtures/logs/real_lumi_mi300_gpt_tp4.log has it) whose
    last word runs on for a million characters."""
    return ("+ python -u Megatron-LM/pretrain_gpt.py --num-layers 28 --hidden-size 3072 "
            "--num-attention-heads 24 --data-path " + "." * (1 << 20) + "\n").encode()


def _log_with(pattern: str, repl: str) -> bytes:
    """A real torchrun log with its iteration / memory lines garbled by one substitution."""
    text = (FIXTURES / "logs" / "qwen3_30b_a3b_torchrun.log").read_text()
    garbled, n = re.subn(pattern, repl, text)
    assert n, f"{pattern} no longer in the fixture"
    return garbled.encode()


def _nsys_with(*sql: str) -> Callable[[Path], None]:
    def make(path: Path) -> None:
        path.write_bytes(gzip.decompress(
            (FIXTURES / "nsys" / "h200_graphs_replay_graph.sqlite.gz").read_bytes()))
        mutate = sqlite3.connect(path, isolation_level=None)
        try:
            for stmt in sql:
                mutate.execute(stmt)
        finally:
            mutate.close()
    return make


DEEP = 100_000
FOUND: list[tuple[str, str, Any, list[str], str]] = [
    # (id, file name, bytes or a maker, argv before the file, message); exit 2 unless the message
    # is on stdout (`out:`) or a warning (`warn:`, exit 0, or a gate's 1 or 3)
    ("kineto-deep-json", "t.pt.trace.json", _trace_with(b"[" * DEEP + b"]" * DEEP),
     ["diagnose", "--json"], "nested too deeply"),
    ("kineto-deep-json-after-nan", "t.pt.trace.json",
     _trace_with(b'{"x": NaN, "y": ' + b"[" * DEEP + b"]" * DEEP + b"}"),
     ["diagnose", "--json"], "nested too deeply"),
    ("recommend-deep-json", "t.pt.trace.json", _trace_with(b"[" * DEEP + b"]" * DEEP),
     ["recommend", "--json"], "nested too deeply"),
    ("kineto-kernels-without-names", "t.pt.trace.json", _trace_without_kernel_names(),
     ["diagnose", "--json"], 'out:"name": null'),
    ("nsys-kernel-start-int64-min", "n.sqlite",
     _nsys_with("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET start = -9223372036854775808"),
     ["audit", "--json", "--contract", str(CONTRACT)], "warn:180 event(s) with an impossible time"),
    ("contract-deep-yaml", "c.yaml", _contract_with("x: " + "[" * 5000 + "]" * 5000),
     ["contract", "check"], "nested more than 32 levels deep"),
    ("contract-deep-json", "c.json", _contract_with('"x": ' + "[" * 900 + "]" * 900, ".json"),
     ["contract", "check"], "nested more than 32 levels deep"),
    ("contract-alias-bomb", "c.yaml",
     b"megatron_args: {" + alias_bomb(9).encode() + b"}\n"
     + _contract_with("moe_aux_loss_coeff: *b8"),
     ["audit", "--json", "--contract"], "more than 100,000 values"),
    ("ledger-dropped-column", "l.sqlite", _ledger_with("ALTER TABLE runs DROP COLUMN status"),
     ["ledger", "--json", "--ledger"], "table runs lacks column(s) status"),
    ("ledger-renamed-column", "l.sqlite",
     _ledger_with("ALTER TABLE sessions RENAME COLUMN created_at TO created"),
     ["ledger", "--ledger"], "table sessions lacks column(s) created_at"),
    ("ledger-json-does-not-parse", "l.sqlite",
     _ledger_with("UPDATE runs SET metrics = '{\"step_ms\": ' WHERE id = 2"),
     ["ledger", "--by-rule", "--ledger"], "a record's JSON does not parse"),
    ("ledger-type-swap", "l.sqlite", _ledger_with("UPDATE runs SET diff = '3.5' WHERE id = 3"),
     ["ledger", "--json", "--ledger"], "runs id 3: diff: 3.5 is not of type 'object'"),
    ("ledger-bad-enum", "l.sqlite", _ledger_with("UPDATE sessions SET state = char(0)"),
     ["ledger", "--ledger"], "sessions id tune-d1d8ad4b93bc: state:"),
    ("ledger-infinity", "l.sqlite",
     _ledger_with("UPDATE decisions SET measured_gain = 9e999 WHERE id = 1"),
     ["ledger", "--by-rule", "--json", "--ledger"], "measured_gain: not a finite number"),
    ("log-million-dots", "train.log", _log_with_long_line(), ["contract", "from-log"],
     "out:megatron_args:"),
    ("log-infinite-count", "train.log", _log_with(r"consumed samples: +\d+", "consumed samples: inf"),
     ["contract", "from-log"], "out:num_layers:"),
    ("recommend-log-infinite-count", "train.log",
     _log_with(r"consumed samples: +\d+", "consumed samples: inf"),
     ["recommend", "--json", "--log"], "out:moetune.recommendation"),
    ("log-count-past-int64", "train.log",
     _log_with(r"global batch size: +\d+", "global batch size: 99999999999999999999999"),
     ["contract", "from-log"], "out:num_layers:"),
    ("log-iteration-past-int64", "train.log",
     _log_with(r"iteration +1/", "iteration 99999999999999999999999/"),
     ["recommend", "--json", "--log"], "out:moetune.recommendation"),
    ("log-memory-iteration-past-int64", "train.log",
     _log_with(r"\(after 1 iterations\)", "(after 99999999999999999999999 iterations)"),
     ["contract", "from-log"], "out:num_layers:"),
    ("log-command-line-million-chars", "train.log", _command_line_with_long_word(),
     ["contract", "from-log"], "out:num_layers: 28"),
]


@pytest.mark.parametrize(("name", "argv", "content", "message"),
                         [pytest.param(f, a, c, m, id=i) for i, f, c, a, m in FOUND])
def test_found(name: str, argv: list[str], content: Any, message: str, runner: Runner,
               tmp_path: Path) -> None:
    """Inputs the fuzzer turned up (a traceback or a hang before the fix): now one line and
    exit 2, or (the quadratic log parse) an answer well within the time limit."""
    path = tmp_path / name
    if callable(content):
        content(path)
    else:
        path.write_bytes(content)
    before, listing = path.read_bytes(), sorted(os.listdir(tmp_path))
    full = [*argv, str(path)] + ([str(SMALL_TRACE)] if argv[-1] in ("--contract", "--log") else [])
    out = runner.run(full, CASE_TIMEOUT_S)
    assert problems(full, out, [path]) == []
    if message.startswith("out:"):
        assert out.rc == 0 and message[4:] in out.stdout, out.stderr
    elif message.startswith("warn:"):
        assert out.rc in (0, 1, 3) and message[5:] in out.stderr + out.stdout, out.stderr  # --json: in it
    else:
        assert out.rc == 2 and message in out.stderr, out.stderr
    assert path.read_bytes() == before and sorted(os.listdir(tmp_path)) == listing
