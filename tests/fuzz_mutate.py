"""Structure-aware mutations of real inputs for the fuzz suite (tests/test_fuzz.py).

Each input kind has a hypothesis strategy that draws a list of operations; applying them to a real
seed (a JSON tree, a YAML document, log lines, an SQLite file) is deterministic, so hypothesis can
shrink a failing case to the few operations that matter. Operations: truncation at a byte offset,
byte flips, type swaps (number / string / null / list / dict / bool), missing keys, huge /
negative / NaN / Infinity numbers, duplicated elements and ids, hostile unicode (lone surrogates,
RTL overrides, NUL, newlines), deep nesting, YAML alias bombs, dropped / renamed tables and columns.
"""

from __future__ import annotations

import contextlib
import copy
import gzip
import json
import re
import sqlite3
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml
from hypothesis import strategies as st

# --- values ------------------------------------------------------------------------------------

SPECIAL_NUMBERS: tuple[Any, ...] = (
    float("nan"), float("inf"), float("-inf"), 1e308, -1e308, 1e-320, -0.0, 0, -1, -1000,
    2**31, 2**53 + 1, 2**63 - 1, 2**63, -(2**63), 2**64, 10**30, -(10**30), 3.5, 1e18,
)
NASTY_STRINGS: tuple[str, ...] = (
    "", " ", "\x00", "a\x00b", "\ud800", "\udfff", "x\ud83d", "\u202eevil\u202c", "\u200f\u05d0",
    "\ufeff", "line\nbreak", "\r\n", "\t", "e\u0301\u0301\u0301", "😀", "\uffff", "NaN",
    "Infinity", "-1", "1e999", "null", "true", "{", "]", "'", '"', "\\", "%s%n", "../../x",
    "ProfilerStep#1", "ProfilerStep#", "nccl:all_to_all", "a" * 5000,
)
NEST_DEPTHS = (64, 999, 5000, 100_000)

json_scalars = st.one_of(
    st.sampled_from(SPECIAL_NUMBERS), st.sampled_from(NASTY_STRINGS), st.none(), st.booleans(),
    st.integers(), st.floats(), st.text(max_size=20),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(st.text(max_size=6), inner, max_size=3)),
    max_leaves=6,
)

# --- JSON / YAML trees --------------------------------------------------------------------------

TREE_OPS = ("replace", "number", "retype", "delete", "duplicate", "same_id", "unicode", "rekey",
            "nest", "cut_list", "reverse", "alias")

tree_op = st.tuples(
    st.sampled_from(TREE_OPS),
    st.integers(1, 5),          # depth to act at (1 = top-level keys)
    st.integers(0, 2**31),      # which node at that depth
    json_values,                # payload for replace
    st.integers(0, 2**31),      # auxiliary choice (number, string, depth, offset)
)


def _positions(tree: Any) -> dict[int, list[tuple[Any, Any, Any]]]:
    """(container, key, grand-container) of every value, by depth; iterative (trees may be big)."""
    out: dict[int, list[tuple[Any, Any, Any]]] = {}
    stack: list[tuple[Any, Any, int]] = [(tree, None, 0)]
    while stack:
        node, parent, depth = stack.pop()
        items = node.items() if isinstance(node, dict) else \
            enumerate(node) if isinstance(node, list) else ()
        for k, v in items:
            out.setdefault(depth + 1, []).append((node, k, parent))
            if isinstance(v, dict | list):
                stack.append((v, node, depth + 1))
    return out


def _nest_token(kind: str, depth: int) -> str:
    return f"@@NEST_{kind}_{depth}@@"


def _retype(v: Any) -> Any:
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, int | float):
        return str(v)
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            return None if v else 0
    if isinstance(v, list):
        return {str(i): x for i, x in enumerate(v)}
    if isinstance(v, dict):
        return list(v.values())
    return [v]


