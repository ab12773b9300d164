"""A golden document that differs says which fields changed (tests/golden.py), on the real
documents: a rule added is one line, a gain moved is one line, and the message names what the
document pins and the command that rewrites it."""

from __future__ import annotations

import copy
import json

from tests import golden

CASE = next(c for c in golden.cases() if c.name == "gpu_mcore_hostbound")
TEXT = (golden.ROOT / CASE.golden("recommend")).read_text(encoding="utf-8")
DOC = json.loads(TEXT)


def _edited() -> dict:
    new = copy.deepcopy(DOC)
    recs = new["document"]["recommendations"]
    recs[0]["gain"]["speedup"]["low"] = round(recs[0]["gain"]["speedup"]["low"] + 0.03, 4)
    recs.insert(0, {**copy.deepcopy(recs[0]), "rule": "host.new-rule"})
    new["document"]["quiet_count"] -= 1
    new["document"]["rules_checked"] += 1
    return new


def test_changes_are_the_edited_fields_only() -> None:
    new = _edited()
    first = DOC["document"]["recommendations"][0]
    low = first["gain"]["speedup"]["low"]
    found = [str(c) for c in golden.changes(DOC, new)]
    rid = first["rule"]
    assert found[0].startswith("document.quiet_count: ")
    assert f"document.recommendations[rule={rid}].gain.speedup.low: {low} → {round(low + 0.03, 4)}" in found
    assert any(f.startswith("document.recommendations[rule=host.new-rule]: added {") for f in found)
    assert len(found) == 4  # quiet_count, the gain, the added rule, rules_checked
    assert golden.changes(DOC, copy.deepcopy(DOC)) == []


def test_positional_lists_and_type_changes() -> None:
    assert [str(c) for c in golden.changes({"a": [1, 2]}, {"a": [1, 3, 4]})] == [
        "a: 2 → 3 items", "a[1]: 2 → 3"]
    assert [str(c) for c in golden.changes({"a": 1}, {"a": 1.0, "b": None})] == [
        "a: 1 → 1.0", "b: added null"]


def test_failure_message_and_session_summary() -> None:
    golden.SESSION.clear()
    try:
        msg = golden.describe(CASE, "recommend", TEXT, json.dumps(_edited()))
        lines = msg.splitlines()
        assert lines[0].startswith(f"{CASE.golden('recommend')} pins `moetune recommend --json ")
        assert lines[0].endswith("4 field(s) changed:")
        assert lines[-1].startswith(f"If the change is meant: {golden.UPDATE}")
        other = next(c for c in golden.cases() if c.name == "gpu_mcore_computebound")
        text = (golden.ROOT / other.golden("recommend")).read_text()
        doc = json.loads(text)
        doc["document"]["rules_checked"] += 1
        golden.describe(other, "recommend", text, json.dumps(doc))
        summary = golden.summary()
        assert summary[0] == "2 golden document(s) differ; the changed fields:"
        n = DOC["document"]["rules_checked"]
        assert f"  document.rules_checked (in 2 document(s)): {n} → {n + 1} ×2" in summary
        assert summary[-1] == f"If the changes are meant: {golden.UPDATE}"
    finally:
        golden.SESSION.clear()
