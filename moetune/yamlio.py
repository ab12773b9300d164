"""Plain YAML for moetune's data files and users' rule folders: safe-load only, no tags, no
duplicate keys, and a map from key path to line so every problem can name its file and line."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from moetune.errors import UserError

_PLAIN_TAGS = {
    "tag:yaml.org,2002:" + t for t in ("str", "int", "float", "bool", "null", "seq", "map")
}


def read_yaml(path: Path) -> tuple[Any, dict[tuple, int]]:
    """Safe-load one YAML document; return it with a map from key path to 1-based line."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read: {exc}", path=path) from None
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            raise UserError("empty YAML document", path=path)
        lines: dict[tuple, int] = {}
        _check_nodes(node, (), lines, path)
        data = loader.construct_document(node)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        problem = getattr(exc, "problem", None) or str(exc)
        raise UserError(f"{where}: invalid YAML: {problem}") from None
    finally:
        loader.dispose()
    return data, lines


def read_catalog(path: str | Path, what: str) -> Any:
    """A shipped or user catalog (kernel classes, phases) on its hot path: libyaml's safe loader
    when present (10× faster than `read_yaml`'s node walk), the checks left to its schema and
    `read_yaml` asked for lines only when a problem needs one. Unreadable or malformed YAML is
    one line naming the file."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        return yaml.load(Path(path).read_text(), Loader=loader)
    except (OSError, yaml.YAMLError) as exc:
        raise UserError(f"cannot read {what}: {exc}", path=path) from None


def _check_nodes(node: yaml.Node, at: tuple, lines: dict[tuple, int], path: Path) -> None:
    lines.setdefault(at, node.start_mark.line + 1)
    if node.tag not in _PLAIN_TAGS:
        raise UserError(
            f"{path}:{node.start_mark.line + 1}: tag {node.tag!r} not allowed (plain YAML only)"
        )
    if isinstance(node, yaml.MappingNode):
        seen: set[Any] = set()
        for k, v in node.value:
            key = k.value
            if key in seen:
                raise UserError(f"{path}:{k.start_mark.line + 1}: duplicate key {key!r}")
            seen.add(key)
            lines[(*at, key)] = k.start_mark.line + 1
            _check_nodes(v, (*at, key), lines, path)
    elif isinstance(node, yaml.SequenceNode):
        for i, v in enumerate(node.value):
            _check_nodes(v, (*at, i), lines, path)


def line_of(lines: Mapping[tuple, int], at: Iterable[Any]) -> int | None:
    """Line of the deepest known prefix of `at`."""
    key = tuple(at)
    while key not in lines and key:
        key = key[:-1]
    return lines.get(key)
