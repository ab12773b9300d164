"""The installed package's import graph: no cycles among moetune modules, and the layers hold.

The graph is built statically: every `.py` module under the installed package folders is parsed
and *every* import statement in it counts, wherever it stands (module level, inside a function or
a `try`), so a cycle cannot hide behind a function-level import. `importlib.import_module` calls
on a constant (or an f-string's constant prefix, `f"moetune.commands.{name}"`: every module under
it) count too.

Layers (a lower layer never imports a higher one): moetune.analyzer reads traces and contracts and
knows nothing of rules, the executor, the CLI or its rendering; moetune.rules judges a diagnosis and
knows nothing of the executor or the CLI.
"""

from __future__ import annotations

import ast
import importlib.util
import tomllib
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[1]
TOP = "moetune"

FORBIDDEN: dict[str, tuple[str, ...]] = {
    "moetune.analyzer": ("moetune.rules", "moetune.executor", "moetune.commands", "moetune.cli",
                         "moetune.render"),
    "moetune.rules": ("moetune.executor", "moetune.commands", "moetune.cli"),
}

# Edges known to break the rules above, each with the reason it is tolerated for now. Remove an
# entry when its edge is gone (the test fails on an entry whose edge no longer exists).
ALLOWED: dict[tuple[str, str], str] = {}


# --------------------------------------------------------------------------- the graph


@cache
def package_dirs() -> dict[str, Path]:
    """Every package of the distribution (pyproject's list, plus any sub-folder with an
    `__init__.py` below one) -> the folder the installed package imports it from."""
    listed = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    out: dict[str, Path] = {}
    todo = list(listed)
    while todo:
        name = todo.pop()
        if name in out:
            continue
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.submodule_search_locations, f"{name} is not installed"
        folder = Path(next(iter(spec.submodule_search_locations)))
        out[name] = folder
        todo += [f"{name}.{d.name}" for d in folder.iterdir() if (d / "__init__.py").is_file()]
    return dict(sorted(out.items()))


@cache
def module_files() -> dict[str, Path]:
    """Module name -> source file, for every Python module of the package."""
    out: dict[str, Path] = {}
    for pkg, folder in package_dirs().items():
        out[pkg] = folder / "__init__.py"
        for f in sorted(folder.glob("*.py")):
            if f.name != "__init__.py":
                out[f"{pkg}.{f.stem}"] = f
    return out


@cache
def all_modules() -> frozenset[str]:
    """Python modules plus compiled extensions (`readers._kineto_scan`): import targets."""
    names = set(module_files())
    for pkg, folder in package_dirs().items():
        for f in folder.iterdir():
            if f.suffix in (".so", ".pyd"):
                names.add(f"{pkg}.{f.name.split('.')[0]}")
    return frozenset(names)


def _target(name: str) -> str | None:
    """The module an import of `name` loads last: the longest prefix that is a module of ours."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        candidate = ".".join(parts[:i])
        if candidate in all_modules():
            return candidate
    return None


def _imports(module: str, path: Path) -> Iterator[tuple[str, int]]:
    """(imported module, line) for every import in the file, at any depth."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    is_pkg = path.name == "__init__.py"
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if (t := _target(alias.name)) is not None:
                    yield t, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".") if is_pkg else module.split(".")[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                # `from pkg import sub` imports the submodule when `sub` is one, else `pkg`
                t = _target(f"{base}.{alias.name}") if alias.name != "*" else None
                if t is None or t != f"{base}.{alias.name}":
                    t = _target(base)
                if t is not None:
                    yield t, node.lineno
        elif isinstance(node, ast.Call) and _is_import_module(node.func) and node.args:
            arg = node.args[0]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                if (t := _target(arg.value)) is not None:
                    yield t, node.lineno
            elif isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant):
                prefix = str(arg.values[0].value)
                for m in sorted(all_modules()):
                    if m.startswith(prefix) and m in module_files():
                        yield m, node.lineno


def _is_import_module(func: ast.expr) -> bool:
    return (isinstance(func, ast.Attribute) and func.attr == "import_module") or (
        isinstance(func, ast.Name) and func.id == "import_module")


@cache
def import_graph() -> nx.DiGraph:
    """moetune module -> moetune module, edge attribute `line` (first import line)."""
    g = nx.DiGraph()
    for module, path in module_files().items():
        g.add_node(module)
        for target, line in _imports(module, path):
            if target != module and not g.has_edge(module, target):
                g.add_edge(module, target, line=line)
    return g


def _where(g: nx.DiGraph, src: str, dst: str) -> str:
    path = module_files()[src]
    try:
        shown = path.relative_to(ROOT)
    except ValueError:
        shown = path
    return f"{src} -> {dst} ({shown}:{g.edges[src, dst]['line']})"


def _under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


# --------------------------------------------------------------------------- tests


def test_the_graph_sees_the_whole_package() -> None:
    mods = module_files()
    assert {"moetune.cli", "moetune.conditions", "moetune.analyzer.graph",
            "moetune.analyzer.readers.kineto", "moetune.rules.engine", "moetune.commands.audit",
            "moetune.executor.loop"} <= set(mods)
    g = import_graph()
    # module-level, function-level and dynamic imports all count
    assert g.has_edge("moetune.rules.engine", "moetune.conditions")
    assert g.has_edge("moetune.analysis", "moetune.analyzer.audit")  # inside a function
    assert g.has_edge("moetune.cli", "moetune.commands.audit")  # import_module(f"…{module}")


def test_parsing_rules(tmp_path: Path) -> None:
    """Relative imports resolve against the package; `from pkg import submodule` is an import of
    the submodule, `from pkg import name` one of the package."""
    src = ("from . import kineto\nfrom .nsys import read_nsys\nfrom .. import frames\n"
           "def f():\n    from moetune.analyzer.readers import expand\n")
    f = tmp_path / "x.py"
    f.write_text(src)
    got = sorted(t for t, _ in _imports("moetune.analyzer.readers.x", f))
    assert got == ["moetune.analyzer.frames", "moetune.analyzer.readers",
                   "moetune.analyzer.readers.kineto", "moetune.analyzer.readers.nsys"]


def test_no_import_cycles() -> None:
    g = import_graph().copy()
    g.remove_edges_from(e for e in ALLOWED if g.has_edge(*e))
    problems = []
    for scc in nx.strongly_connected_components(g):
        if len(scc) < 2:
            continue
        cycle = nx.find_cycle(g.subgraph(scc))
        problems.append("cycle among " + ", ".join(sorted(scc)) + ":\n    "
                        + "\n    ".join(_where(g, a, b) for a, b in cycle))
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_layers(layer: str) -> None:
    g = import_graph()
    bad = [
        _where(g, src, dst)
        for src, dst in g.edges
        if _under(src, layer) and any(_under(dst, f) for f in FORBIDDEN[layer])
        and (src, dst) not in ALLOWED
    ]
    assert not bad, f"{layer} must not import {', '.join(FORBIDDEN[layer])}:\n  " + "\n  ".join(bad)


def test_allow_list_is_current() -> None:
    g = import_graph()
    stale = [f"{a} -> {b}" for a, b in ALLOWED if not g.has_edge(a, b)]
    assert not stale, "these allowed edges are gone: remove them from ALLOWED: " + ", ".join(stale)
