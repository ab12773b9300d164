"""The installed distribution: one top-level package, `moetune`, with the repository's folders
mapped into it, its data files inside, and no test fixtures; a user's own `rules/` or `analyzer/`
package in the working folder cannot shadow it."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                           "-q", "-w", str(out), str(ROOT)], capture_output=True, text=True,
                          timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (path,) = out.glob("moetune-*.whl")
    return path


def test_wheel_has_one_top_level_package_and_no_fixtures(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        top = next(n for n in names if n.endswith("top_level.txt"))
        assert z.read(top).decode().split() == ["moetune"]
    roots = {n.split("/", 1)[0] for n in names}
    assert roots == {"moetune", next(r for r in roots if r.endswith(".dist-info"))}
    assert not [n for n in names if "fixtures" in n or n.startswith(("tests/", "bench/"))]
    for needed in ("moetune/analyzer/kernel_classes.yaml", "moetune/analyzer/whatif.yaml",
                   "moetune/analyzer/planner/planner.yaml", "moetune/rules/knobs.yaml",
                   "moetune/rules/signatures.yaml", "moetune/schemas/diagnosis.schema.json",
                   "moetune/data/mcore_hostbound.pt.trace.json.gz",
                   "moetune/rules/catalog/host/host.larger-micro-batch.yaml"):
        assert needed in names, needed
    assert wheel.stat().st_size < 6 * 1024 * 1024  # the demo trace is most of it


def test_users_own_rules_and_analyzer_packages_do_not_break_commands(tmp_path: Path) -> None:
    for name in ("rules", "analyzer", "executor", "schemas", "fixtures"):
        pkg = tmp_path / name
        pkg.mkdir()
        (pkg / "__init__.py").write_text("raise ImportError('the user\\'s own package')\n")
    for args in (["rules", "list"], ["diagnose"], ["contract", "check",
                                                   str(ROOT / "fixtures/contracts/qwen3_30b_h100.yaml")]):
        proc = subprocess.run([sys.executable, "-m", "moetune", *args], cwd=tmp_path,
                              capture_output=True, text=True, timeout=300, check=False)
        assert proc.returncode == 0, (args, proc.stderr[-2000:])
        assert "Traceback" not in proc.stderr
