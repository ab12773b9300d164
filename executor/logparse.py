"""Megatron-LM / Megatron-Bridge training output → polars frames.

The formats are Megatron-LM's `training_log()` (`megatron/training/training.py`), `report_memory()`
(`megatron/training/utils`), `_print_args()` (`megatron/training/arguments.py`) and Megatron-Bridge's
`src/megatron/bridge/training/utils/train_utils.py`.

Reads what real runs print: iteration lines (any subset and order of fields, Megatron and Bridge
timestamps), memory lines (new `.2f`, old unformatted float, Bridge GB form), validation lines,
Megatron's theoretical memory estimate and the arguments dump (parsed by `moetune.analyzer.megatron_args`). Tolerates launcher prefixes
(`[default7]: `, `[host:3]: `, `3: `), interleaved ranks, lines cut short and terminal hard
wraps: a record that does not end with its last field is continued on the next unprefixed line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from moetune.errors import UserError

ITERATIONS_SCHEMA = pl.Schema({
    "rank": pl.Int32,              # from the launcher prefix; null when there is none
    "iteration": pl.Int64,
    "train_iters": pl.Int64,
    "timestamp": pl.String,
    "consumed_samples": pl.Int64,
    "elapsed_ms": pl.Float64,      # mean per iteration over the logging interval
    "tflops_per_gpu": pl.Float64,
    "learning_rate": pl.Float64,
    "global_batch_size": pl.Int64,
    "lm_loss": pl.Float64,
    "load_balancing_loss": pl.Float64,
    "loss_scale": pl.Float64,
    "grad_norm": pl.Float64,
    "skipped_iterations": pl.Int64,
    "nan_iterations": pl.Int64,
    "complete": pl.Boolean,        # the line reached `number of nan iterations`
    "other": pl.String,            # remaining `key: value` fields, `k=v;…`
})

MEMORY_SCHEMA = pl.Schema({
    "rank": pl.Int32,              # the `[Rank N]` number
    "iteration": pl.Int64,
    "unit": pl.String,             # as printed: MB (Megatron-LM) or GB (Megatron-Bridge)
    "allocated_mb": pl.Float64,
    "max_allocated_mb": pl.Float64,
    "reserved_mb": pl.Float64,
    "max_reserved_mb": pl.Float64,
})

# Megatron-LM's `report_theoretical_memory` (megatron/training/theoretical_memory_usage.py): the
# model's own estimate, per rank, before the first step; activation and total only where the formula
# applies (sequence parallel with selective recompute, or newer releases' "without SP" variant).
THEORETICAL_MEMORY_SCHEMA = pl.Schema({
    "rank": pl.Int32,              # from the launcher prefix; null when there is none
    "weight_and_optimizer_mb": pl.Float64,
    "activation_mb": pl.Float64,   # null: not printed
    "total_mb": pl.Float64,        # null: not printed
})

VALIDATION_SCHEMA = pl.Schema({
    "where": pl.String,            # e.g. `iteration 100`
    "split": pl.String,            # validation | validation on validation set | … on test set
    "key": pl.String,
    "value": pl.Float64,
    "ppl": pl.Float64,
})

_PREFIX = re.compile(r"^(?:\[(?P<tag>[\w.@/-]+?)(?::(?P<r1>\d+))?\]: ?|(?P<r2>\d+): )")
_ITER = re.compile(r"iteration\s+(?P<i>\d+)\s*/\s*(?P<n>\d+)\s*\|")
_TS = re.compile(r"^\s*\[(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?)\]")
_MEM = re.compile(
    r"\[Rank (?P<rank>\d+)\] \(after (?P<it>\d+) iterations\) memory \((?P<unit>MB|GB)\)\s*\|(?P<rest>.*)"
)
_THEORY = re.compile(
    r"Theoretical memory footprints: weight and optimizer=\s*(?P<w>[\d.]+) MB"
    r"(?:, activation=\s*(?P<a>[\d.]+) MB)?(?:, total=\s*(?P<t>[\d.]+) MB)?"
)
_VAL = re.compile(r"validation(?P<split>[^|]*?) loss at (?P<where>[^|]*?) \|(?P<rest>.*)")
# `key: value |` fields (callers strip both). Matches start only at the text's start or after `|` or
# `:`, and nothing backtracks: linear on a line of a million dots (the lazy form was quadratic).
_KV = re.compile(r"(?:^|(?<=[|:]))(?P<k>[^|:]++):(?P<v>[^|]*+)(?:\||$)")
_RECORD_END = "number of nan iterations"
_NUM = re.compile(r"^[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?$|^[+-]?(?:nan|inf)$", re.I)

_ITER_FIELDS = {
    "consumed samples": ("consumed_samples", int),
    "elapsed time per iteration (ms)": ("elapsed_ms", float),
    "throughput per GPU (TFLOP/s/GPU)": ("tflops_per_gpu", float),
    "learning rate": ("learning_rate", float),
    "global batch size": ("global_batch_size", int),
    "lm loss": ("lm_loss", float),
    "load_balancing_loss": ("load_balancing_loss", float),
    "loss scale": ("loss_scale", float),
    "grad norm": ("grad_norm", float),
    "number of skipped iterations": ("skipped_iterations", int),
    "number of nan iterations": ("nan_iterations", int),
}
_MEM_FIELDS = {  # Megatron-LM (MB) and Megatron-Bridge (GB, `bytes`→`gigabytes` key names)
    "allocated": "allocated_mb",
    "max allocated": "max_allocated_mb",
    "reserved": "reserved_mb",
    "max reserved": "max_reserved_mb",
    "mem-allocated-gigabytes": "allocated_mb",
    "mem-max-allocated-gigabytes": "max_allocated_mb",
    "mem-reserved-gigabytes": "reserved_mb",
    "mem-max-reserved-gigabytes": "max_reserved_mb",
}

# Failure signatures, first match wins (most specific first).
FAILURES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("oom", re.compile(r"CUDA out of memory|OutOfMemoryError|CUBLAS_STATUS_ALLOC_FAILED|"
                       r"out of memory", re.I)),
    ("usage", re.compile(r"(?ms)^\S*\s?usage: .*?^\S*\s?[\w.-]+: error: ")),
    ("killed", re.compile(r"DUE TO TIME LIMIT|CANCELLED AT|Signals\.SIGKILL|Signals\.SIGTERM|"
                          r"timed out after")),
    ("nccl", re.compile(r"NCCL error|ncclInternalError|ncclSystemError|"
                        r"Watchdog caught collective operation timeout")),
    ("crash", re.compile(r"Traceback \(most recent call last\)|Segmentation fault|"
                         r"core dumped|ChildFailedError|Fatal Python error")),
)
# Lines that are never the tail of a hard-wrapped Megatron record.
_FOREIGN = re.compile(r"^(?:slurmstepd|srun|sbatch|Traceback|[EWIF]\d{4} |\s*File \"|"
                      r"[\w.]+(?:Error|Exception)\b|\S+\.py:\d+)")
COMPLETION = re.compile(r"\[after training is done\]|after training is done")


@dataclass(frozen=True, slots=True)
class ParsedLog:
    iterations: pl.DataFrame
    memory: pl.DataFrame
    validation: pl.DataFrame
    theoretical_memory: pl.DataFrame = field(
        default_factory=lambda: pl.DataFrame(schema=THEORETICAL_MEMORY_SCHEMA))
    args: dict[str, Any] = field(default_factory=dict)
    completed: bool = False        # Megatron's completion marker was printed
    failure: str | None = None     # oom | usage | nccl | crash (from FAILURES), else None
    failure_line: str | None = None
    implementation: str | None = None  # moe_gpt's `implementation =` line
    # Megatron's profiler span (profile_step_start, profile_step_end) and where the log says it:
    # the argument dump, else a command line; None when the run did not profile
    profile_steps: tuple[int, int] | None = None
    profile_source: str | None = None


def split_prefix(line: str) -> tuple[str, int | None, str]:
    """(prefix key, rank from the prefix or None, rest of the line)."""
    m = _PREFIX.match(line)
    if not m:
        return "", None, line
    tag, r1, r2 = m.group("tag"), m.group("r1"), m.group("r2")
    rank: int | None = None
    if r1 is not None:
        rank = int(r1)
    elif r2 is not None:
        rank = int(r2)
    elif tag:
        digits = re.search(r"(\d+)$", tag)
        rank = int(digits.group(1)) if digits else None
    return m.group(0), rank, line[m.end():]


def _num(text: str, kind: type) -> Any:
    t = text.strip()
    if not _NUM.match(t):
        return None
    try:
        return int(float(t)) if kind is int else float(t)
    except (ValueError, OverflowError):  # `nan` / `inf` (or `1e309`) where a count belongs
        return None


def _iteration_record(text: str, rank: int | None) -> dict[str, Any] | None:
    m = _ITER.search(text)
    if not m:
        return None
    row: dict[str, Any] = {"rank": rank, "iteration": int(m.group("i")),
                           "train_iters": int(m.group("n"))}
    ts = _TS.match(text)
    row["timestamp"] = ts.group("ts") if ts else None
    other = []
    for kv in _KV.finditer(text[m.end():]):
        key, val = kv.group("k").strip(), kv.group("v")
        if key in _ITER_FIELDS:
            col, kind = _ITER_FIELDS[key]
            row[col] = _num(val, kind)
        elif key:
            other.append(f"{key}={val.strip()}")
    row["complete"] = _RECORD_END in text and text.rstrip().endswith("|")
    row["other"] = ";".join(other) or None
    return row


def _memory_record(m: re.Match[str]) -> dict[str, Any]:
    scale = 1024.0 if m.group("unit") == "GB" else 1.0
    row: dict[str, Any] = {"rank": int(m.group("rank")), "iteration": int(m.group("it")),
                           "unit": m.group("unit")}
    for kv in _KV.finditer(m.group("rest")):
        col = _MEM_FIELDS.get(kv.group("k").strip())
        val = _num(kv.group("v"), float)
        if col and val is not None:
            row[col] = val * scale
    return row


def _validation_rows(m: re.Match[str]) -> list[dict[str, Any]]:
    rows: dict[str, dict[str, Any]] = {}
    for kv in _KV.finditer(m.group("rest")):
        key = kv.group("k").strip()
        for suffix, col in ((" value", "value"), (" PPL", "ppl")):
            if key.endswith(suffix):
                name = key[: -len(suffix)]
                rows.setdefault(name, {"where": m.group("where").strip(),
                                       "split": ("validation" + m.group("split")).strip(),
                                       "key": name})[col] = _num(kv.group("v"), float)
    return list(rows.values())


def _starts_record(rest: str) -> bool:
    s = rest.lstrip()
    return bool(_FOREIGN.match(rest) or _TS.match(rest) or _ITER.search(rest) or s.startswith(("[Rank ", "[after", "-"))
                or _MEM.search(rest) or _VAL.search(rest) or _THEORY.search(rest))


def parse_text(text: str) -> ParsedLog:
    """Parse the whole output of one run (all ranks' lines, in any interleaving)."""
    iters: list[dict[str, Any]] = []
    mems: list[dict[str, Any]] = []
    vals: list[dict[str, Any]] = []
    theory: list[dict[str, Any]] = []
    open_rec: dict[str, tuple[int | None, str]] = {}  # prefix → (rank, text) of a cut record
    last_prefix: str | None = None
    impl = None

    def flush(key: str) -> None:
        rank, buf = open_rec.pop(key)
        rec = _iteration_record(buf, rank)
        if rec:
            iters.append(rec)

    for raw in text.splitlines():
        line = raw.rstrip("\r\n")
        prefix, rank, rest = split_prefix(line)
        if not prefix and last_prefix is not None and last_prefix in open_rec \
                and not _starts_record(rest) and rest.strip():
            # unprefixed continuation of a hard-wrapped record (terminal wrap inserts nothing)
            r, buf = open_rec[last_prefix]
            open_rec[last_prefix] = (r, buf + rest)
            if _RECORD_END in buf + rest:
                flush(last_prefix)
            continue
        if prefix in open_rec and rest.strip():
            r, buf = open_rec[prefix]
            if not _starts_record(rest):  # same stream, wrapped: continue it
                open_rec[prefix] = (r, buf + rest)
                if _RECORD_END in buf + rest:
                    flush(prefix)
                continue
            flush(prefix)
        if "moetune workload: implementation =" in rest:
            impl = rest.split("=", 1)[1].strip()
        if _ITER.search(rest):
            if _RECORD_END in rest and rest.rstrip().endswith("|"):
                rec = _iteration_record(rest, rank)
                if rec:
                    iters.append(rec)
            else:
                open_rec[prefix] = (rank, rest)
                last_prefix = prefix
            continue
        mm = _MEM.search(rest)
        if mm:
            mems.append(_memory_record(mm))
            continue
        tm = _THEORY.search(rest)
        if tm:
            theory.append({"rank": rank, "weight_and_optimizer_mb": _num(tm.group("w"), float),
                           "activation_mb": _num(tm.group("a") or "", float),
                           "total_mb": _num(tm.group("t") or "", float)})
            continue
        vm = _VAL.search(rest)
        if vm:
            vals.extend(_validation_rows(vm))
    for key in list(open_rec):
        flush(key)

    failure, failure_line = classify_failure(text)
    try:
        from moetune.analyzer.megatron_args import parse_args_dump

        args = parse_args_dump(text)
    except ImportError:  # the colleague's parser not installed: frames still useful
        args = {}
    profile_steps, profile_source = _profile_span(args, text)
    return ParsedLog(
        iterations=_frame(iters, ITERATIONS_SCHEMA).sort("iteration", "rank", nulls_last=True),
        memory=_frame(mems, MEMORY_SCHEMA),
        validation=_frame(vals, VALIDATION_SCHEMA),
        theoretical_memory=_frame(theory, THEORETICAL_MEMORY_SCHEMA),
        args=args,
        completed=bool(COMPLETION.search(text)),
        failure=failure,
        failure_line=failure_line,
        implementation=impl,
        profile_steps=profile_steps,
        profile_source=profile_source,
    )


# Megatron-LM's defaults for the profiler span (megatron/training/config/common_config.py
# ProfilingConfig) when `--profile` is given without them
_PROFILE_DEFAULTS = (10, 12)
_FLAG_INT = r"--{}[= ]+(\d+)"


def _profile_span(args: dict[str, Any], text: str) -> tuple[tuple[int, int] | None, str | None]:
    """(profile_step_start, profile_step_end) and the source that states them: the argument dump
    (`profile True`), else the last command line carrying `--profile`."""
    if args.get("profile") is True:
        start, end = args.get("profile_step_start"), args.get("profile_step_end")
        if isinstance(start, int) and isinstance(end, int) and end > start:
            return (start, end), "argument dump"
    if "profile" in args:  # the dump says it did not profile
        return None, None
    lines = [ln for ln in text.splitlines() if re.search(r"--profile(?=\s|$)", ln)]
    if not lines:
        return None, None
    line = lines[-1]
    got = [re.search(_FLAG_INT.format(f), line) for f in ("profile-step-start", "profile-step-end")]
    start, end = (int(m.group(1)) if m else d for m, d in zip(got, _PROFILE_DEFAULTS, strict=True))
    return ((start, end), "command line") if end > start else (None, None)


def classify_failure(text: str) -> tuple[str | None, str | None]:
    """First failure signature found in the text, with the line that matched."""
    for cause, pat in FAILURES:
        m = pat.search(text)
        if m:
            start = text.rfind("\n", 0, m.start()) + 1
            end = text.find("\n", m.end())
            return cause, text[start: end if end >= 0 else len(text)].strip()[:300]
    return None, None


def read_log(path: str | Path) -> str:
    """A log's text (undecodable bytes replaced); an unreadable file is one line naming it."""
    p = Path(path)
    try:
        return p.read_text(errors="replace")
    except OSError as exc:
        raise UserError(f"cannot read log: {exc.strerror or exc}", path=p) from None


def parse_file(path: str | Path) -> ParsedLog:
    return parse_text(read_log(path))


def _frame(rows: list[dict[str, Any]], schema: pl.Schema) -> pl.DataFrame:
    if not rows:
        return pl.DataFrame(schema=schema)
    return pl.DataFrame([{k: _int64(r.get(k)) for k in schema} for r in rows], schema=schema,
                        orient="row")


def _int64(value: Any) -> Any:
    """An integer past Int64 (a garbled `iteration 99999999999999999999999/`) is unknown: polars
    would refuse the whole frame."""
    if isinstance(value, int) and not -(2**63) <= value < 2**63:
        return None
    return value


def iteration_args(iterations: pl.DataFrame) -> dict[str, int]:
    """Megatron arguments the iteration lines state: `global_batch_size` and `train_iters` of the
    last iteration printed (a batch-size ramp-up ends at the configured size)."""
    rows = iterations.drop_nulls("iteration").sort("iteration")
    out: dict[str, int] = {}
    for col, arg in (("global_batch_size", "global_batch_size"), ("train_iters", "train_iters")):
        values = rows.get_column(col).drop_nulls()
        if values.len():
            out[arg] = int(values[-1])
    return out


@dataclass(frozen=True, slots=True)
class ReferenceStep:
    """A run's steady unprofiled step time from its log: the lower median of the iteration times
    left after the warm-up and the profiled iterations, and which iterations those were."""

    step_s: float
    iterations: tuple[int, ...]   # the logged iterations the median is of
    warmup: tuple[int, ...]       # left out: start-up (iteration 1, and 2 when others remain)
    profiled: tuple[int, ...]     # left out: the profiler's warm-up, active and export iterations
    profile_steps: tuple[int, int] | None  # profile_step_start, profile_step_end
    profile_source: str | None    # argument dump | command line | given | None

    def describe(self) -> str:
        """`median of iterations 3–8 (left out: warm-up 1–2, profiled 9–12)`."""
        left = [f"{what} {span_text(its)}" for what, its in
                (("warm-up", self.warmup), ("profiled", self.profiled)) if its]
        return (f"median of iterations {span_text(self.iterations)}"
                + (f" (left out: {', '.join(left)})" if left else ""))


def span_text(its: tuple[int, ...] | list[int]) -> str:
    """`3–8`, `3–5, 9` (runs of consecutive iterations)."""
    out: list[str] = []
    xs = sorted(its)
    i = 0
    while i < len(xs):
        j = i
        while j + 1 < len(xs) and xs[j + 1] == xs[j] + 1:
            j += 1
        out.append(str(xs[i]) if i == j else f"{xs[i]}–{xs[j]}")
        i = j + 1
    return ", ".join(out)


def reference_step(parsed: ParsedLog, *, profiled: tuple[int, int] | None = None
                   ) -> ReferenceStep | None:
    """The steady unprofiled median of a run's iteration times, or None without any.

    Left out: iteration 1 (start-up: Megatron logs it apart) and 2 (the allocator's and kernels'
    first-use costs) unless nothing else is left; and every iteration the profiler touched.
    Megatron's PyTorch-profiler schedule for `--profile-step-start S --profile-step-end E`
    (megatron/training/training.py) is wait S−1, warm-up 1, active E−S, stepped at the top of each
    iteration, so logged iteration S−1 runs the profiler's warm-up (tracing on), S…E−1 are recorded
    and E pays the trace's export (one read 12 s in a 1.6 s/iteration run); its nsys path records
    S+1…E. So S−1…E are left out. `profiled` overrides the log's own span (a caller that asked for one
    knows it). A line logged every k iterations stands for the k iterations before it: it
    is left out when any of them is."""
    span, source = (profiled, "given") if profiled is not None else \
        (parsed.profile_steps, parsed.profile_source)
    rows = parsed.iterations.drop_nulls("iteration")
    rows = rows.sort("iteration", "rank", nulls_last=True).unique(
        "iteration", keep="last", maintain_order=True).drop_nulls("elapsed_ms")
    rows = rows.filter(pl.col("elapsed_ms") > 0)
    if rows.height == 0:
        return None
    its = rows.get_column("iteration").to_list()
    times = dict(zip(its, rows.get_column("elapsed_ms").to_list(), strict=True))
    bad = set(range(span[0] - 1, span[1] + 1)) if span else set()
    covers = {it: range(prev + 1, it + 1) for prev, it in zip([0, *its[:-1]], its, strict=True)}
    profiled_its = tuple(it for it in its if any(i in bad for i in covers[it]))
    free = [it for it in its if it not in profiled_its]
    for first in (3, 2):  # a run too short for iteration 2 to be warm-up keeps it
        steady = [it for it in free if min(covers[it]) >= first]
        if steady:
            break
    if not steady:
        return None
    values = sorted(times[it] for it in steady)
    return ReferenceStep(step_s=values[(len(values) - 1) // 2] / 1e3, iterations=tuple(steady),
                         warmup=tuple(it for it in free if it not in steady),
                         profiled=profiled_its, profile_steps=span,
                         profile_source=source if span else None)


def median_step_s(iterations: pl.DataFrame, *, first: int, last: int | None = None
                  ) -> float | None:
    """Lower-median iteration time (s) of the steady window [first, last]; None without times."""
    rows = steady(iterations, first=first, last=last)
    times = sorted(x for x in rows.get_column("elapsed_ms").drop_nulls().to_list() if x > 0)
    return times[(len(times) - 1) // 2] / 1e3 if times else None


def steady(iterations: pl.DataFrame, *, first: int, last: int | None = None) -> pl.DataFrame:
    """Iteration lines inside a declared steady window [first, last] (one row per iteration:
    the last-rank line, which is the one Megatron prints)."""
    df = iterations.filter(pl.col("iteration") >= first)
    if last is not None:
        df = df.filter(pl.col("iteration") <= last)
    return df.sort("iteration", "rank", nulls_last=True).unique("iteration", keep="last",
                                                                 maintain_order=True)
