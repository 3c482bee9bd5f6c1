"""The expert cache (guild.engine.experts) on the embedded MoE: bitwise the logits of the mapped model with a few
slots (misses, evictions, windows whose experts do not all fit at once), plain and speculative decoding; the
slots' memory within the bound; auto on only when the model does not fit; bad --expert-cache-mem values."""

from concurrent.futures import Future

import numpy as np
import pytest

from guild.engine import experts, memory
from guild.engine.experts import expert_cache_mem
from guild.engine.sampling import SamplingParams
from guild.engine.session import GuildSession
from guild.errors import BadFlagError
from guild.load import load
from guild.speculative.build import make_drafter
from tests.helpers.drafters import RandomDrafter

PROMPT = [1, 9690, 198, 2683, 253, 1345, 3084, 563, 4159, 30, 2, 198, 1, 520, 9531, 198]
N = 10


@pytest.fixture(scope="module")
def plain(moe_path):
    return load(moe_path, threads=2, progress=False, expert_cache="off").model


def _cached(moe_path, n_slots, drop_pages=False):
    """The embedded MoE with its experts served by a cache of n_slots slots. Reads stay in the page cache
    (drop_pages=False) unless a test is about dropping them: the tests check results, not the disk."""
    m = load(moe_path, threads=2, progress=False, expert_cache="off").model
    slot = experts.ExpertCache(load(moe_path, threads=2, progress=False, expert_cache="off").model, _rpk(m),
                               1 << 40, drop_pages=False).slot_bytes
    experts.attach(m, _rpk(m), n_slots * slot + slot // 2, drop_pages=drop_pages)
    assert m.expert_cache.n_slots == n_slots
    return m


class _Inline:
    """An executor that reads at once on the calling thread: a prefetch is complete before its layer asks for
    the experts, so hits, misses and evictions count the router's choices, not how fast the disk was."""

    def submit(self, fn, *args):
        f = Future()
        try:
            f.set_result(fn(*args))
        except BaseException as e:  # noqa: BLE001 - handed to the caller's future, as a pool does
            f.set_exception(e)
        return f

    def shutdown(self, *args, **kwargs):
        pass


def _rpk(model):
    from guild.formats.repack_cache import cache_path
    from guild.kernels.cpu import quant

    return cache_path(model.gguf.identity_digest(), quant.current_numerics())


def _recording(model):
    """Every forward's logits, copied as they come out."""
    seen, real = [], model.forward_batch

    def forward_batch(windows, last_only=False):
        res = real(windows, last_only)
        seen.append([r.logits.copy() for r in res])
        return res

    model.forward_batch = forward_batch
    return seen


def _generate(model, drafter=None, k=4):
    s = GuildSession(model, n_ctx=128, eos_ids=(0, 2))
    return s.generate(PROMPT, N, sampling=SamplingParams(), drafter=drafter, max_draft=k)


def _bitwise(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert len(x) == len(y)
        for u, v in zip(x, y, strict=True):
            assert u.shape == v.shape and np.array_equal(u.view(np.uint32), v.view(np.uint32))


@pytest.mark.slow
def test_few_slots_give_the_mapped_models_logits_plain_and_speculative(plain, moe_path):
    cached = _cached(moe_path, 5)  # 8 experts x 30 layers through 5 slots: a miss nearly every time
    c = cached.expert_cache
    batches = []
    real = c.batches

    def counting(L, eids):
        n = 0
        for b in real(L, eids):
            n += 1
            yield b
        batches.append(n)

    c.batches = counting
    want, got = _recording(plain), _recording(cached)
    truth, _ = _generate(plain)
    toks, _ = _generate(cached)
    assert toks == truth
    _bitwise(want, got)
    # speculative: windows of up to 5 rows, drafts both accepted and rejected
    want.clear(), got.clear()
    t1, st1 = _generate(plain, RandomDrafter(len(PROMPT), truth, seed=3))
    t2, st2 = _generate(cached, RandomDrafter(len(PROMPT), truth, seed=3))
    assert t1 == t2 == truth
    s = st2.summary()
    assert s["drafted"] > s["accepted"] > 0
    _bitwise(want, got)
    st = c.stats
    assert st.misses > 0 and st.evictions > 0 and st.hits > 0 and st.bytes_read > 0
    assert max(batches) > 1  # a window's union of experts larger than the slots ran in several batches
    assert c.resident_bytes <= c.bound


@pytest.mark.slow
def test_direct_reads_give_the_mapped_models_logits(plain, moe_path):
    cached = _cached(moe_path, 5, drop_pages=True)  # misses read with O_DIRECT: whole pages around each expert
    c = cached.expert_cache
    if c.direct_fd is None:
        pytest.skip("the test cache's file system refuses O_DIRECT")
    want, got = _recording(plain), _recording(cached)
    truth, _ = _generate(plain)
    toks, _ = _generate(cached)
    assert toks == truth and c.stats.reads > 0 and c.stats.drop_s == 0.0  # direct: no page cache to drop
    _bitwise(want, got)


@pytest.mark.slow
def test_prefetch_reads_ahead_and_its_experts_are_used(plain, moe_path):
    cached = _cached(moe_path, 120)
    cached.expert_cache.pool = _Inline()  # deterministic outcomes: every prefetch lands before it is needed
    want, got = _recording(plain), _recording(cached)
    truth, _ = _generate(plain)
    toks, _ = _generate(cached)
    assert toks == truth
    _bitwise(want, got)
    st = cached.expert_cache.stats
    assert st.prefetched > 0 and st.prefetch_used > 0 and st.hits > st.misses // 4
    assert st.misses == st.sync_reads  # no request found its prefetch still in flight


@pytest.mark.slow
def test_clear_empties_the_slots_and_the_next_run_reads_again(plain, moe_path):
    cached = _cached(moe_path, 120)
    c = cached.expert_cache
    truth, _ = _generate(plain)
    assert _generate(cached)[0] == truth
    reads = c.stats.reads
    c.clear()
    assert all(o is None for o in c.owner) and len(c.free) == c.n_slots and c.read_ms is None
    for L in c.layers.values():  # every expert back to the mapped file's addresses, no router history
        assert (L.slot_of == -1).all() and (L.addr_gu == L.gu.orig).all() and (L.addr_down == L.down.orig).all()
        assert L.rows == 0 and not L.chosen.any()
    assert c.cold_experts(4) == [0.0] * 4
    want, got = _recording(plain), _recording(cached)
    _generate(plain)
    assert _generate(cached)[0] == truth and c.stats.reads > reads  # read again, the same logits
    _bitwise(want, got)


@pytest.mark.slow
def test_window_union_growth_follows_consecutive_rows_then_measured_windows(moe_path):
    c = _cached(moe_path, 3).expert_cache
    assert c.growth(1) == 1.0 and c.growth(4) == 4.0  # nothing measured: rows share no expert
    k = c.top_k
    assert k % 2 == 0
    for _ in range(50):  # consecutive single rows share half their experts
        c.observe_union(1, np.arange(k), np.arange(k // 2, k // 2 + k))
    assert c.growth(1) == 1.0 and c.growth(3) == pytest.approx(2.0) and c.growth(5) == pytest.approx(3.0)
    for _ in range(500):  # windows of 3 rows measured at 2.5 rows' worth of experts
        c.observe_union(3, np.arange(5 * k // 2), None)
    assert 2.45 < c.growth(3) < 2.5 and c.growth(5) == pytest.approx(3.0)


@pytest.mark.slow
def test_adaptive_decoding_prices_the_cold_experts(plain, moe_path):
    """The session tells the adaptive scheduler the cold experts' read time per window size (the cache's
    non-resident experts weighted by the router's recent history); a cache that holds every expert has none."""
    truth, _ = _generate(plain)
    cached = _cached(moe_path, 7)
    d = make_drafter("adaptive")
    toks, _ = _generate(cached, d)
    assert toks == truth
    cold = cached.expert_cache.cold_experts(8)
    assert 0 < cold[0] < cold[1] < cold[7] and all(b >= a for a, b in zip(cold, cold[1:], strict=False))
    assert d.scheduler.costs.cold_ms[1] > d.scheduler.costs.cold_ms[0] > 0
    full = _cached(moe_path, 240)
    _generate(full)
    assert full.expert_cache.cold_experts(8) == [0.0] * 8 and full.expert_cache.stats.evictions == 0


@pytest.mark.slow
@pytest.mark.parametrize("n_slots", [1, 3, 17])
def test_slots_stay_within_the_bound(moe_path, n_slots):
    cached = _cached(moe_path, n_slots, drop_pages=True)
    c = cached.expert_cache
    GuildSession(cached, n_ctx=64).generate(PROMPT[:4], 2, sampling=SamplingParams())
    assert c.resident_bytes == c.mem.nbytes == n_slots * c.slot_bytes <= c.bound
    assert sum(o is not None for o in c.owner) == n_slots  # every slot used, none beyond
    assert c.slot_bytes >= max(L.slot_bytes for L in c.layers.values())
    c.close()


def test_a_bound_below_one_expert_is_refused(moe_path):
    with pytest.raises(BadFlagError, match="--expert-cache-mem: 4096 bytes hold no expert"):
        load(moe_path, threads=2, progress=False, expert_cache=4096)


def test_auto_is_off_when_the_model_fits(monkeypatch):
    monkeypatch.setattr(memory, "available_memory", lambda: 8 << 30)
    assert not experts.wanted("auto", 1 << 30)
    assert experts.wanted("auto", 7 << 30)
    assert experts.wanted(3 << 30, 1 << 30) and not experts.wanted("off", 64 << 30)


def test_flag_values():
    assert expert_cache_mem("auto") == "auto" and expert_cache_mem("OFF") == "off"
    assert expert_cache_mem("3G") == 3 << 30 and expert_cache_mem("512MiB") == 512 << 20
    assert expert_cache_mem("1.5g") == 3 << 29 and expert_cache_mem("4096") == 4096
    for bad in ("", "3X", "-1G", "0", "G", "3 GB extra", "iB"):
        with pytest.raises(BadFlagError, match="--expert-cache-mem must be"):
            expert_cache_mem(bad)


def test_bad_flag_value_is_one_line():
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "guild", "run", "smollm2-135m", "-p", "x", "--expert-cache-mem", "3X"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.strip() == "error: --expert-cache-mem must be auto, off or a size such as 3G or 512MiB, got '3X'"


def _spin_after(code: str, env: dict) -> str:
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "GOMP_SPINCOUNT"} | env
    out = subprocess.run([sys.executable, "-c", "import os\nfrom guild.engine import experts\n" + code +
                          "\nprint(experts.wait_passively(), os.environ.get('GOMP_SPINCOUNT'))"],
                         capture_output=True, text=True, env=env, check=True)
    return out.stdout.split()


def test_streaming_makes_the_kernel_threads_sleep_unless_they_already_spin():
    assert _spin_after("", {}) == ["True", "0"]  # before Numba's threads start: libgomp will read it
    assert _spin_after("", {"GOMP_SPINCOUNT": "5000"}) == ["False", "5000"]  # the user's setting stands
    assert _spin_after("import numba\nnumba.set_num_threads(1)", {}) == ["False", "None"]  # started: too late
