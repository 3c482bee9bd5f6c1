"""The rope flags on the command line: a prompt past the model's trained context runs (a one-line warning on
stderr), the flags stretch the rope and are recorded in --json, and a bad value is one line naming the flag."""

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from guild.cli import app
from guild.tools.tiny import write_tiny_model

PROMPT = "the quick brown fox jumps over the lazy dog, twice: the quick brown fox"  # 70 byte-level tokens


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return str(write_tiny_model(tmp_path_factory.mktemp("rope_cli") / "m.gguf", seed=3, context=32))


def _run(tiny, *flags):
    r = subprocess.run([sys.executable, "-m", "guild", "run", tiny, "-p", PROMPT, "-n", "8", "-c", "96", "-t", "1",
                        "--device", "cpu", "--json", *flags], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout), r.stderr


def test_context_past_the_trained_one_runs_with_a_warning(tiny):
    out, err = _run(tiny)
    assert out["prompt_tokens"] > 32 and out["generated_tokens"] == 8 and out["context"] == 96
    warned = [ln for ln in err.splitlines() if "--context 96" in ln]
    assert len(warned) == 1 and "past the 32 tokens" in warned[0], err
    assert out["rope"]["type"] == "none" and out["rope"]["factor"] == 1.0


def test_rope_flags_stretch_the_rope_and_are_recorded(tiny):
    out, err = _run(tiny, "--rope-scaling", "yarn", "--rope-scale", "4", "--rope-freq-base", "50000")
    assert "--context" not in err, err  # YaRN x4 covers 128 positions
    assert out["rope"] == {"freq_base": 50000.0, "type": "yarn", "factor": 4.0, "orig_ctx": 32, "attn_factor": 1.0,
                           "beta_fast": 32.0, "beta_slow": 1.0, "ext_factor": None}


@pytest.mark.parametrize("cmd", ["run", "serve", "bench"])
@pytest.mark.parametrize("flags, needle", [
    (["--rope-scaling", "ntk"], "--rope-scaling must be one of none, linear, yarn"),
    (["--rope-scale", "-2"], "--rope-scale must be finite and > 0"),
    (["--rope-scale", "2", "--rope-freq-scale", "0.5"], "give one"),
    (["--yarn-orig-ctx", "0"], "--yarn-orig-ctx must be >= 1"),
])
def test_bad_rope_flags_are_one_line(cmd, flags, needle):
    r = CliRunner().invoke(app, [cmd, "smollm2-135m", "-p", "x", *flags] if cmd == "run" else [cmd, *flags])
    assert r.exit_code == 1 and needle in r.output and len(r.output.strip().splitlines()) == 1, r.output
    assert "Traceback" not in r.output


def test_every_command_that_takes_a_context_lists_the_rope_flags():
    for cmd in ("run", "serve", "bench"):
        out = CliRunner().invoke(app, [cmd, "-h"], env={"COLUMNS": "200"}).stdout
        for flag in ("--rope-scaling", "--rope-scale", "--rope-freq-base", "--rope-freq-scale", "--yarn-orig-ctx"):
            assert flag in out, (cmd, flag)


def test_inspect_shows_the_rope_the_file_asks_for(tiny, tmp_path):
    from tests.fuzz import gguf_io as gi

    g = gi.parse(open(tiny, "rb").read())
    arch = g.get("general.architecture")[1].decode()
    for k, typ, v in (("rope.scaling.type", gi.STR, b"yarn"), ("rope.scaling.factor", gi.F32, 4.0),
                      ("rope.scaling.original_context_length", gi.U32, 16), ("rope.freq_base", gi.F32, 50000.0)):
        g.set(f"{arch}.{k}", typ, v)
    path = tmp_path / "yarn.gguf"
    path.write_bytes(gi.serialize(g))
    r = CliRunner().invoke(app, ["inspect", str(path), "--json"])
    assert r.exit_code == 0, r.output
    rope = json.loads(r.output)["rope"]
    assert rope["freq_base"] == 50000.0 and rope["type"] == "yarn" and rope["factor"] == 4.0
    assert rope["orig_ctx"] == 16
    r = CliRunner().invoke(app, ["inspect", tiny])
    assert r.exit_code == 0 and "scaling none" in r.output, r.output
    r = CliRunner().invoke(app, ["inspect", str(path)])
    assert "scaling yarn x4 from 16" in r.output, r.output
