"""The row-wise ops (kernels/cpu/ops/rows.py) held to their NumPy twins (guild.kernels.ref)."""

import numpy as np
import pytest
from numba import njit

from guild.kernels import ref
from guild.kernels.cpu import ops
from guild.kernels.cpu.moe import combine_groups
from guild.kernels.rope import rope_tables

rng = np.random.default_rng(0)
TOL = dict(rtol=1e-5, atol=1e-5)


def test_rmsnorm():
    x = rng.standard_normal((5, 96)).astype(np.float32)
    w = rng.standard_normal(96).astype(np.float32)
    out = np.empty_like(x)
    ops.rmsnorm(x, w, 1e-6, out)
    np.testing.assert_allclose(out, ref.rmsnorm(x, w, 1e-6), **TOL)
    par = np.empty_like(x)
    ops.rmsnorm_parallel(x, w, 1e-6, par)  # prefill chunks: the same bits, rows over the threads
    assert np.array_equal(par, out)
    xh = x.reshape(5, 3, 32).copy()
    ops.rmsnorm_heads(xh, w[:32], 1e-6)
    np.testing.assert_allclose(xh, ref.rmsnorm(x.reshape(5, 3, 32), w[:32], 1e-6), **TOL)


@pytest.mark.parametrize("neox", [False, True])
@pytest.mark.parametrize("n_rot", [32, 16])
def test_rope(neox, n_rot):
    cos, sin = rope_tables(64, n_rot, 10000.0)
    x = rng.standard_normal((4, 3, 32)).astype(np.float32)
    pos = np.array([0, 5, 17, 63], np.int64)
    y = x.copy()
    ops.rope(y, pos, cos, sin, n_rot, neox)
    np.testing.assert_allclose(y, ref.rope(x, pos, cos, sin, n_rot, neox), **TOL)
    assert np.array_equal(y[..., n_rot:], x[..., n_rot:])  # partial rotary leaves the tail alone



def test_swiglu_combine_topk():
    gu = rng.standard_normal((3, 40)).astype(np.float32)
    out = np.empty((3, 20), np.float32)
    ops.swiglu(gu, out)
    np.testing.assert_allclose(out, ref.swiglu(gu), **TOL)

    logits = rng.standard_normal((6, 8)).astype(np.float32)
    logits[0, 3] = logits[0, 5]  # a tie resolves to the lower id
    for renorm in (False, True):
        ids = np.empty((6, 2), np.int64)
        w = np.empty((6, 2), np.float32)
        ops.softmax_topk(logits, 2, renorm, ids, w)
        rids, rw = ref.softmax_topk(logits, 2, renorm)
        assert np.array_equal(ids, rids)
        np.testing.assert_allclose(w, rw, **TOL)

    y = rng.standard_normal((6, 2, 10)).astype(np.float32)
    o = np.empty((6, 10), np.float32)
    perm = rng.permutation(12)  # grouped slots in any order: slot j holds (row, rank) pair perm[j]
    combine_groups(np.ascontiguousarray(y.reshape(12, 10)[perm]), perm.astype(np.int64), w, o)
    np.testing.assert_allclose(o, ref.combine_experts(y, w), **TOL)


@njit(cache=True)
def _expf_all(x, y):
    for j in range(x.size):
        y[j] = ops.expf(x[j])


def test_expf_and_fixed_sum():
    x = (rng.random(1000).astype(np.float32) - 1) * 80
    y = np.empty_like(x)
    _expf_all(x, y)
    # Cephes expf with fmas: within 2 ulp of exp(x) (x already float32, as in the kernels)
    np.testing.assert_allclose(y, ref.exp_shifted(x, 0.0), rtol=2.4e-7, atol=0)
    ends = np.array([-200.0, -87.0, 88.0, 200.0], np.float32)  # clamped to [-87, 88], never inf or 0
    out = np.empty_like(ends)
    _expf_all(ends, out)
    np.testing.assert_allclose(out, np.exp(np.array([-87.0, -87.0, 88.0, 88.0])), rtol=3e-7)
    for n in (1, 15, 16, 17, 600):
        assert abs(ops.sum_fixed(y[:n]) - y[:n].astype(np.float64).sum()) <= 1e-6 * y[:n].sum()
        assert ops.sum_fixed(y[:n]) == ops.sum_fixed(y[:n].copy())  # no dependence on where the data lives
        assert ops.sum_fixed(y[:n]) == ops.sum_fixed(np.repeat(y[:n], 2)[::2])  # nor on its stride (scalar loop)

