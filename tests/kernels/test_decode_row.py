"""The pieces a decode row's one-call layer halves add (kernels/cpu/decode_row.py, moe.moe_half), each held to the
composed path's kernels bit for bit: float32 to f16 bits, a KV row stored in place, a fused matrix's parts in one
parallel region, attention by the mode attention_kv would take."""

import numba
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from numba import njit

from guild.engine.backends.host import HOST
from guild.kernels import ref_quant
from guild.kernels.cpu.intrinsics import f2h
from guild.kernels.cpu.ops import attention_kv
from guild.kernels.cpu.ops.gqa import MARKS, ONE_PASS, PASSES, PASSES_HALVES, ROW, attend_row, row_mode
from guild.kernels.cpu.ops.gqa_row import WIDE_ROW
from guild.kernels.cpu.ops.kv import put_key_row, put_value_row
from guild.kernels.cpu.quant import LinearTable, linear_rows, matmul, numerics, pack
from guild.kvtypes import KVTypes

# a compiled function Numba cannot cache would compile again in every process: fail where it warns so
pytestmark = pytest.mark.filterwarnings("error::numba.NumbaWarning")

KV = ("f32", "f16", "q8_0")


@njit
def _f2h_all(x, out):
    for i in range(x.size):
        out[i] = f2h(x[i])


def test_f2h_is_numpys_float16():
    """Every 65,537th float32 bit pattern (all signs and exponents) and the rounding edges: ties to even, the
    largest half and the first value past it, the subnormals' ends."""
    bits = np.arange(0, 1 << 32, 65537, dtype=np.uint64).astype(np.uint32).view(np.float32)
    edges = np.array([65504, 65519.996, 65520, 2.0**-24, 2.0**-25, 3 * 2.0**-26, 2.0**-14, 1 + 2.0**-11,
                      1 + 3 * 2.0**-11, -0.0, np.inf, -np.inf, 1e-30, -1e30], np.float32)
    x = np.concatenate([bits, edges])
    x = x[~np.isnan(x)]
    got = np.empty(x.size, np.uint16)
    _f2h_all(x, got)
    with np.errstate(over="ignore"):
        want = x.astype(np.float16).view(np.uint16)
    assert np.array_equal(got, want)
    nan = np.empty(1, np.uint16)
    _f2h_all(np.array([np.nan], np.float32), nan)
    assert np.isnan(nan.view(np.float16)[0])  # a NaN stays a NaN (its payload is the hardware's)


@njit
def _put_row(kt, vc, k, v, pos):
    put_key_row(kt, k, pos)
    put_value_row(vc, v, pos)


@pytest.mark.parametrize("kv", [(k, v) for k in KV for v in KV], ids="-".join)
def test_kv_row_is_kv_write(kv):
    """A row stored by put_key_row / put_value_row equals HostBackend.kv_write's, in every stored type, in the
    first and a later key tile."""
    Hkv, hd, ctx = 2, 64, 160
    rng = np.random.default_rng(3)
    want = HOST.kv_zeros(Hkv, hd, ctx, KVTypes(*kv))
    got = HOST.kv_zeros(Hkv, hd, ctx, KVTypes(*kv))
    for pos in (0, 5, 64, 131):
        k, v = (rng.standard_normal((Hkv, hd)).astype(np.float32) * 3 for _ in range(2))
        HOST.kv_write(*want, k[None], v[None], pos)
        _put_row(*got, k, v, pos)
    for w, g in zip(want, got, strict=True):
        for a, b in zip(w if isinstance(w, tuple) else (w,), g if isinstance(g, tuple) else (g,), strict=True):
            assert np.array_equal(a, b)


def _matrix(qtype, n, k, seed):
    return pack(qtype, ref_quant.random_raw(qtype, n, k, np.random.default_rng(seed)), n, k)


@pytest.mark.parametrize("T", [1, 3])
def test_linear_rows_is_matmul_per_part(T):
    """Parts of three types (their activations quantised in two groups) side by side in one parallel region:
    each part's columns bitwise what matmul gives it."""
    parts = [_matrix(Q.Q4_K, 128, 256, 1), _matrix(Q.Q6_K, 64, 256, 2), _matrix(Q.Q8_0, 64, 256, 3)]
    t = LinearTable(parts)
    assert t.ok and list(t.col) == [0, 128, 192, 256]
    x = np.random.default_rng(4).standard_normal((T, 256)).astype(np.float32)
    out = np.empty((T, 256), np.float32)
    linear_rows(x, t.addr, t.dims, t.sg, t.col, out, 2)
    for p, c in zip(parts, t.col, strict=False):
        want = np.empty((T, p.n_rows), np.float32)
        matmul(p, x, want)
        assert np.array_equal(out[:, c : c + p.n_rows], want)


def test_linear_table_refuses_what_linear_rows_cannot_run():
    """A part that ends inside a tile (its kernel would clip at the fused width) or off the int8 path."""
    assert not LinearTable([_matrix(Q.Q8_0, 96, 64, 1), _matrix(Q.Q8_0, 64, 64, 2)]).ok
    with numerics("f32"):
        assert not LinearTable([_matrix(Q.Q8_0, 64, 64, 1)]).ok


@njit
def _attend(mark, q, k, v, pos0, scale, out, scores):
    attend_row(mark, q, k, v, pos0, scale, out, scores)


@pytest.mark.parametrize("kv", KV)
@pytest.mark.parametrize("group", [4, 3])
def test_attend_row_is_attention_kv(kv, group):
    """One row by row_mode's kernel equals attention_kv's, over a cache of each stored type, heads in fours
    (attention_row on AVX-512 hosts) and not."""
    Hkv, hd, pos0 = 2, 64, 97
    H = Hkv * group
    rng = np.random.default_rng(5)
    kt, vc = HOST.kv_zeros(Hkv, hd, 128, KVTypes(kv, kv))
    for p in range(pos0 + 1):
        HOST.kv_write(kt, vc, *(rng.standard_normal((1, Hkv, hd)).astype(np.float32) for _ in range(2)), p)
    q = rng.standard_normal((1, H, hd)).astype(np.float32)
    scale = np.float32(1 / np.sqrt(hd))
    mode = row_mode(H, hd, kt, vc)
    passes = PASSES_HALVES if Hkv % numba.get_num_threads() else PASSES
    assert mode == (ROW if WIDE_ROW and group == 4 else ONE_PASS if kv == "f32" else passes)
    want, got = np.empty((1, H, hd), np.float32), np.empty((1, H, hd), np.float32)
    attention_kv(q, kt, vc, pos0, scale, want, np.empty((H, pos0 + 1), np.float32))
    _attend(MARKS[mode], q, kt, vc, pos0, scale, got, np.empty((H, pos0 + 1), np.float32))
    assert np.array_equal(got, want)
