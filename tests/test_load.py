"""guild.load: the warm-up at load leaves a chat prompt's first request nothing to compile, load or import; on a
cold kernel cache a helper process compiles the prompt windows' kernels (guild.warmup)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from guild import warmup

# in a fresh process: another test may already have compiled what the warm-up should
_SCRIPT = """
import json, sys
from tests.helpers.first_use import read_from_cache, since, snapshot, watch
watch()
from guild.load import load
from guild.speculative.options import MtpOptions

lm = load(sys.argv[1], threads=2, progress=False)
lm.warm_up("normal", MtpOptions())
before = snapshot()
tok = lm.tokenizer
ask = [{"role": "user", "content": "Why is the sky blue during the day, and red at sunset?"}]
ids = tok.encode(tok.apply_chat_template(ask), add_special=True)
lm.session(512).generate(ids, 4)
print(json.dumps({"prompt": len(ids), **since(before), "helper": lm.compile_helper, "read": read_from_cache()}))
"""


@pytest.mark.parametrize("cold", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["warm", "cold"])
def test_warm_up_covers_a_chat_prompts_first_request(moe_path, cold, tmp_path):
    env = {**os.environ, "GUILD_COMPILE_HELPER": "1" if cold else "0"}
    if cold:  # an empty kernel cache: the helper compiles the windows' kernels while this process the rest
        env["NUMBA_CACHE_DIR"] = str(tmp_path)
    p = subprocess.run([sys.executable, "-c", _SCRIPT, moe_path], capture_output=True, text=True, timeout=600,
                       cwd=Path(__file__).parents[1], env=env)
    assert p.returncode == 0, p.stderr[-2000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got["prompt"] >= 40 and got["kernels"] == []
    assert got["compiled"] == 0 and got["modules"] == []  # the chat template was compiled at load
    if cold:
        assert got["helper"] is True  # it ran and finished cleanly
        # the loader read the prompt window's row-parallel ops from the helper (its whole-step call, compiled
        # meanwhile, takes the window passes too: whichever process gets there first compiles them)
        prompt = {"guild.kernels.cpu.ops.rows.rmsnorm_parallel"}
        assert prompt <= set(got["read"]["hit"]) and not prompt & set(got["read"]["missed"]), got["read"]
        assert set(got["read"]["missed"]) & {"guild.kernels.cpu.ops.gqa.attention",
                                             "guild.kernels.cpu.ops.gqa_row.attention_row"}, got["read"]
    else:
        assert got["helper"] is None


class _Helper:
    """A CompileHelper that records what the loader asks of it."""

    calls: list = []

    @classmethod
    def start(cls, *args):
        _Helper.calls.append(("start", args))
        return cls()

    def wait(self):
        _Helper.calls.append("wait")
        return 0

    def close(self):
        _Helper.calls.append("close")


def test_warm_up_starts_waits_for_and_closes_the_helper(moe_path, monkeypatch):
    from guild.load import load
    from guild.speculative.options import MtpOptions

    lm = load(moe_path, threads=1, progress=False)
    ran = []
    session = lm.session
    monkeypatch.setattr(lm, "session", lambda n: ran.append(("session", n)) or session(n))
    monkeypatch.setattr(warmup, "helper_wanted", lambda device, weights: (device, weights) == ("cpu", lm.weights))
    monkeypatch.setattr(warmup, "CompileHelper", _Helper)
    _Helper.calls = []
    lm.warm_up("normal", MtpOptions())
    assert _Helper.calls == [("start", (lm.path, lm.numerics, "f32", "f32", 1)), "wait", "close"]
    assert lm.compile_helper is True and ran == [("session", 64), ("session", 64)]
    _Helper.calls = []
    monkeypatch.setattr(lm, "session", lambda n: 1 / 0)  # a warm-up that fails still stops its helper
    with pytest.raises(ZeroDivisionError):
        lm.warm_up("normal", MtpOptions())
    assert _Helper.calls[-1] == "close"


@pytest.mark.parametrize("env,cpus,device,weights,cold,wanted", [
    ("1", 2, "cpu", "cache", True, True), ("1", 2, "cpu", "built", True, True),
    ("0", 2, "cpu", "cache", True, False),  # switched off
    ("1", 1, "cpu", "cache", True, False),  # no second core
    ("1", 2, "cuda", "cache", True, False),  # the GPU runs the model: other kernels
    ("1", 2, "cpu", "memory", True, False),  # the helper would repack its own copy
    ("1", 2, "cpu", "streamed", True, False),  # a model larger than memory: its experts read once, by the loader
    ("1", 2, "cpu", "cache", False, False),  # nothing to compile
])
def test_a_helper_starts_only_where_it_pays(monkeypatch, env, cpus, device, weights, cold, wanted):
    monkeypatch.setenv(warmup.HELPER_ENV, env)
    monkeypatch.setattr(os, "cpu_count", lambda: cpus)
    monkeypatch.setattr(warmup, "kernels_cold", lambda: cold)
    assert warmup.helper_wanted(device, weights) is wanted


def test_the_loader_says_where_the_weights_are(moe_path):
    from guild.load import load

    assert load(moe_path, threads=1, progress=False, expert_cache="off").weights in ("cache", "built")
    streamed = load(moe_path, threads=1, progress=False, expert_cache=1 << 30)  # experts through an expert cache
    assert streamed.weights == "streamed"
    streamed.model.expert_cache.close()


def test_a_helper_that_cannot_start_leaves_the_loader_to_compile(monkeypatch):
    def no_process(*args, **kwargs):
        raise OSError("no such file")

    monkeypatch.setattr(warmup.subprocess, "Popen", no_process)
    assert warmup.CompileHelper.start("m.gguf", "i8", "f32", "f32", 2) is None