def mutate_tree(tree: Any, ops: Sequence[tuple]) -> Any:
    """A mutated deep copy of a JSON-like tree (dicts, lists, scalars)."""
    tree = copy.deepcopy(tree)
    for kind, depth, which, payload, aux in ops:
        by_depth = _positions(tree)
        if not by_depth:
            break
        depths = sorted(by_depth)
        level = by_depth[depths[min(depth, len(depths)) - 1]]
        node, key, grand = level[which % len(level)]
        value = node[key]
        if kind == "replace":
            node[key] = payload
        elif kind == "number":
            node[key] = SPECIAL_NUMBERS[aux % len(SPECIAL_NUMBERS)]
        elif kind == "retype":
            node[key] = _retype(value)
        elif kind == "delete":
            del node[key]
        elif kind == "duplicate":
            if isinstance(node, list):
                node.insert(key, copy.deepcopy(value))
            else:
                other = list(node)[aux % len(node)]
                node[other] = copy.deepcopy(value)
        elif kind == "same_id":  # give this element's key the value a sibling element has
            if isinstance(node, dict) and isinstance(grand, list):
                donors = [g for g in grand if isinstance(g, dict) and key in g and g is not node]
                if donors:
                    node[key] = copy.deepcopy(donors[aux % len(donors)][key])
        elif kind == "unicode":
            bad = NASTY_STRINGS[aux % len(NASTY_STRINGS)]
            if isinstance(value, str):
                at = aux % (len(value) + 1)
                node[key] = value[:at] + bad + value[at:]
            else:
                node[key] = bad
        elif kind == "rekey":
            if isinstance(node, dict):
                node[NASTY_STRINGS[aux % len(NASTY_STRINGS)]] = node.pop(key)
        elif kind == "nest":
            node[key] = _nest_token("L" if aux % 2 else "D", NEST_DEPTHS[aux % len(NEST_DEPTHS)])
        elif kind == "alias":  # YAML only: an alias of an exponentially large anchor
            node[key] = f"@@ALIAS_{3 + aux % 7}@@"
        elif kind == "cut_list":
            if isinstance(value, list):
                del value[aux % (len(value) + 1):]
        elif kind == "reverse" and isinstance(value, list):
            value.reverse()
    return tree


def _expand_nesting(text: str, *, yaml_flow: bool = False) -> str:
    def deep(m: re.Match[str]) -> str:
        kind, depth = m.group(1), int(m.group(2))
        if kind == "L":
            return "[" * depth + "]" * depth
        opener = "{a: " if yaml_flow else '{"a":'
        return opener * depth + "1" + "}" * depth

    return re.sub(r"""["']?@@NEST_([LD])_(\d+)@@["']?""", deep, text)


def dump_json(tree: Any, *, ascii_only: bool) -> bytes:
    """JSON text as a buggy writer might produce it: NaN/Infinity literals, lone surrogates
    written raw (invalid UTF-8) when not escaped, deep nesting spliced in."""
    text = json.dumps(tree, allow_nan=True, ensure_ascii=ascii_only)
    return _expand_nesting(text).encode("utf-8", "surrogatepass")


def dump_yaml(tree: Any) -> bytes:
    """YAML text; an `alias` operation's token becomes an alias of a "billion laughs" anchor
    defined first, in a `megatron_args` mapping a later one of the same name replaces (PyYAML
    keeps the last of duplicate keys, so the anchors survive only through the alias)."""
    text = yaml.safe_dump(tree, sort_keys=False, allow_unicode=True, width=100)
    levels = [int(m) for m in re.findall(r"@@ALIAS_(\d+)@@", text)]
    if levels:
        text = re.sub(r"""["']?@@ALIAS_(\d+)@@["']?""", lambda m: f"*b{int(m.group(1)) - 1}", text)
        text = f"megatron_args: {{{alias_bomb(max(levels))}}}\n" + text
    return _expand_nesting(text, yaml_flow=True).encode("utf-8", "surrogatepass")


# --- bytes --------------------------------------------------------------------------------------

byte_ops = st.lists(
    st.tuples(st.sampled_from(("truncate", "flip", "insert")), st.floats(0, 1),
              st.binary(min_size=1, max_size=4)),
    max_size=2,
)


def mutate_bytes(data: bytes, ops: Sequence[tuple[str, float, bytes]]) -> bytes:
    for kind, where, payload in ops:
        at = int(where * len(data))
        if kind == "truncate":
            data = data[:at]
        elif kind == "flip":
            data = data[:at] + payload + data[at + len(payload):]
        else:
            data = data[:at] + payload + data[at:]
    return data


def maybe_gzip(data: bytes, gz: bool) -> bytes:
    return gzip.compress(data, mtime=0) if gz else data


# --- text (logs, YAML alias bombs) -------------------------------------------------------------

LINE_OPS = ("delete", "duplicate", "swap", "number", "unicode", "cut", "long", "blank")

line_op = st.tuples(st.sampled_from(LINE_OPS), st.integers(0, 2**31), st.integers(0, 2**31))
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")
_NUMBER_TEXT = ("nan", "inf", "-inf", "1e309", "-5", "0", "99999999999999999999999", "1e-400",
                "١٢٣", "0x10", "", "None", "-0")


def mutate_lines(text: str, ops: Sequence[tuple[str, int, int]]) -> str:
    lines = text.split("\n")
    for kind, which, aux in ops:
        if not lines:
            break
        i = which % len(lines)
        line = lines[i]
        if kind == "delete":
            del lines[i]
        elif kind == "duplicate":
            lines.insert(i, line)
        elif kind == "swap":
            j = aux % len(lines)
            lines[i], lines[j] = lines[j], lines[i]
        elif kind == "number":
            nums = list(_NUMBER.finditer(line))
            if nums:
                m = nums[aux % len(nums)]
                lines[i] = line[:m.start()] + _NUMBER_TEXT[aux % len(_NUMBER_TEXT)] + line[m.end():]
        elif kind == "unicode":
            at = aux % (len(line) + 1)
            lines[i] = line[:at] + NASTY_STRINGS[aux % len(NASTY_STRINGS)] + line[at:]
        elif kind == "cut":
            lines[i] = line[: aux % (len(line) + 1)]
        elif kind == "long":
            lines[i] = line + "." * (1 << (aux % 21))
        elif kind == "blank":
            lines[i] = ""
    return "\n".join(lines)


