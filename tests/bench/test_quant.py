"""The quant case without llama.cpp's side: the logit statistics, guild's greedy tokens and teacher-forced logits on
a tiny model compared with themselves, the records' table, and a run without llama-cpp-python (says so, exit 0)."""

import sys

import numpy as np
import pytest

from guild.bench import main as bench_main
from guild.bench import output
from guild.bench.cases import quant
from guild.bench.harness import Run, aggregate
from guild.bench.record import Record
from guild.tools.tiny import write_tiny_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("quant")
    return str(write_tiny_model(d / "m.gguf", "llama", n_experts=8, top_k=2, qtype="Q4_0", context=2048, vocab=512))


def test_logit_stats():
    rng = np.random.default_rng(0)
    b = rng.normal(size=(6, 50)).astype(np.float32)
    assert quant.logit_stats(b, b) == {"agreement": 1.0, "max_abs": 0.0, "rel_rms": 0.0}
    a = b.copy()
    a[0] = -a[0]
    s = quant.logit_stats(a, b)
    assert s["agreement"] == pytest.approx(5 / 6) and s["max_abs"] > 0 and s["rel_rms"] > 0
    with pytest.raises(ValueError):
        quant.logit_stats(a[:2], b)


def test_guild_side_and_compare(tiny):
    """guild's side on a tiny model, compared with itself: all tokens agree, logits equal; the teacher-forced
    logits' argmax reproduces the greedy tokens; the records' table shows the figures."""
    runs = quant.guild_side(tiny, ("hello world", "abc"), 5)
    for r in runs:
        assert len(r["tokens"]) == 5 and r["logits"].shape[0] == len(r["seq"]) == len(r["ids"]) + 4
        assert r["logits"][len(r["ids"]) - 1:].argmax(1).tolist() == r["tokens"]
    c = quant.compare(runs, [{"tokens": r["tokens"], "logits": r["logits"]} for r in runs])
    assert c == {"same_tokens": 1.0, "agreement": 1.0, "max_abs": 0.0, "rel_rms": 0.0}
    floor = {"same_tokens": 0.5, "agreement": 0.9, "max_abs": 1.0, "rel_rms": 0.03}  # f16 KV against f32 KV
    md = output.markdown([Record("quant", {"type": "Q2_K"}, "guild vs llama.cpp", aggregate([Run(c)])),
                          Record("quant", {"type": "Q2_K"}, "llama.cpp f16 KV vs f32 KV", aggregate([Run(floor)]))])
    assert "| type=Q2_K | guild vs llama.cpp | 1 | 0 | 0 | 1 |" in md
    assert "| type=Q2_K | llama.cpp f16 KV vs f32 KV | 0.9 | 1 | 0.03 | 0.5 |" in md


def test_without_llama_cpp_it_says_so_and_exits_0(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # `import llama_cpp` raises ImportError, installed or not
    assert bench_main.main(["quant", "--types", "Q2_K"]) == 0
    assert "llama.cpp: not measured" in capsys.readouterr().out
