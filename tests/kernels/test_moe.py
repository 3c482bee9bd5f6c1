"""The MoE FFN kernel against its NumPy twin, and row invariance across windows."""

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf.quants import quantize

from guild.kernels import ref, ref_quant
from guild.kernels.cpu.moe import moe_ffn, route_groups
from guild.kernels.cpu.qdot import act_group
from guild.kernels.cpu.quant import dequantize, pack
from guild.kernels.quant_types import act_block

E, D, F = 6, 64, 96


@pytest.fixture(scope="module")
def experts():
    rng = np.random.default_rng(7)
    router = rng.standard_normal((E, D)).astype(np.float32)
    gate = (rng.standard_normal((E, F, D)) * 0.2).astype(np.float32)
    up = (rng.standard_normal((E, F, D)) * 0.2).astype(np.float32)
    down = (rng.standard_normal((E, D, F)) * 0.2).astype(np.float32)
    gu = [pack(Q.Q8_0, quantize(np.concatenate([gate[e], up[e]]), Q.Q8_0), 2 * F, D) for e in range(E)]
    dn = [pack(Q.Q8_0, quantize(down[e], Q.Q8_0), D, F) for e in range(E)]
    r = pack(Q.F32, router, E, D)
    # the twin sees exactly the weights the kernel uses (dequantised)
    g_ = np.stack([dequantize(p)[:F] for p in gu])
    u_ = np.stack([dequantize(p)[F:] for p in gu])
    d_ = np.stack([dequantize(p) for p in dn])
    return r, gu, dn, (router, g_, u_, d_)


@pytest.mark.parametrize("k, renorm", [(2, True), (3, False)])
def test_moe_matches_twin(experts, k, renorm):
    r, gu, dn, dense = experts
    h = np.random.default_rng(1).standard_normal((8, D)).astype(np.float32)
    out = np.empty_like(h)
    n = moe_ffn(h, r, gu, dn, k, renorm, out)
    acts = (act_block(gu[0].qtype), act_block(dn[0].qtype)) if gu[0].numerics == "i8" else None
    want = ref.moe_ffn(h, *dense, k, renorm, acts=acts)
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    ids, _ = ref.softmax_topk(h @ dense[0].T, k, renorm)
    assert n == np.unique(ids).size


def test_moe_rows_do_not_depend_on_neighbours(experts):
    r, gu, dn, _ = experts
    rng = np.random.default_rng(2)
    h = rng.standard_normal((8, D)).astype(np.float32)
    full = np.empty_like(h)
    moe_ffn(h, r, gu, dn, 2, True, full)
    for T in range(1, 8):
        other = rng.standard_normal((T, D)).astype(np.float32)
        other[0] = h[3]
        part = np.empty_like(other)
        moe_ffn(other, r, gu, dn, 2, True, part)
        assert np.array_equal(part[0], full[3])


