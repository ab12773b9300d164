"""docs/extending.md, executed: for each extension point the page walks (kernel class, rule, what-if
transform, launcher, phase signature, and any point added later with a `<!-- point: NAME -->`
section), its worked example is applied — exactly the page's blocks, into exactly the files they
name — to a temporary copy of the repository; the section's `regenerate` commands (but the golden
rewrite, a minute of full analyses) and `run` commands must succeed there, and the files that
changed must be exactly those the section's table lists. A step the page leaves out (a schema enum,
a CLI list, a doc) fails the run; a file it forgets to list fails the comparison.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests import golden

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "extending.md"
# copied into the temporary repository; the large read-only trace folders are linked instead
COPIED = ("analyzer", "rules", "executor", "schemas", "moetune", "tests", "docs", "fixtures",
          "bench", "pyproject.toml", "README.md")
LINKED = ("fixtures/traces", "fixtures/nsys")
PACKAGE_DIRS = ("analyzer", "rules", "executor", "schemas")  # mapped into moetune/ when installed
IGNORED = ("__pycache__", ".pytest_cache", ".ruff_cache")

_POINT = re.compile(r"^<!-- point: ([a-z][a-z0-9-]*) -->$", re.M)
_BLOCK = re.compile(r"^<!-- extend ([a-z][a-z0-9-]*): (.+?) -->\n```[a-z]*\n(.*?)^```$", re.M | re.S)
_OP = re.compile(r"^(create|append) (\S+)$|^insert (\S+) (before|after) (.+)$|^replace (\S+) at (.+)$")
_ROW = re.compile(r"^\| `([^`]+)` \| (.*) \|$", re.M)


@dataclass
class Edit:
    op: str            # create, append, insert-before, insert-after, replace
    file: str
    text: str
    anchor: str | None = None


@dataclass
class Point:
    name: str
    edits: list[Edit] = field(default_factory=list)
    run: list[str] = field(default_factory=list)
    regenerate: list[str] = field(default_factory=list)
    listed: set[str] = field(default_factory=set)       # the table's files
    generated: set[str] = field(default_factory=set)    # … of them, those marked regenerated
    goldens: bool = False                               # the table says goldens are regenerated

    @property
    def edited(self) -> set[str]:
        return {e.file for e in self.edits}

    def lists(self, file: str, *, generated: bool = True) -> bool:
        """Does the table list `file`? A row may name a family: `rules/catalog/<wall>/<id>.yaml`."""
        rows = self.listed if generated else self.listed - self.generated
        return any(_pattern(row).fullmatch(file) for row in rows)


def _pattern(row: str) -> re.Pattern[str]:
    return re.compile("[^/]+".join(map(re.escape, re.split(r"<[^>]+>", row))))


def points(text: str | None = None) -> dict[str, Point]:
    """The extension points of docs/extending.md with their blocks and files tables."""
    text = DOC.read_text(encoding="utf-8") if text is None else text
    marks = list(_POINT.finditer(text))
    out: dict[str, Point] = {}
    for i, m in enumerate(marks):
        end = marks[i + 1].start() if i + 1 < len(marks) else len(text)
        section = text[m.end():end].split("\n## ", 1)[0]
        p = out[m[1]] = Point(m[1])
        for b in _BLOCK.finditer(section):
            assert b[1] == p.name, f"block for {b[1]!r} inside the section of {p.name!r}"
            body, spec = b[3], b[2].strip()
            if spec in ("run", "regenerate"):
                getattr(p, spec).extend(ln for ln in body.splitlines() if ln.strip())
                continue
            op = _OP.match(spec)
            assert op, f"{p.name}: cannot read the edit {spec!r}"
            if op[1]:
                p.edits.append(Edit(op[1], op[2], body))
            elif op[3]:
                p.edits.append(Edit(f"insert-{op[4]}", op[3], body, op[5].strip()))
            else:
                p.edits.append(Edit("replace", op[6], body, op[7].strip()))
        prose = re.sub(r"^```.*?^```$", "", section, flags=re.M | re.S)
        p.goldens = bool(re.search(r"^\| goldens \| regenerated", prose, re.M))
        for row in _ROW.finditer(prose):
            p.listed.add(row[1])
            if row[2].startswith("regenerated"):
                p.generated.add(row[1])
    return out


POINTS = points()


def test_the_page_walks_every_extension_point_completely() -> None:
    assert {"kernel-class", "rule", "whatif-transform", "launcher", "phase-signature"} <= set(POINTS)
    for p in POINTS.values():
        assert p.edits and p.run, f"{p.name}: a worked example and the commands proving it"
        rows = p.listed - p.generated
        assert all(p.lists(f, generated=False) for f in p.edited) and all(
            any(_pattern(r).fullmatch(f) for f in p.edited) for r in rows), (
            f"{p.name}: the files table lists {sorted(rows)}, the example edits {sorted(p.edited)}")
        updates = [c for c in p.regenerate if "--update-golden" in c]
        assert updates == ([golden.UPDATE] if p.goldens else []), (
            f"{p.name}: a `| goldens | regenerated…` row and `{golden.UPDATE}` go together")


def _apply(root: Path, e: Edit) -> None:
    path = root / e.file
    if e.op == "create":
        assert not path.exists(), f"{e.file} exists already"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(e.text, encoding="utf-8")
        return
    text = path.read_text(encoding="utf-8")
    if e.op == "append":
        path.write_text(text + ("" if text.endswith("\n") else "\n") + e.text, encoding="utf-8")
        return
    lines = text.splitlines(keepends=True)
    at = next((i for i, ln in enumerate(lines) if ln.strip().startswith(e.anchor)), None)
    assert at is not None, f"{e.file}: no line starts with {e.anchor!r} (docs/extending.md is stale)"
    if e.op == "insert-before":
        lines.insert(at, e.text)
    elif e.op == "insert-after":
        lines.insert(at + 1, e.text)
    else:
        lines[at] = e.text
    path.write_text("".join(lines), encoding="utf-8")


def _copy(dst: Path) -> Path:
    """The repository as the installed package sees it: its folders, and moetune/analyzer,
    moetune/rules, … linked to them (pyproject.toml's package-dir), so `python -m moetune` and
    `import moetune.analyzer` run the copy, not the checkout."""
    root = dst / "repo"
    for name in COPIED:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, root / name, symlinks=True, ignore=_ignore)
        else:
            shutil.copy2(src, root / name)
    for rel in LINKED:
        (root / rel).symlink_to(ROOT / rel)
    for d in PACKAGE_DIRS:
        (root / "moetune" / d).symlink_to(Path("..") / d)
    return root


def _ignore(folder: str, names: list[str]) -> set[str]:
    here = Path(folder).relative_to(ROOT)
    return {n for n in names if n in IGNORED or str(here / n) in LINKED}


def _files(root: Path) -> dict[str, str]:
    links = (*LINKED, *(f"moetune/{d}" for d in PACKAGE_DIRS))
    out = {}
    for p in root.rglob("*"):
        rel = p.relative_to(root)
        if (any(part in IGNORED for part in rel.parts) or rel.as_posix().startswith(links)
                or p.is_symlink() or not p.is_file()):
            continue
        out[str(rel)] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def _sh(root: Path, command: str) -> subprocess.CompletedProcess[str]:
    argv = command.split(" ", 1)
    if argv[0] == "moetune":  # the copy's CLI, not the one installed from the checkout
        command = f"{sys.executable} -m moetune {argv[1]}"
    elif argv[0] == "python":
        command = f"{sys.executable} {argv[1]}"
    env = {**os.environ, "PYTHONPATH": str(root), "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run(command, shell=True, cwd=root, env=env, capture_output=True, text=True,
                          timeout=600, check=False)


def _prove(root: Path, p: Point) -> str | None:
    """Run the point's regenerate (but the goldens) and run commands in the copy; what failed,
    or None. The example's own new tests must be among those that passed."""
    passed: set[str] = set()
    for command in [c for c in p.regenerate if "--update-golden" not in c] + p.run:
        verbose = command.startswith("python -m pytest")
        done = _sh(root, command + (" -rA" if verbose else ""))
        if done.returncode != 0:
            return f"`{command}` failed:\n{(done.stdout + done.stderr)[-4000:]}"
        passed |= set(re.findall(r"^PASSED \S+::(\w+)", done.stdout, re.M))
    new_tests = {t for e in p.edits if e.file.startswith("tests/")
                 for t in re.findall(r"^def (test_\w+)", e.text, re.M)}
    if not new_tests <= passed:
        return f"the example's tests did not run: {sorted(new_tests - passed)}"
    return None


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(POINTS))
def test_the_worked_example_changes_only_the_documented_files(name: str, tmp_path: Path) -> None:
    p = POINTS[name]
    root = _copy(tmp_path)
    where = _sh(root, "python -c 'import moetune.analyzer, moetune.rules; "
                      "print(moetune.analyzer.__file__, moetune.rules.__file__)'")
    assert where.stdout.split() == [str(root / "moetune" / d / "__init__.py")
                                    for d in ("analyzer", "rules")], where.stderr
    before = _files(root)
    for e in p.edits:
        _apply(root, e)
    failed = _prove(root, p)
    assert failed is None, f"{name}: with docs/extending.md's edits applied, {failed}"
    after = _files(root)
    changed = {f for f in before.keys() | after.keys() if before.get(f) != after.get(f)}
    unlisted = sorted(f for f in changed if not p.lists(f))
    assert not unlisted, f"{name}: changed but not listed in docs/extending.md: {unlisted}"
    assert p.edited <= changed


NEEDED = [(name, i) for name, p in sorted(POINTS.items()) for i in range(len(p.edits))]


@pytest.mark.slow
@pytest.mark.parametrize(("name", "i"), NEEDED,
                         ids=[f"{n}-{POINTS[n].edits[i].file}-{i}" for n, i in NEEDED])
def test_every_documented_edit_is_needed(name: str, i: int, tmp_path: Path) -> None:
    """Leave one of the example's edits out and its proof fails: the registries' checks catch
    the step a contributor forgets, and the page asks for no step that is not needed."""
    p = POINTS[name]
    root = _copy(tmp_path)
    for j, e in enumerate(p.edits):
        if j != i:
            _apply(root, e)
    assert _prove(root, p) is not None, (
        f"{name}: the proof passes without the edit of {p.edits[i].file}: the page asks for a step "
        "nothing checks")
