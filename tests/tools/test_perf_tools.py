"""The bench-full tools that cannot run in full here: the scale benchmark (perf_scale: its probes and
report on a tiny model) and the llama.cpp quantizer comparison (quant_compare: everything but llama.cpp)."""

from __future__ import annotations

import sys

import numpy as np
import pytest

import guild.upcycle as up
from guild.tools import perf_scale, quant_compare
from guild.tools.tiny import write_tiny_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("perf_tools")
    return str(write_tiny_model(d / "m.gguf", "llama", n_experts=8, top_k=2, qtype="Q4_0", context=2048,
                                vocab=512))


def test_scale_tag_is_registered():
    assert up.MOE_TAGS[up.TAG_MOE128] == (128, 8) and up.TAG_MOE128 in up.TAGS
    assert up.moe_cache_path(up.TAG_MOE128).name == "smollm2-135m-moe128.gguf"
    assert up.moe_cache_path().name == up.MOE_FILENAME


def test_scale_probes_and_report(tiny, monkeypatch, tmp_path):
    monkeypatch.setenv("GUILD_CACHE_DIR", str(tmp_path / "c"))
    loads = [perf_scale.probe_guild_load(tiny), perf_scale.probe_guild_load(tiny)]
    assert [ld["how"] for ld in loads] == ["built", "cache"]
    run = perf_scale.probe_guild_run(tiny, tokens=4, repeats=1, threads=1)
    assert len(run["tokens"]) == 4 and sorted(run["window_ms"]) == list(range(1, 9))
    assert all(1 <= v <= 8 for v in run["distinct_experts"].values())
    llama = {"load_s": 0.2, "load_peak_rss": 10**8, "threads": 1, "decode_tok_s": run["decode_tok_s"] / 2,
             "prefill_tok_s": 100.0, "tokens": run["tokens"], "peak_rss": 2 * 10**8}
    md = perf_scale.report(tiny, 10**6, loads, run, llama)
    assert "| guild | first (built) |" in md and "| guild | second (cache) |" in md and "| llama.cpp | mmap |" in md
    assert "decode: 2.00×" in md and "same greedy tokens: 4/4" in md and "| V(T)/V(1) | 1.00 |" in md
    assert "not measured" in perf_scale.report(tiny, 10**6, loads, run, None)


def test_llama_probe_without_llama_cpp(tiny, monkeypatch):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # `import llama_cpp` raises ImportError, installed or not
    assert quant_compare.llama_cpp_module() is None
    assert perf_scale.probe_llama(tiny, 4, 1, 1) is None
    assert quant_compare.main(["--types", "Q2_K"]) == 0  # says it skipped, writes nothing


def test_logit_stats():
    rng = np.random.default_rng(0)
    b = rng.normal(size=(6, 50)).astype(np.float32)
    s = quant_compare.logit_stats(b, b)
    assert s == {"rows": 6, "top1_agree": 1.0, "max_abs": 0.0, "rel_rms": 0.0}
    a = b.copy()
    a[0] = -a[0]
    s = quant_compare.logit_stats(a, b)
    assert s["top1_agree"] == pytest.approx(5 / 6) and s["max_abs"] > 0 and s["rel_rms"] > 0
    with pytest.raises(ValueError):
        quant_compare.logit_stats(a[:2], b)


def test_guild_side_and_compare(tiny):
    """The guild half of the comparison on a tiny model, compared with itself: all tokens agree, logits equal;
    the teacher-forced logits' argmax reproduces the greedy tokens."""
    runs = quant_compare.guild_side(tiny, ("hello world", "abc"), 5)
    for r in runs:
        assert len(r["tokens"]) == 5 and r["logits"].shape[0] == len(r["seq"]) == len(r["ids"]) + 4
        assert r["logits"][len(r["ids"]) - 1 :].argmax(1).tolist() == r["tokens"]
    c = quant_compare.compare(runs, [{"tokens": r["tokens"], "logits": r["logits"]} for r in runs])
    assert c["same_tokens"] == c["tokens"] == 10 and c["top1_agree"] == 1.0 and c["max_abs"] == 0.0
    assert "| Q2_K | 10/10 | 100.0% |" in quant_compare.table({"Q2_K": c})
    floor = {"top1_agree": 0.9, "max_abs": 1.0, "rel_rms": 0.03}  # llama.cpp's f16 KV against its f32 KV
    assert quant_compare.table({"Q2_K": {**c, "llama_f16_kv": floor}}).endswith("| 90.0%, 0.03 |")