def test_route_groups_is_a_stable_sort_by_expert():
    rng = np.random.default_rng(3)
    ids = np.stack([rng.choice(8, 3, replace=False) for _ in range(7)]).astype(np.int64)  # [T=7, k=3]
    h = rng.standard_normal((7, 5)).astype(np.float32)
    order, offs, eids, x = np.empty(21, np.int64), np.empty(9, np.int64), np.empty(8, np.int64), np.empty((21, 5),
                                                                                                           np.float32)
    n = route_groups(ids, h, order, offs, eids, x)
    want = np.argsort(ids.ravel(), kind="stable")
    assert np.array_equal(order, want)
    assert np.array_equal(eids[:n], np.unique(ids)) and offs[n] == 21
    for g in range(n):
        assert (ids.ravel()[order[offs[g] : offs[g + 1]]] == eids[g]).all()
    assert np.array_equal(x, h[order // 3])
    with pytest.raises(ValueError):  # an id outside the layer's experts (a corrupt router) never indexes memory
        route_groups(np.array([[8]], np.int64), h[:1], order[:1], offs, eids, x[:1])


@pytest.mark.parametrize("gu_type, dn_type", [(Q.Q4_K, Q.Q6_K), (Q.Q8_0, Q.Q4_0), (Q.IQ4_XS, Q.Q5_K)])
@pytest.mark.parametrize("T", [1, 2, 3])
@pytest.mark.parametrize("threads", [1, 2])
def test_owned_experts_give_the_two_launch_bits(gu_type, dn_type, T, threads):
    """The one-region path (each thread owns whole experts) against the two-launch path it stands in for: the
    same bits, and it really ran (it returns True); groups that split unevenly are refused, nothing written."""
    import numba

    from guild.kernels.cpu import moe

    De, Fe, Ee, k = 256, 256, 8, 4
    rng = np.random.default_rng(T)
    gu = [pack(gu_type, ref_quant.random_raw(gu_type, 2 * Fe, De, rng), 2 * Fe, De) for _ in range(Ee)]
    dn = [pack(dn_type, ref_quant.random_raw(dn_type, De, Fe, rng), De, Fe) for _ in range(Ee)]
    h = rng.standard_normal((T, De)).astype(np.float32)
    ids = np.stack([rng.choice(Ee, k, replace=False) for _ in range(T)]).astype(np.int64)
    w = rng.random((T, k)).astype(np.float32)
    order, offs, eids = np.empty(T * k, np.int64), np.empty(Ee + 1, np.int64), np.empty(Ee, np.int64)
    x = np.empty((T * k, De), np.float32)
    n = route_groups(ids, h, order, offs, eids, x)
    tg, td = moe.ExpertTable.of(gu), moe.ExpertTable.of(dn)
    bufs = [np.empty((T * k, 2 * Fe), np.float32), np.empty((T * k, Fe), np.float32), np.empty((T * k, De), np.float32)]
    before = numba.get_num_threads()
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    try:
        nth = numba.get_num_threads()
        got = np.full((T, De), np.nan, np.float32)
        ran = moe._experts_owned(tg.addr, tg.dims, td.addr, td.dims, eids[:n], offs[: n + 1], x, act_group(gu_type),
                                 act_group(dn_type), *bufs, order, w, got, nth)
        assert ran == (n % nth == 0 or n >= 8 * nth)
        uneven = np.full((T, De), np.nan, np.float32)  # one group fewer than the threads: refused
        assert nth == 1 or not moe._experts_owned(tg.addr, tg.dims, td.addr, td.dims, eids[: nth - 1],
                                                  offs[:nth], x, act_group(gu_type), act_group(dn_type), *bufs,
                                                  order, w, uneven, nth)
        assert nth == 1 or np.isnan(uneven).all()
        want = np.empty((T, De), np.float32)
        owned, moe._experts_owned = moe._experts_owned, lambda *a: False
        try:
            moe.experts_ffn(h, ids, w, gu, dn, want)
        finally:
            moe._experts_owned = owned
    finally:
        numba.set_num_threads(before)
    if ran:
        assert np.array_equal(got, want)


def test_one_row_moe_is_the_window_path_bit_for_bit(monkeypatch):
    """moe_ffn of one row takes the one-call path (router over two tiles on the threads, top-k, experts, combine)
    and gives, call after call, the bits of the path a window takes (router, softmax_topk, two expert launches)."""
    from guild.kernels.cpu import moe

    Ee, De, Fe, k = 128, 256, 256, 8
    rng = np.random.default_rng(11)
    router = pack(Q.F32, rng.standard_normal((Ee, De)).astype(np.float32), Ee, De)
    gu = [pack(Q.Q4_K, ref_quant.random_raw(Q.Q4_K, 2 * Fe, De, rng), 2 * Fe, De) for _ in range(Ee)]
    dn = [pack(Q.Q6_K, ref_quant.random_raw(Q.Q6_K, De, Fe, rng), De, Fe) for _ in range(Ee)]
    assert router.dims[0] == 2  # two tiles: the router runs in a parallel region inside the one call
    calls = []
    real = moe._moe_row
    monkeypatch.setattr(moe, "_moe_row", lambda *a: calls.append(1) or real(*a))
    for trial in range(12):
        h = rng.standard_normal((1, De)).astype(np.float32)
        got = [np.empty((1, De), np.float32) for _ in range(3)]
        for g in got:
            assert moe_ffn(h, router, gu, dn, k, True, g) == k
        logits = np.empty((1, Ee), np.float32)
        moe.matmul(router, h, logits)
        ids, w = np.empty((1, k), np.int64), np.empty((1, k), np.float32)
        moe.ops.softmax_topk(logits, k, True, ids, w)
        want = np.empty((1, De), np.float32)
        with monkeypatch.context() as m:
            m.setattr(moe, "_experts_owned", lambda *a: False)
            moe.experts_ffn(h, ids, w, gu, dn, want)
        for g in got:
            assert np.array_equal(g, want), trial
    assert len(calls) == 36
