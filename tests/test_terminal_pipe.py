"""What an engineer reads: `moetune diagnose … | cat` and `moetune diff … | cat` through a real
pipe, and the same commands on a real pseudo-terminal of a given width (real subprocesses, real
H200 traces). Through a pipe nothing is wrapped or cut to the terminal, the text is the same
whatever COLUMNS says, counts are integers; on a terminal rows fit its width. Either way two
different kernels never read alike."""

from __future__ import annotations

import fcntl
import os
import re
import shlex
import struct
import subprocess
import sys
import termios
from pathlib import Path

from moetune.render import count, distinct_names

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "fixtures" / "traces"
HOST = TRACES / "mlm_host_mbs8_rcnone" / "trace.json.gz"  # 4 kernels read `elementwise_kernel<…>`
SEQ = TRACES / "grid_host_mbs8_seq_rcnone_a2a_eager"
GRP = TRACES / "grid_host_mbs8_grp_rcnone_a2a_eager"  # 3 mangled CUTLASS grouped GEMMs
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
MOETUNE = [sys.executable, "-m", "moetune"]


def _piped(*argv: str, columns: str | None = None) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    if columns:
        env["COLUMNS"] = columns
    done = subprocess.run([*MOETUNE, *argv], capture_output=True, text=True, env=env,
                          check=True, timeout=300)
    return done.stdout


def _on_pty(*argv: str, cols: int) -> str:
    """Run with stdout and stderr on a new pseudo-terminal `cols` wide; what it showed."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, cols, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    env["TERM"] = "xterm"
    proc = subprocess.Popen([*MOETUNE, *argv], stdout=slave, stderr=slave, env=env,
                            close_fds=True)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    assert proc.wait(timeout=300) == 0
    return ANSI.sub("", b"".join(chunks).decode()).replace("\r\n", "\n")


def _table(text: str, title: str) -> list[str]:
    """The rows of the table under `title` (its header excluded): up to a blank line or the
    next title (a line without the two-space gaps between a row's cells)."""
    lines = text.splitlines()
    i = next(k for k, line in enumerate(lines) if line.startswith(title))
    rows = []
    for line in lines[i + 2:]:
        if "  " not in line.strip():
            break
        rows.append(line)
    return rows


def _names(rows: list[str]) -> list[str]:
    return [re.split(r"\s{2,}", r.strip())[0] for r in rows]


def test_diagnose_piped_reads_cleanly() -> None:
    text = _piped("diagnose", str(HOST), "--top", "12")
    assert text == _piped("diagnose", str(HOST), "--top", "12", columns="40")  # no width
    kernels = _table(text, "top GPU kernels")
    assert len(kernels) == 12  # one line each: nothing wrapped
    names = _names(kernels)
    assert len(set(names)) == 12  # 4 `elementwise_kernel<gpu_kernel_impl_nocast>` told apart
    assert sum(n.startswith("elementwise_kernel<gpu_kernel_impl_nocast> #") for n in names) == 4
    counts = [re.split(r"\s{2,}", r.strip())[2] for r in kernels]
    assert "314" in counts and not any(c.endswith(".0") for c in counts)  # 628 over 2 steps
    assert "427.5" in counts  # a mean that is not a whole number keeps its decimal
    # the header line is long and whole, not wrapped at 80 columns
    assert any(len(line) > 150 for line in text.splitlines())
    assert not any(line.rstrip().endswith("…") for line in text.splitlines()
                   if "kernels/step" in line)


def test_diff_piped_reads_cleanly() -> None:
    text = _piped("diff", str(SEQ), str(GRP))
    assert text == _piped("diff", str(SEQ), str(GRP), columns="60")
    names = _names(_table(text, "kernels by |Δ|"))
    assert len(names) == 10 and len(set(names)) == 10
    assert sum(n.startswith("_ZN7cutlass13device_kernel") for n in names) == 3
    assert "launches per step: 2,858 → 748" in text


def test_on_a_terminal_rows_fit_and_names_stay_apart() -> None:
    text = _on_pty("diagnose", str(HOST), "--top", "12", cols=100)
    kernels = _table(text, "top GPU kernels")
    assert len(kernels) == 12 and all(len(r) <= 100 for r in kernels)
    names = _names(kernels)
    assert len(set(names)) == 12
    wide = _on_pty("diff", str(SEQ), str(GRP), cols=90)
    rows = _table(wide, "kernels by |Δ|")
    assert all(len(r) <= 90 for r in rows) and len(set(_names(rows))) == len(rows) == 10


def test_distinct_names_and_counts() -> None:
    a = "void at::native::elementwise_kernel<128, 2, gpu_kernel_impl_nocast<MulFunctor<float>>>(int)"
    b = "void at::native::elementwise_kernel<128, 2, gpu_kernel_impl_nocast<DivFunctor<float>>>(int)"
    labels = distinct_names([a, b, "nvjet_sm90_tst"], 40)
    assert labels[0] != labels[1] and labels[2] == "nvjet_sm90_tst"
    assert labels == distinct_names([a, b, "nvjet_sm90_tst"], 40)  # stable
    assert [count(x) for x in (480.0, 427.5, 1234.0)] == ["480", "427.5", "1,234"]


def test_one_step_reads_as_a_step_id_in_every_header() -> None:
    """The profiled step 10 of a real Megatron-LM run: `step 10`, never `steps 10` (a count of
    ten) nor `steps 10–10`, the same in diagnose's and audit's headers."""
    d = TRACES / "mlm_host_mbs1_rcfull"
    diag = _piped("diagnose", str(d / "trace.json.gz")).splitlines()[0]
    audit = _piped("audit", "--log", str(d / "train.log"), str(d / "trace.json.gz")).splitlines()[0]
    assert " · step 10 (profiler step) · " in diag
    assert audit.endswith(" · trace.json.gz · step 10")


def test_diagnose_hints_run_as_printed() -> None:
    """Each command of diagnose's `next:` line runs as printed on the real Megatron-LM trace and
    its log (audit once got `--contract FILE` beside a --log that it takes); with no PATH, the
    hint names the shipped trace that was read, not `<trace>`."""
    d = TRACES / "mlm_host_mbs1_rcfull"
    done = subprocess.run([*MOETUNE, "diagnose", str(d / "trace.json.gz"), "--log",
                           str(d / "train.log")], capture_output=True, text=True, check=True,
                          timeout=300)
    hint = next(ln for ln in done.stderr.splitlines() if ln.startswith("next: "))
    commands = hint.removeprefix("next: ").split("  ·  ")
    assert [c.split()[1] for c in commands] == ["recommend", "audit"]
    for command in commands:
        argv = shlex.split(command)
        assert "FILE" not in argv
        ran = subprocess.run([*MOETUNE, *argv[1:]], capture_output=True, text=True, timeout=300)
        assert ran.returncode == 0, (command, ran.stderr)
    bare = subprocess.run([*MOETUNE, "diagnose"], capture_output=True, text=True, check=True,
                          timeout=300)
    hint = next(ln for ln in bare.stderr.splitlines() if ln.startswith("next: "))
    assert "<trace>" not in hint
    assert Path(shlex.split(hint.split("  ·  ")[1])[-1]).is_file()
