"""The scale case on a tiny model: the 128-expert tag registered; the first load repacks (its cache removed), the
second reads the cache (and without one says so), the run's decode and V(T) by T; each runner in a fresh child
with the memory it added (rss_added_mb); no llama.cpp runner without llama-cpp-python."""

import json
import os
import subprocess
import sys

import pytest

import guild.upcycle as up
from guild.bench import runners as R
from guild.bench.cases import scale
from guild.bench.main import case_module, parser
from guild.errors import GuildError
from guild.tools.tiny import write_tiny_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("scale")
    return str(write_tiny_model(d / "m.gguf", "llama", n_experts=8, top_k=2, qtype="Q4_0", context=2048, vocab=512))


def _args(tiny, *more):
    a = parser("scale", case_module("scale")).parse_args(["--model", tiny, "-n", "4", "--repeats", "1", "-t", "1",
                                                          *more])
    a.notices = []
    scale.check(a)
    return a


def test_scale_tag_is_registered():
    assert up.MOE_TAGS[up.TAG_MOE128] == (128, 8) and up.TAG_MOE128 in up.TAGS
    assert up.moe_cache_path(up.TAG_MOE128).name == "smollm2-135m-moe128.gguf"
    assert up.moe_cache_path().name == up.MOE_FILENAME


def test_loads_and_run_in_process(tiny, monkeypatch, tmp_path):
    monkeypatch.setenv("GUILD_CACHE_DIR", str(tmp_path / "c"))
    a = _args(tiny, "--no-llama")
    rs = {r.name: r for r in scale.runners(a)}
    assert list(rs) == ["guild first load", "guild second load", "guild"]
    with pytest.raises(GuildError, match="second load found the repack cache built"):
        rs["guild second load"].measure({})
    for name in ("guild first load", "guild first load", "guild second load"):  # the first load removes the cache
        assert rs[name].measure({}).figures["load_s"] > 0
    run = rs["guild"].measure({})
    assert len(run.tokens) == 4 and sorted(run.figures["window_ms"]) == list(range(1, 9))
    assert run.figures["window_ratio"][1] == 1.0 and all(1 <= v <= 8 for v in run.figures["distinct_experts"].values())


def test_no_llama_runner_without_llama_cpp_and_it_says_so(tiny, monkeypatch):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)
    monkeypatch.setattr(R.importlib.util, "find_spec", lambda name: None)
    a = _args(tiny)
    assert "llama.cpp" not in [r.name for r in scale.runners(a)] and a.notices == [R.NO_LLAMA_CPP]


@pytest.mark.slow
def test_every_runner_in_a_child_with_the_memory_it_added(tiny, tmp_path):
    p = subprocess.run([sys.executable, "-m", "guild.bench", "scale", "--model", tiny, "-n", "4", "--repeats", "1",
                        "-t", "1", "--no-llama", "--json"], capture_output=True, text=True, timeout=600,
                       env={**os.environ, "GUILD_CACHE_DIR": str(tmp_path / "c")})
    assert p.returncode == 0, p.stderr
    recs = [json.loads(line) for line in p.stdout.splitlines()]
    assert [r["runner"] for r in recs] == ["guild first load", "guild second load", "guild"]
    assert all(r["figures"]["rss_added_mb"]["median"] > 0 and r["commit"] and r["host"] for r in recs)
