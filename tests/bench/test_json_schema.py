"""The json_schema case: schema-valid objects from every strategy, token parity with constrained normal, the
constraint's cost and the mask's; a failure is listed after the report and is exit status 1; a broken schema is one
line, not a traceback."""

import json
import subprocess
import sys
import types

import pytest

from guild.bench import main as bench_main
from guild.bench import schemas
from guild.bench.cases import json_schema
from guild.bench.harness import Run, Runner

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
    rc = bench_main.main(["json_schema", "--model", "smollm2-135m", "--objects", "2", "--strategies", "lookup",
                          "--max-tokens", "64", "--schemas", str(tmp_path / "small.json"), "--workload", "", "-t", "2",
                          "--out", str(tmp_path), "--json"])
    recs = {(r["runner"], r["point"]["sampling"]): r for r in map(json.loads, capsys.readouterr().out.splitlines())}
    assert rc == 0
    assert set(recs) == {(s, m) for s in ("normal", "lookup", "normal unconstrained", "mask")
                         for m in ("greedy", "seeded")}
    med = {k: {f: v["median"] for f, v in r["figures"].items()} for k, r in recs.items()}
    for m in ("greedy", "seeded"):
        for s in ("normal", "lookup"):
            assert med[(s, m)]["valid"] == 1.0 and med[(s, m)]["decode_tok_s"] > 0
        assert recs[("lookup", m)]["parity"] is True
        assert med[("lookup", m)]["acceptance"] > 0  # drafts accepted
        assert "acceptance" not in med[("normal", m)] and med[("normal", m)]["forced"] == 0
        assert med[("normal unconstrained", m)]["decode_tok_s"] > 0
        assert 0 < med[("mask", m)]["mask_us"] <= med[("mask", m)]["mask_p90_us"] and med[("mask", m)]["allowed_us"] > 0
    assert any(med[("lookup", m)]["acceptance"] < 1 for m in ("greedy", "seeded"))  # and some rejected
    md = (tmp_path / "json_schema.md").read_text()
    assert "constrained / unconstrained normal, greedy:" in md and "failure" not in md


def test_failures_are_listed_and_fail_the_run(monkeypatch, capsys):
    """A case whose failed(a) is true: its report first, then exit status 1."""
    a = types.SimpleNamespace(failures=["object 0 (person) lookup greedy: does not validate (eos): '{'"])
    assert json_schema.failed(a) and "**1 failure(s)**:" in json_schema.notes([], a)[0]
    fake = types.SimpleNamespace(__doc__="A fake case.", add_args=lambda ap: None, check=lambda a: None,
                                 points=lambda a: [{}], runners=lambda a: [Runner("r", lambda pt: Run({"valid": 0.0}))],
                                 notes=lambda records, a: ["\n- object 0: does not validate"], failed=lambda a: True)
    monkeypatch.setattr(bench_main, "case_module", lambda name: fake)
    assert bench_main.main(["json_schema", "-r", "1"]) == 1
    assert "- object 0: does not validate" in capsys.readouterr().out


def test_the_objects_span_the_schemas():
    cs = schemas.objects()
    assert len(cs) == len(schemas.SCHEMAS) * len(schemas.PROMPTS) == 50 and len({c.prompt for c in cs}) == 50
    assert [c.subject for c in cs[:3]] == [s for s, _ in schemas.SCHEMAS[:3]]
    assert all(json.dumps(c.schema) in c.prompt for c in cs)


def test_a_broken_schema_is_one_line(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"subject": "thing", "schema": {"type": "foo"}}]))
    r = subprocess.run([sys.executable, "-m", "guild.bench", "json_schema", "--schemas", str(bad)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.startswith(f"error: --schemas {bad}: item 0 (thing): not a valid JSON Schema") and \
        r.stderr.count("\n") == 1


def test_a_schema_llguidance_cannot_compile_names_it(tmp_path, capsys, dense_path):
    (tmp_path / "lb.json").write_text(json.dumps([{"subject": "tag", "schema": {"type": "string",
                                                                                 "pattern": "(?<=a)b"}}]))
    assert bench_main.main(["json_schema", "--model", "smollm2-135m", "--objects", "1", "--strategies", "normal",
                            "--workload", "", "--schemas", str(tmp_path / "lb.json")]) == 2
    assert capsys.readouterr().err.startswith("error: schema 0 (tag): ")
