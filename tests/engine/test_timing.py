"""guild.engine.timing on a tiny model: the one window-timing routine the benchmarks' window costs are built on
(guild.bench.runners.guild_windows), the per-op split of a window (the step case's Python share), and the
machine's peaks (guild.bench.peaks)."""

from __future__ import annotations

import numpy as np
import pytest

from guild.bench.cases.step import python_share
from guild.bench.runners import guild_windows
from guild.kernels.cpu.quant import GEMV_MAX_ROWS
from guild.tools.tiny import write_tiny_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("perf_tools")
    return str(write_tiny_model(d / "m.gguf", "llama", n_experts=8, top_k=2, qtype="Q4_0", context=2048,
                                vocab=512))


def test_one_window_timing_routine_times_the_host_kernels(tiny):
    """guild.engine.timing: windows of every T, warm-up rounds unrecorded, the experts' and the recurrence's
    time from the host's clock (detached afterwards), the state where it was unless the commit keeps rows; and
    the benchmarks' window costs built on it run (the hybrid case's: tests/bench/test_hybrid.py)."""
    from guild.engine.backends import HOST
    from guild.engine.timing import time_windows
    from guild.models import load_model

    m = load_model(tiny)
    st = m.new_state(64)
    m.forward(np.arange(8), st)
    st.commit(8)
    t = time_windows(m, st, lambda r, T: np.arange(r, r + T), [1, 3], 2, warmup=1, rotate=True, clock=True)
    assert st.pos == 8 and HOST.clock is None
    for T in (1, 3):
        assert len(t.forward_ms[T]) == len(t.commit_ms[T]) == len(t.distinct[T]) == 2
        # a decode row's or a verification window's experts run inside its one call of every layer (DecodeStep),
        # which clocks them apart from the rest of the call
        for op in ("experts", "decode_layers") if T <= GEMV_MAX_ROWS else ("experts",):
            assert all(0 < e < f for e, f in zip(t.kernel(op, T), t.forward_ms[T], strict=True))
        assert t.window_ms(T)[0] == t.forward_ms[T][0] + t.commit_ms[T][0]
    time_windows(m, st, lambda r, T: np.arange(T), [2], 1, keep=lambda T: T)
    assert st.pos == 10
    ms, distinct = guild_windows(m, list(range(16)), repeats=1, max_T=3)
    assert set(ms) == set(distinct) == {1, 2, 3} and all(v > 0 for v in ms.values())


def test_the_per_op_split_of_a_window_sums_within_it(tiny, tmp_path):
    """time_windows(ops=True) runs the forward on TimedBackends: the same logits bit for bit, every op the
    forward calls on the clock, the ops' and experts' ms summing to less than the forward (the rest is the
    Python between them), nested spans counted once; the step case's python_share reports that rest and the split."""
    from guild.engine.backends import HOST, KernelClock
    from guild.engine.timing import time_windows
    from guild.models import load_model
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
        t = time_windows(m, st, lambda r, T: np.arange(r, r + T), [1, 12], 2, keep=lambda T: T, ops=ops,
                         after=lambda out, w, T, ops=ops: outs.setdefault(ops, []).append(out.logits.copy()))
        assert HOST.clock is None and st.pos == 8 + 2 * 13
    assert all(np.array_equal(a, b) for a, b in zip(outs[False], outs[True], strict=True))
    for T in (1, 12):
        for k, f in zip(t.kernel_ms[T], t.forward_ms[T], strict=True):
            # a decode row's layers are one call (DecodeStep: "decode_layers"); a prompt chunk's ops one by one
            want = {"matmul", "rmsnorm", "experts"} | ({"decode_layers"} if T == 1 else {"attention"})
            assert want <= set(k) and all(v > 0 for v in k.values())
            assert 0 < sum(k.values()) < f
    assert all(x == sum(k.values()) for x, k in zip(t.kernels_total(1), t.kernel_ms[1], strict=True))

    share, op_ms = python_share(m, list(range(16)), steps=4)
    assert 0 < share < 1 and {"matmul", "experts", "decode_layers"} <= set(op_ms)

    h = load_model(str(write_tiny_hybrid(tmp_path / "h.gguf", seed=2)))
    st = h.new_state(64)
    t = time_windows(h, st, lambda r, T: np.arange(T), [3], 2, ops=True)
    for k, f in zip(t.kernel_ms[3], t.forward_ms[3], strict=True):
        assert k["gdn_recurrence"] > 0 and k["experts"] > 0 and sum(k.values()) < f


def test_machine_peaks_are_rates_a_cpu_can_reach():
    """The peak loops really run: a rate a compiler folded away reads in the tens of thousands of G/s."""
    from guild.bench.peaks import machine_peaks

    p = machine_peaks(1, repeats=3)  # the best of three: a folded loop's rate is only bounded by the clock
    assert 0 < p["fp32_gmacs"] < 1000 and 0 < p["int8_gmacs"] < 3000 and p["copy_gbs"] > 0
    assert 0 < p["read_gbs"] < 2000  # a read the compiler dropped would take no time
