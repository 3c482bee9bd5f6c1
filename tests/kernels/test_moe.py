"""The MoE FFN kernel against its NumPy twin, and row invariance across windows."""

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf.quants import quantize

from guild.kernels import ref
from guild.kernels.cpu.moe import moe_ffn, route_groups
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
