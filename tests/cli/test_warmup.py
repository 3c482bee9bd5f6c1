"""`guild warmup`: a model's kernels compiled (or found compiled) ahead of its first run, said in one line or as
JSON; bad flags are one-line errors."""

import json

import pytest
from typer.testing import CliRunner

from guild.cli import app


def _warmup(*args, env=None):
    return CliRunner().invoke(app, ["warmup", *args], env={"GUILD_COMPILE_HELPER": "0", **(env or {})})


def test_json_reports_the_model_and_seconds(moe_path):
    r = _warmup(moe_path, "--threads", "1", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["model"] == moe_path and out["threads"] == 1 and out["numerics"] == "i8"
    assert out["seconds"] > 0 and isinstance(out["compiled"], bool)
    assert out["helper"] is None and out["kv"] == {"k": "f32", "v": "f32"}  # GUILD_COMPILE_HELPER=0


def test_a_warm_cache_is_said_in_one_line(moe_path):
    assert _warmup(moe_path, "--threads", "1").exit_code == 0
    r = _warmup(moe_path, "--threads", "1")  # compiled by the run before (or earlier): read from the cache
    assert r.exit_code == 0 and r.stdout.strip().endswith(" s"), r.output
    assert "kernels already compiled; loaded in" in r.stdout


@pytest.mark.parametrize("args,says", [
    (["--part", "half"], "--part must be one of all, window"),
    (["-ctk", "q9"], "--cache-type-k must be one of"),
    (["--numerics", "f16"], "--numerics must be"),
    (["--decode-strategy", "fast"], "decode-strategy"),
])
def test_bad_flags_are_one_line_errors(moe_path, args, says):
    r = _warmup(moe_path, *args)
    assert r.exit_code == 1 and says in r.stderr and r.stderr.count("\n") == 1, r.output
