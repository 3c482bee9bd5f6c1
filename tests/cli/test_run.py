"""`guild run` end to end on the embedded models: streamed text, stats, --json."""

import json
import subprocess
import sys

import numpy as np
import pytest

from guild.cli.run import run
from guild.engine.options import DecodeOptions
from guild.engine.session import GuildSession

pytestmark = pytest.mark.slow


def test_run_json_matches_session(dense_path, dense_model):
    r = subprocess.run(
        [sys.executable, "-m", "guild", "run", "smollm2-135m", "-p", "The capital of France is", "-n", "8",
         "-t", "1", "--device", "cpu", "--json"],
        capture_output=True, text=True, timeout=600,
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["generated_tokens"] == len(out["tokens"]) == 8 and out["prompt_tokens"] == 5
    assert out["text"].startswith(" Paris")
    for key in ("prefill_tok_s", "decode_tok_s", "ms_per_token", "threads", "load_ms", "ttft_ms"):
        assert out[key] > 0
    # the same greedy stream as the library's session
    s = GuildSession(dense_model, n_ctx=64)
    toks, _ = s.generate([504, 3575, 282, 4649, 314], 8)
    assert toks == out["tokens"]


def test_run_streams_and_stops_at_eos(moe_path):
    pieces = []
    res = run("smollm2-135m-moe", ["Say hi."], chat=True, opts=DecodeOptions(max_tokens=48), threads=2,
              on_text=pieces.append)
    assert res.text == "".join(pieces) and res.text.strip()
    assert res.stats.stop_reason in ("eos", "max_tokens")
    if res.stats.stop_reason == "eos":
        assert res.tokens[-1] in (0, 2)


def test_chunked_prefill_equals_one_chunk(dense_model, dense_path, monkeypatch):
    """A 100-row prompt fed as one chunk, or in chunks of 64, 8 and 7 rows. The default int8 numerics have one
    kernel for every row count: all bitwise equal. Under f32, chunks of more than ROW_INVARIANT_ROWS (64) rows
    take the BLAS prefill path: deterministic and within 1e-3 of the row-by-row kernels but not bitwise, while
    every chunking of at most 64 rows is bitwise equal (docs/contracts.md "Row invariance")."""
    from guild.kernels.cpu import quant
    from guild.models import load_model

    ids = np.arange(100, 200)

    def last_logits(model, chunk):
        return GuildSession(model, n_ctx=128, prefill_batch=chunk).prefill(ids)

    i8 = {c: last_logits(dense_model, c) for c in (512, 64, 8, 7)}
    for c in (64, 8, 7):
        assert np.array_equal(i8[c], i8[512]), c
    blas_calls = []
    part = quant._prefill_part
    monkeypatch.setattr(quant, "_prefill_part", lambda *a: blas_calls.append(1) or part(*a))
    with quant.numerics("f32"):
        f32 = load_model(dense_path)
    one = last_logits(f32, 512)
    assert blas_calls  # the 100-row chunk took the BLAS path
    assert np.array_equal(one, last_logits(f32, 512))  # deterministic
    n = len(blas_calls)
    rows = {c: last_logits(f32, c) for c in (64, 8, 7)}
    assert len(blas_calls) == n  # chunks of <= 64 rows never do
    for c in (8, 7):
        assert np.array_equal(rows[c], rows[64]), c
    assert int(np.argmax(one)) == int(np.argmax(rows[64]))
    assert np.abs(one - rows[64]).max() < 1e-3 * np.abs(one).max()


def test_run_sampling_flags_are_reproducible(dense_path, threads):
    """The same seed, the same tokens: in a process of its own and again in this one (whose earlier tests have
    sampled before), so no state the process carries changes them."""
    from typer.testing import CliRunner

    from guild.cli import app

    args = ["run", "smollm2-135m", "-p", "Once upon a time", "-n", "12", "-t", "2", "--temperature", "0.8",
            "--top-k", "40", "--top-p", "0.9", "--repeat-penalty", "1.1", "--seed", "7", "--json"]
    r = subprocess.run([sys.executable, "-m", "guild", *args], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 0, (again.output, again.exception)
    a, b = json.loads(r.stdout), json.loads(again.stdout)
    assert a["tokens"] == b["tokens"] and a["seed"] == 7


def test_bad_grammar_file_fails_before_the_model_loads(tmp_path):
    """The file is checked before the load (a missing model would fail otherwise); a grammar whose special tokens
    only the vocabulary can check passes that check."""
    from typer.testing import CliRunner

    from guild.cli import app
    from guild.text.options import TextOptions

    (tmp_path / "bad.lark").write_text("start: ((")
    r = CliRunner().invoke(app, ["run", str(tmp_path / "missing.gguf"), "-p", "x", "--grammar",
                                 str(tmp_path / "bad.lark")])
    assert r.exit_code == 1 and r.stderr.startswith(f"error: --grammar {tmp_path / 'bad.lark'}: "), r.stderr
    (tmp_path / "special.lark").write_text('start: "yes" <|im_end|>')
    assert TextOptions(grammar=str(tmp_path / "special.lark")).compile(None).kind == "lark"


def test_bad_numerics_is_one_line():
    r = subprocess.run([sys.executable, "-m", "guild", "run", "smollm2-135m", "-p", "x", "--numerics", "int4"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.strip() == "error: --numerics must be i8 or f32, not 'int4'"


def test_bad_sampling_flag_is_one_line():
    r = subprocess.run([sys.executable, "-m", "guild", "run", "smollm2-135m", "-p", "x", "--top-p", "2"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.strip().startswith("error:") and "--top-p" in r.stderr


def test_run_json_schema_and_grammar_files(tmp_path, threads):
    """`--json-schema FILE`: the reply is an object of that schema, every strategy alike; a file that is not a schema
    or a grammar that does not compile is one line, exit 1. In-process (the flags' output is under test; the
    other tests here run the whole program)."""
    from typer.testing import CliRunner

    from guild.cli import app

    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 16},
                                               "population": {"type": "integer", "minimum": 0}},
              "required": ["city", "population"], "additionalProperties": False}
    (tmp_path / "s.json").write_text(json.dumps(schema))
    (tmp_path / "bad.json").write_text('{"type":')
    (tmp_path / "bad.lark").write_text("start: ((")

    def once(*flags):
        prompt = "A big city and its population, as JSON."
        return CliRunner().invoke(app, ["run", "smollm2-135m", "--chat", "-p", prompt,
                                        "-n", "40", "--device", "cpu", "--context", "256", *flags])

    outs = [once("--json-schema", str(tmp_path / "s.json"), "--json", "--decode-strategy", s) for s in
            ("normal", "lookup")]
    for r in outs:
        assert r.exit_code == 0, (r.output, r.exception)
    a, b = (json.loads(r.stdout) for r in outs)
    assert a["stop_reason"] == "eos" and a["tokens"] == b["tokens"]
    obj = json.loads(a["text"])
    assert set(obj) == {"city", "population"} and isinstance(obj["population"], int)
    for flag, f, why in (("--json-schema", "bad.json", "Expecting value"), ("--grammar", "bad.lark", "")):
        r = once(flag, str(tmp_path / f))
        # exit 1 through SystemExit: any other exception would have been a traceback
        assert r.exit_code == 1 and type(r.exception) is SystemExit and len(r.stderr.strip().splitlines()) == 1
        assert r.stderr.startswith(f"error: {flag} {tmp_path / f}: {why}"), r.stderr