def alias_bomb(levels: int) -> str:
    """The YAML "billion laughs" as flow-mapping entries: `levels` anchors, each a list of ten
    aliases of the one before (10**levels strings once expanded)."""
    out = ["bomb0: &b0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for i in range(1, levels):
        out.append(f"bomb{i}: &b{i} [" + ", ".join([f"*b{i - 1}"] * 10) + "]")
    return ", ".join(out)


# --- SQLite -------------------------------------------------------------------------------------

SQL_VALUES: tuple[Any, ...] = (
    None, "", "x", "\x00", "\u202e", "1e999", "NaN", "{", "[1, 2", '{"a": NaN}', "[]", '"s"', "{}",
    "null", 0, -1, 2**63 - 1, -(2**63), 1e308, float("inf"), float("-inf"), -0.5, 3.5,
    b"\x00\xff", b"", 10**12, -(10**12),
)
SQL_OPS = ("set_cell", "set_column", "copy_cell", "delete_rows", "drop_table", "drop_column",
           "rename_column", "duplicate_rows", "empty_table")

sql_op = st.tuples(
    st.sampled_from(SQL_OPS),
    st.booleans(),               # prefer a table the reader reads
    st.integers(0, 2**31),       # table
    st.integers(0, 2**31),       # column
    st.integers(0, 2**31),       # row / value
)


def sqlite_layout(path: Path) -> dict[str, list[str]]:
    """Table -> columns of an SQLite file (read-only)."""
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?immutable=1", uri=True)
    try:
        tables = [r[0] for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' "
            "ORDER BY name")]
        return {t: [r[1] for r in conn.execute(f'PRAGMA table_info("{t}")')] for t in tables}
    finally:
        conn.close()


def mutate_sqlite(path: Path, ops: Sequence[tuple], hot: Callable[[str], bool]) -> None:
    """Apply `ops` to the SQLite file at `path` in place (a copy the caller made). An operation
    SQLite refuses (dropping a key column, a unique clash) is skipped: the input stays valid SQLite."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=DELETE")  # no -wal left beside the mutated copy
        for kind, prefer_hot, t_i, c_i, r_i in ops:
            layout = {t: [r[1] for r in conn.execute(f'PRAGMA table_info("{t}")')]
                      for (t,) in conn.execute(
                          "SELECT name FROM sqlite_master WHERE type = 'table' "
                          "AND name NOT LIKE 'sqlite_%' ORDER BY name")}
            names = [t for t in layout if hot(t)] if prefer_hot else []
            names = names or list(layout)
            if not names:
                break
            table = names[t_i % len(names)]
            cols = layout[table] or ["rowid"]
            col = cols[c_i % len(cols)]
            value = SQL_VALUES[r_i % len(SQL_VALUES)]
            rows = conn.execute(f'SELECT COUNT(*) FROM "{table}"').fetchone()[0]
            pick = f'rowid = (SELECT rowid FROM "{table}" LIMIT 1 OFFSET {r_i % max(rows, 1)})'
            sql: list[tuple[str, tuple]] = {
                "set_cell": [(f'UPDATE "{table}" SET "{col}" = ? WHERE {pick}', (value,))],
                "set_column": [(f'UPDATE "{table}" SET "{col}" = ?', (value,))],
                "copy_cell": [(f'UPDATE "{table}" SET "{col}" = (SELECT "{col}" FROM "{table}" '
                               f'LIMIT 1) WHERE {pick}', ())],
                "delete_rows": [(f'DELETE FROM "{table}" WHERE rowid % {2 + r_i % 5} = 0', ())],
                "drop_table": [(f'DROP TABLE "{table}"', ())],
                "drop_column": [(f'ALTER TABLE "{table}" DROP COLUMN "{col}"', ())],
                "rename_column": [(f'ALTER TABLE "{table}" RENAME COLUMN "{col}" TO "{col}_x"',
                                   ())],
                "duplicate_rows": [(f'INSERT OR IGNORE INTO "{table}" SELECT * FROM "{table}" '
                                    f'LIMIT {1 + r_i % 50}', ())],
                "empty_table": [(f'DELETE FROM "{table}"', ())],
            }[kind]
            for stmt, args in sql:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute(stmt, args)
    finally:
        conn.close()