def test_one_window_timing_routine_times_the_host_kernels(tiny, tmp_path):
    """guild.engine.timing: windows of every T, warm-up rounds unrecorded, the experts' and the recurrence's
    time from the host's clock (detached afterwards), the state where it was unless the commit keeps rows; and
    the benchmarks' window costs built on it run."""
    from guild.engine.backends import HOST
    from guild.engine.timing import time_windows
    from guild.models import load_model
    from guild.tools import perf, perf_hybrid
    from guild.tools.tiny_hybrid import write_tiny_hybrid

    m = load_model(tiny)
    st = m.new_state(64)
    m.forward(np.arange(8), st)
    st.commit(8)
    t = time_windows(m, st, lambda r, T: np.arange(r, r + T), [1, 3], 2, warmup=1, rotate=True, clock=True)
    assert st.pos == 8 and HOST.clock is None
    for T in (1, 3):
        assert len(t.forward_ms[T]) == len(t.commit_ms[T]) == len(t.distinct[T]) == 2
        assert all(0 < e < f for e, f in zip(t.kernel("experts", T), t.forward_ms[T], strict=True))
        assert t.window_ms(T)[0] == t.forward_ms[T][0] + t.commit_ms[T][0]
    time_windows(m, st, lambda r, T: np.arange(T), [2], 1, keep=lambda T: T)
    assert st.pos == 10
    ms, distinct = perf.window_costs(m, list(range(16)), repeats=1, max_T=3)
    assert set(ms) == set(distinct) == {1, 2, 3} and all(v > 0 for v in ms.values())

    h = load_model(str(write_tiny_hybrid(tmp_path / "h.gguf", seed=2)))
    w = perf_hybrid.window_costs(h, 1, np.random.default_rng(0))
    assert all(0 < w["recurrence_ms"][T] < w["V_ms"][T] for T in range(1, 9))
    assert set(w["rollback_T5"]["replay"]["commit_ms"]) == {1, 2, 3, 4, 5}


def test_the_per_op_split_of_a_window_sums_within_it(tiny, tmp_path):
    """time_windows(ops=True) runs the forward on TimedBackends: the same logits bit for bit, every op the
    forward calls on the clock, the ops' and experts' ms summing to less than the forward (the rest is the
    Python between them), nested spans counted once; perf.python_share reports that rest and the split."""
    from guild.engine.backends import HOST, KernelClock
    from guild.engine.timing import time_windows
    from guild.models import load_model
    from guild.tools import perf
    from guild.tools.tiny_hybrid import write_tiny_hybrid

    c = KernelClock()
    with c.span("outer"):
        with c.span("inner"):
            pass
        c.timed("op", lambda: None)()
    assert set(c.seconds) == {"outer"}

    m = load_model(tiny)
    outs = {}
    for ops in (False, True):
        st = m.new_state(64)
        m.forward(np.arange(8), st)
        st.commit(8)
        t = time_windows(m, st, lambda r, T: np.arange(r, r + T), [1, 4], 2, keep=lambda T: T, ops=ops,
                         after=lambda out, w, T, ops=ops: outs.setdefault(ops, []).append(out.logits.copy()))
        assert HOST.clock is None and st.pos == 8 + 2 * 5
    assert all(np.array_equal(a, b) for a, b in zip(outs[False], outs[True], strict=True))
    for T in (1, 4):
        for k, f in zip(t.kernel_ms[T], t.forward_ms[T], strict=True):
            assert {"matmul", "attention", "rmsnorm", "experts"} <= set(k) and all(v > 0 for v in k.values())
            assert 0 < sum(k.values()) < f
    assert all(x == sum(k.values()) for x, k in zip(t.kernels_total(1), t.kernel_ms[1], strict=True))

    share, op_ms = perf.python_share(m, list(range(16)), steps=4)
    assert 0 < share < 1 and {"matmul", "experts"} <= set(op_ms)

    h = load_model(str(write_tiny_hybrid(tmp_path / "h.gguf", seed=2)))
    st = h.new_state(64)
    t = time_windows(h, st, lambda r, T: np.arange(T), [3], 2, ops=True)
    for k, f in zip(t.kernel_ms[3], t.forward_ms[3], strict=True):
        assert k["gdn_recurrence"] > 0 and k["experts"] > 0 and sum(k.values()) < f


def test_machine_peaks_are_rates_a_cpu_can_reach():
    """The peak loops really run: a rate a compiler folded away reads in the tens of thousands of G/s."""
    from guild.tools.perf import machine_peaks

    p = machine_peaks(1, repeats=3)  # the best of three: a folded loop's rate is only bounded by the clock
    assert 0 < p["fp32_gmacs"] < 1000 and 0 < p["int8_gmacs"] < 3000 and p["copy_gbs"] > 0
