"""python -m guild.tools.perf_json: schema-valid objects from every strategy, token parity with constrained normal,
the constraint's cost; a failure is reported and is exit status 1; a broken schema is one line, not a traceback."""

import json
import subprocess
import sys

import pytest

from guild.text.grammar import GrammarError
from guild.tools import perf_json

pytest.importorskip("jsonschema")


SMALL = [
    {"subject": "colour", "schema": {"type": "object", "properties": {
        "name": {"enum": ["red", "green", "blue"]}, "bright": {"type": "boolean"}}, "required": ["name", "bright"],
        "additionalProperties": False}},
    {"subject": "line segment", "schema": {"type": "object", "properties": {"ends": {
        "type": "array", "minItems": 2, "maxItems": 2, "items": {"type": "object", "properties": {
            "x": {"type": "integer", "minimum": 0, "maximum": 9}, "y": {"type": "integer", "minimum": 0, "maximum": 9}},
            "required": ["x", "y"], "additionalProperties": False}}}, "required": ["ends"],
        "additionalProperties": False}},
]


def test_small_run_reports_validity_parity_and_costs(capsys, tmp_path, dense_path):
    """Two small schemas (short replies keep it cheap; the segment's ends repeat keys for lookup to copy)
    through normal and lookup, greedy and seeded: lookup's drafts were accepted (and some rejected), and every object
    validates and equals normal's tokens."""
    (tmp_path / "small.json").write_text(json.dumps(SMALL))
    rc = perf_json.main(["--model", "smollm2-135m", "--objects", "2", "--strategies", "lookup", "--max-tokens", "64",
                         "--schemas", str(tmp_path / "small.json"), "--json"])
    rep = json.loads(capsys.readouterr().out)
    assert rc == 0 and rep["ok"] and rep["failures"] == [], rep["failures"]
    rows = {(r["strategy"], r["sampling"]): r for r in rep["rows"]}
    assert set(rows) == {(s, m) for s in ("normal", "lookup") for m in ("greedy", "seeded")}
    for r in rows.values():
        assert r["objects"] == r["valid"] == r["equal"] == 2 and r["tok_s"] > 0
    lookup = [rows[("lookup", m)] for m in ("greedy", "seeded")]
    assert all(r["accepted"] > 0 for r in lookup), lookup
    assert sum(r["drafted"] for r in lookup) > sum(r["accepted"] for r in lookup), lookup  # and some rejected
    assert all(rows[("normal", m)]["drafted"] == 0 and rows[("normal", m)]["acceptance"] is None
               and rows[("normal", m)]["forced"] == 0 for m in ("greedy", "seeded"))
    (cost,) = rep["constraint_cost"]
    assert cost["strategy"] == "normal" and cost["unconstrained_tok_s"] > 0 and cost["ratio"] > 0
    m = rep["mask_us"]
    assert m["tokens"] > 4 and m["vocab"] == 49152 and 0 < m["bitmask_median_us"] <= m["bitmask_p90_us"]
    assert m["allowed_median_us"] > 0
    assert rep["workload"] is None and rep["info"]["objects"] == 2 and rep["info"]["schemas"] == 2
    md = perf_json.markdown(rep)
    assert "| lookup | seeded | 2/2 | 2/2 |" in md and "compute_bitmask median" in md and "failure" not in md


def test_failures_are_listed():
    rep = {"info": {"guild": "x", "model": "m", "cpu": "c", "threads": 2, "objects": 1, "schemas": 1,
                    "max_tokens": 8, "load_start": [1.0], "load_end": [1.0]},
           "rows": [{"strategy": "lookup", "sampling": "greedy", "objects": 1, "valid": 0, "equal": 0, "tok_s": 1.0,
                     "acceptance": None, "forced": 0}],
           "constraint_cost": [], "mask_us": {"tokens": 0}, "workload": None,
           "failures": ["object 0 (person) lookup greedy: tokens differ from normal's at generated token 3"]}
    md = perf_json.markdown(rep)
    assert "| lookup | greedy | 0/1 | 0/1 |" in md and "**1 failure(s)**" in md and "generated token 3" in md


def test_the_objects_span_the_schemas():
    cs = perf_json.cases()
    assert len(cs) == perf_json.MAX_OBJECTS == 50 and len({c.prompt for c in cs}) == 50
    assert [c.subject for c in cs[:3]] == [s for s, _ in perf_json.SCHEMAS[:3]]
    assert all(json.dumps(c.schema) in c.prompt for c in cs)


def test_a_broken_schema_is_one_line(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"subject": "thing", "schema": {"type": "foo"}}]))
    r = subprocess.run([sys.executable, "-m", "guild.tools.perf_json", "--schemas", str(bad)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.startswith(f"error: --schemas {bad}: item 0 (thing): not a valid JSON Schema") and \
        r.stderr.count("\n") == 1


def test_a_schema_llguidance_cannot_compile_names_it(dense_path):
    lookbehind = (("tag", {"type": "string", "pattern": "(?<=a)b"}),)
    with pytest.raises(GrammarError, match=r"^schema 0 \(tag\): "):
        perf_json.run("smollm2-135m", 1, ["normal"], schemas=lookbehind, progress=False)
