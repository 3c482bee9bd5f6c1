"""The int8-activation path (kernels/cpu/qdot/, numerics "i8") against its twins.

1. packing keeps the GGUF bits: get_rows is bit-exact with gguf.quants.dequantize;
2. matmul is within 1e-6 * (|W| @ |x̂|) of the float64 product with the activations quantised by the twin
   (ref_quant.quantize_act_q8): the integer sums are exact, only the float32 block scaling rounds;
3. row invariance, bitwise: row t does not depend on T (1..8, 9, 37, prefill chunks up to 512), on its
   neighbours, on a batch of sessions, or on the threads;
4. experts_matmul (a MoE layer's experts in one parallel region) gives matmul's bits;
5. the portable dpbusd equals the VNNI instruction; VNNI builds emit vpdpbusd, AVX2 builds vpmaddubsw;
6. numerics "f32" keeps the fp32 dequant-dot kernels (and its own packed layout).
"""

from __future__ import annotations

import re

import numba
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import quants
from numba import njit

from guild.errors import GuildError
from guild.kernels import ref_quant
from guild.kernels.blocks import KVALUES_IQ4NL
from guild.kernels.cpu import qdot, simd
from guild.kernels.cpu import quant as kq
from guild.kernels.quant_types import BLOCK, F16_SCALES, QUANT_TYPES, act_block, row_bytes

TYPES = [q for q, t in QUANT_TYPES.items() if t.i8]
KQUANTS = {qt for qt in TYPES if BLOCK[qt][0] == 256}  # super-blocks of 256
TOL = 1e-6


def _pack(qt, n, k, seed=0, mode="i8"):
    raw = ref_quant.random_raw(qt, n, k, np.random.default_rng(seed))
    with kq.numerics(mode):
        return raw, kq.pack(qt, raw, n, k)


def _mm(w, x):
    out = np.empty((x.shape[0], w.n_rows), np.float32)
    kq.matmul(w, x, out)
    return out


@pytest.mark.parametrize("qt", TYPES, ids=lambda q: q.name)
def test_get_rows_bit_exact(qt):
    k = 256 if qt in KQUANTS else 96
    raw, w = _pack(qt, 80, k)
    assert w.numerics == "i8"
    want = np.asarray(quants.dequantize(raw, qt), np.float32).reshape(80, k)
    assert np.array_equal(kq.dequantize(w).view(np.uint32), want.view(np.uint32))
    rows = np.array([79, 0, 64, 5], np.int64)
    out = np.empty((4, k), np.float32)
    kq.dequantize_rows(w, rows, out)
    assert np.array_equal(out, want[rows])


@pytest.mark.parametrize("qt", TYPES, ids=lambda q: q.name)
@pytest.mark.parametrize("n, k", [(80, 512), (64, 32), (200, 96), (1100, 64)])
def test_matmul_matches_twin(qt, n, k):
    if qt in KQUANTS:
        k = -(-k // 256) * 256
    raw, w = _pack(qt, n, k, seed=n + k)
    W = ref_quant.dequantize(qt, raw, (n, k)).astype(np.float64)
    rng = np.random.default_rng(1)
    for T in (1, 2, 3, 4, 5, 6, 7, 8, 9, 37, 100):
        x = rng.standard_normal((T, k)).astype(np.float32)
        x[0, :3] = (40.0, 0.0, -1e-3)  # an outlier, an exact zero and a tiny value in one block
        if T > 1:
            x[1, :32] = 0.0  # a block of zeros: scale 0
        got = _mm(w, x).astype(np.float64)
        ref = ref_quant.matmul_ref(W, x, act_block(qt)).astype(np.float64)
        bound = TOL * (np.abs(ref_quant.quantize_act_q8(x, act_block(qt))) @ np.abs(W).T) + 1e-30
        err = np.abs(got - ref)
        assert np.all(err <= bound), f"T={T}: worst {np.max(err / bound):.3g} x tolerance"


@pytest.mark.parametrize("qt", TYPES, ids=lambda q: q.name)
def test_row_invariance(qt):
    _, w = _pack(qt, 200, 256, seed=7)
    rng = np.random.default_rng(2)
    rows = rng.standard_normal((37, 256)).astype(np.float32)
    solo = np.concatenate([_mm(w, rows[i : i + 1]) for i in range(37)])
    before = numba.get_num_threads()
    try:
        for threads in sorted({1, min(2, numba.config.NUMBA_NUM_THREADS)}):
            numba.set_num_threads(threads)
            for T in (1, 2, 3, 4, 5, 6, 7, 8, 9, 37):
                for start in (0, 37 - T):
                    got = _mm(w, rows[start : start + T])
                    assert np.array_equal(got, solo[start : start + T]), (threads, T, start)
            noisy = rows[:8].copy()
            noisy[1:] = rng.standard_normal((7, 256)).astype(np.float32) * 100  # other neighbours
            assert np.array_equal(_mm(w, noisy)[0], solo[0])
    finally:
        numba.set_num_threads(before)


@pytest.mark.parametrize("qt", TYPES, ids=lambda q: q.name)
def test_batch_invariance_up_to_prefill_chunks(qt):
    """A row's output is bitwise the same alone, in a window, in a batch of sessions (experts_matmul's groups)
    and in prefill chunks of up to 512 rows, on 1 and 2 threads."""
    _, w = _pack(qt, 136, 256, seed=11)
    rng = np.random.default_rng(12)
    rows = rng.standard_normal((512, 256)).astype(np.float32)
    picks = [0, 1, 63, 64, 255, 511]
    solo = {i: _mm(w, rows[i : i + 1]) for i in picks}
    before = numba.get_num_threads()
    try:
        for threads in sorted({1, min(2, numba.config.NUMBA_NUM_THREADS)}):
            numba.set_num_threads(threads)
            for T in (64, 65, 256, 512):
                got = _mm(w, rows[:T])
                for i in picks:
                    if i < T:
                        assert np.array_equal(got[i : i + 1], solo[i]), (threads, T, i)
            offs = np.array([0, 1, 9, 512], np.int64)  # three sessions' rows through one expert table
            out = np.empty((512, 136), np.float32)
            kq.experts_matmul([w], np.zeros(3, np.int64), offs, rows, out)
            for i in picks:
                assert np.array_equal(out[i : i + 1], solo[i]), (threads, "batch", i)
    finally:
        numba.set_num_threads(before)


@pytest.mark.parametrize("mode", ["i8", "f32"])
def test_experts_matmul_equals_matmul(mode):
    rng = np.random.default_rng(3)
    ws = [_pack(Q.Q4_1, 192, 128, seed=i, mode=mode)[1] for i in range(5)]
    eids = np.array([0, 3, 4], np.int64)
    offs = np.array([0, 1, 4, 6], np.int64)
    x = rng.standard_normal((6, 128)).astype(np.float32)
    out = np.empty((6, 192), np.float32)
    kq.experts_matmul(ws, eids, offs, x, out)
    for g, e in enumerate(eids):
        assert np.array_equal(out[offs[g] : offs[g + 1]], _mm(ws[e], x[offs[g] : offs[g + 1]]))
    assert kq.ExpertTable.of(ws).ok == (mode == "i8") and kq.ExpertTable.of(ws) is kq.ExpertTable.of(ws)


@njit(cache=True)
def _both_dpbusd(a, u, s, out):
    pa, pu, ps = a.ctypes.data, u.ctypes.data, s.ctypes.data
    fast = simd.dpbusd(simd.ld_i32(pa), simd.ld_i32(pu), simd.ld_i32(ps))
    slow = simd.dpbusd_portable(simd.ld_i32(pa), simd.ld_i32(pu), simd.ld_i32(ps))
    for i in range(16):
        out[0, i] = simd.lane(simd.cvt(fast), i)
        out[1, i] = simd.lane(simd.cvt(slow), i)


def test_dpbusd_forms_agree():
    rng = np.random.default_rng(4)
    for _ in range(20):
        a = rng.integers(-(1 << 20), 1 << 20, 16).astype(np.int32)
        u = rng.integers(0, 256, 64).astype(np.uint8)
        s = rng.integers(-128, 128, 64).astype(np.int8)
        out = np.empty((2, 16), np.float32)
        _both_dpbusd(a, u, s, out)
        want = a.astype(np.int64) + (u.reshape(16, 4).astype(np.int64) * s.reshape(16, 4)).sum(1)
        assert np.array_equal(out[0], want.astype(np.float32))
        assert np.array_equal(out[1], want.astype(np.float32))


@njit(cache=True)
def _isa_dots(a, u, s, w, out):
    pa, pu, ps = a.ctypes.data, u.ctypes.data, s.ctypes.data
    acc = simd.ld_i32(pa)
    d4 = simd.dot4(acc, simd.ld_i32(pu), simd.ld_i32(ps))
    d8 = simd.dot8(acc, simd.ld_i32(pu), simd.ld_i32(ps), simd.ld_i32(pu + 64), simd.ld_i32(ps + 64))
    ss = simd.dot4ss(acc, simd.ld_i32(w.ctypes.data), simd.ld_i32(ps))
    for i in range(16):
        out[0, i] = simd.lane(simd.cvt(d4), i)
        out[1, i] = simd.lane(simd.cvt(d8), i)
        out[2, i] = simd.lane(simd.cvt(ss), i)


def test_isa_dots_exact_in_their_ranges():
    """dot4 (u <= 127), dot8 (u <= 63) and dot4ss (signed x signed) are exact at their ranges' extremes, on
    whichever ISA this host compiles them for."""
    rng = np.random.default_rng(6)
    for trial in range(30):
        a = rng.integers(-(1 << 20), 1 << 20, 16).astype(np.int32)
        hi = 63 if trial % 2 else 127
        u = rng.integers(0, hi + 1, 128).astype(np.uint8)
        s = rng.integers(-127, 128, 128).astype(np.int8)
        if trial < 3:  # the extremes
            u[:], s[:] = hi, (-127, 127, -127)[trial]
        w = rng.integers(-128, 128, 64).astype(np.int8)
        if trial < 3:
            w[:] = (-128, 127, -128)[trial]
        out = np.empty((3, 16), np.float32)
        _isa_dots(a, u, s, w, out)
        p = u.astype(np.int64) * s
        d4 = a + p[:64].reshape(16, 4).sum(1)
        assert np.array_equal(out[0], d4.astype(np.float32))
        if hi == 63:
            assert np.array_equal(out[1], (d4 + p[64:].reshape(16, 4).sum(1)).astype(np.float32))
        assert np.array_equal(out[2], (a + (w.astype(np.int64) * s[:64]).reshape(16, 4).sum(1)).astype(np.float32))


@njit(cache=True)
def _nib_dots(a, sc, w, x, m, y, out):
    pw, px = w.ctypes.data, x.ctypes.data
    d = simd.dot_nib(simd.ld_i32(a.ctypes.data), simd.ld_i32(sc.ctypes.data), simd.ld_i32(pw), simd.ld_i32(pw + 64),
                     simd.ld_i32(pw + 128), simd.ld_i32(pw + 192), simd.bc_i32(px), simd.bc_i32(px + 4),
                     simd.bc_i32(px + 8), simd.bc_i32(px + 12), simd.bc_i32(px + 16), simd.bc_i32(px + 20),
                     simd.bc_i32(px + 24), simd.bc_i32(px + 28))
    p = simd.madd16(simd.ld_i32(m.ctypes.data), simd.ld_i32(y.ctypes.data))
    for i in range(16):
        out[0, i] = simd.lane(simd.cvt(d), i)
        out[1, i] = simd.lane(simd.cvt(p), i)


@njit(cache=True, inline="always")
def _six(p):
    return simd.bits_i(simd.ld_i32(p), 0, 0x3F3F3F3F, 0)


@njit(cache=True, inline="always")
def _five(p):
    return simd.bits_i(simd.ld_i32(p), 0, 0x1F1F1F1F, 0)


@njit(cache=True)
def _apart_dots(a, s1, s2, u, x, out):
    """dot32u (u: 8 vectors of bytes <= 15, s1 the scale pairs), dot32h (the same u <= 63, s1, s2 the two
    halves' scale pairs), madd_w (s1, s2) and dot32h4 (u <= 31) into out [4, 16] int32."""
    pu, px = u.ctypes.data, x.ctypes.data
    v = simd.ld_i32(a.ctypes.data)
    c1, c2 = simd.ld_i32(s1.ctypes.data), simd.ld_i32(s2.ctypes.data)
    x0, x1, x2, x3 = simd.bc_i32(px), simd.bc_i32(px + 4), simd.bc_i32(px + 8), simd.bc_i32(px + 12)
    x4, x5, x6, x7 = simd.bc_i32(px + 16), simd.bc_i32(px + 20), simd.bc_i32(px + 24), simd.bc_i32(px + 28)
    simd.st_i32(out.ctypes.data, simd.dot32u(
        v, c1, simd.lo4(simd.ld_i32(pu)), simd.lo4(simd.ld_i32(pu + 64)), simd.lo4(simd.ld_i32(pu + 128)),
        simd.lo4(simd.ld_i32(pu + 192)), simd.lo4(simd.ld_i32(pu + 256)), simd.lo4(simd.ld_i32(pu + 320)),
        simd.lo4(simd.ld_i32(pu + 384)), simd.lo4(simd.ld_i32(pu + 448)), x0, x1, x2, x3, x4, x5, x6, x7))
    simd.st_i32(out.ctypes.data + 64, simd.dot32h(
        v, c1, c2, _six(pu), _six(pu + 64), _six(pu + 128), _six(pu + 192), _six(pu + 256), _six(pu + 320),
        _six(pu + 384), _six(pu + 448), x0, x1, x2, x3, x4, x5, x6, x7))
    simd.st_i32(out.ctypes.data + 128, simd.madd_w(c1, c2))
    simd.st_i32(out.ctypes.data + 192, simd.dot32h4(
        v, c1, c2, _five(pu), _five(pu + 64), _five(pu + 128), _five(pu + 192), _five(pu + 256), _five(pu + 320),
        _five(pu + 384), _five(pu + 448), x0, x1, x2, x3, x4, x5, x6, x7))


def test_nibble_dot_and_madd16_exact_at_their_bounds():
    """dot_nib (a Q4_K block: 32 nibbles a lane times 32 activations, times a 6-bit scale; VNNI takes the high
    nibbles in place) and madd16 (x in 0..32767 times y in i16; vpmaddwd on AVX-512) give the exact integers,
    the extremes included."""
    rng = np.random.default_rng(7)
    for trial in range(30):
        a = rng.integers(-(1 << 24), 1 << 24, 16).astype(np.int32)
        sc = rng.integers(0, 64, 16).astype(np.int32)
        w = rng.integers(0, 256, 256).astype(np.uint8)  # lane f of word q: bytes 64q + 4f .. 64q + 4f + 3
        x = rng.integers(-127, 128, 32).astype(np.int8)
        m = rng.integers(0, 1 << 15, 16).astype(np.int32)
        y = rng.integers(-(1 << 15), 1 << 15, 16).astype(np.int32)
        if trial < 2:
            sc[:], w[:], x[:] = 63, 255, (127, -127)[trial]
            m[:], y[:] = 32767, (-32768, 32767)[trial]
        out = np.empty((2, 16), np.float32)
        _nib_dots(a, sc, w, x, m, y, out)
        q = w.reshape(4, 16, 4).transpose(1, 0, 2).reshape(16, 16).astype(np.int64)  # lane f: words 0..3's bytes
        lo, hi = q & 15, q >> 4
        want = a + sc * ((lo * x[:16]).sum(1) + (hi * x[16:]).sum(1))
        assert np.array_equal(out[0], want.astype(np.float32))
        assert np.array_equal(out[1], (m.astype(np.int64) * y).astype(np.float32))


def test_dots_on_weights_taken_apart_exact_at_their_bounds():
    """dot32u (a Q4_K block already in nibbles, its scale in both i16 halves), dot32h and dot32h4 (a block's two
    halves of 6-bit or 5-bit quants with signed scales) and madd_w (vpmaddwd: both signed 16-bit halves' products
    summed) give the exact integers, the extremes included (the i16 sums of the AVX2 forms at their largest)."""
    rng = np.random.default_rng(8)
    for trial in range(30):
        a = rng.integers(-(1 << 24), 1 << 24, 16).astype(np.int32)
        u = rng.integers(0, 256, 512).astype(np.uint8)  # vector i, lane f: bytes 64i + 4f .. 64i + 4f + 3
        x = rng.integers(-127, 128, 32).astype(np.int8)
        sc = rng.integers(0, 64, 16)
        sa, sb = rng.integers(-128, 128, (2, 16))
        if trial < 2:
            u[:], x[:], sc[:], sa[:], sb[:] = 255, (127, -127)[trial], 63, (-128, 127)[trial], (127, -128)[trial]
        pair = lambda v: ((v & 0xFFFF) | (v << 16)).astype(np.uint32).view(np.int32)  # noqa: E731
        out = np.empty((4, 16), np.int32)
        q = u.reshape(8, 16, 4).transpose(1, 0, 2).astype(np.int64)  # [lane, vector, byte]
        xs = x.reshape(8, 4).astype(np.int64)
        _apart_dots(a, pair(sc), pair(sb), u, x, out)
        assert np.array_equal(out[0], a + sc * ((q & 15) * xs).sum((1, 2)))
        _apart_dots(a, pair(sa), pair(sb), u, x, out)
        six = ((q & 63) * xs).sum(2)
        assert np.array_equal(out[1], a + sa * six[:, :4].sum(1) + sb * six[:, 4:].sum(1))
        five = ((q & 31) * xs).sum(2)
        assert np.array_equal(out[3], a + sa * five[:, :4].sum(1) + sb * five[:, 4:].sum(1))
        r1, r2 = rng.integers(-(1 << 31), 1 << 31, (2, 16)).astype(np.int32)
        _apart_dots(a, r1, r2, u, x, out)
        h = lambda v: (v.astype(np.int64) << 48 >> 48, v.astype(np.int64) >> 16)  # noqa: E731
        (l1, h1), (l2, h2) = h(r1), h(r2)
        assert np.array_equal(out[2], (l1 * l2 + h1 * h2).astype(np.uint32).view(np.int32))


_LUT = simd.lookup16(KVALUES_IQ4NL)
_LUT_PORTABLE = simd.lookup16(KVALUES_IQ4NL, portable=True)


@njit
def _lookups(idx, out):
    p = idx.ctypes.data
    for k in range(4):  # byte k of every lane
        simd.st_i8(out.ctypes.data + 16 * k, simd.bits_i(_LUT(simd.ld_i32(p)), 8 * k, 0xFF, 0))
        simd.st_i8(out.ctypes.data + 64 + 16 * k, simd.bits_i(_LUT_PORTABLE(simd.ld_i32(p)), 8 * k, 0xFF, 0))


def test_table_lookup_forms_agree():
    """The vpshufb lookup and the element-by-element one give table[nibble] for every byte."""
    idx = np.random.default_rng(5).integers(0, 16, 64).astype(np.uint8)
    out = np.zeros(128, np.uint8)
    _lookups(idx, out)
    want = KVALUES_IQ4NL.view(np.uint8)[idx]
    for form in (out[:64], out[64:]):
        assert np.array_equal(form.reshape(4, 16).T.reshape(64), want)


@njit(cache=True)
def _rows_both(grid, idx, sw, sc, x, ent, out):
    pg, pi, ps, pc = grid.ctypes.data, idx.ctypes.data, sw.ctypes.data, sc.ctypes.data
    px, po = x.ctypes.data, out.ctypes.data
    if ent == 8:
        simd.hsum2(simd.grid_rows2(pg, pi, ps, pc, px, 8), po)
        simd.hsum2(simd.grid_rows2_portable(pg, pi, ps, pc, px, 8), po + 8)
    else:
        simd.hsum2(simd.grid_rows2(pg, pi, ps, pc, px, 4), po)
        simd.hsum2(simd.grid_rows2_portable(pg, pi, ps, pc, px, 4), po + 8)


@pytest.mark.parametrize("ent", [8, 4])
def test_grid_rows_forms_agree(ent):
    """Two rows of a grid type's block with the elements in lanes (the T = 1 path of IQ2_XXS, IQ3_XXS): this
    host's form and the portable one both give sc · Σ |g| · (±x̂) per row, at the ranges' extremes too."""
    rng = np.random.default_rng(7)
    for trial in range(20):
        grid = rng.integers(0, 63, (256, ent)).astype(np.uint8)
        idx = rng.integers(0, 256, 16 * (32 // ent)).astype(np.uint8)  # entry q of row r at 16 q + r
        sw = rng.integers(0, 1 << 32, 2, dtype=np.uint64).astype(np.uint32)
        sc = rng.integers(0, 256, 2).astype(np.uint8)
        x = rng.integers(-127, 128, 32).astype(np.int8)
        if trial < 2:  # the extremes: largest magnitudes, scales and activations, all signs set or none
            grid[:] = 62
            sc[:] = 255
            x[:] = 127
            sw[:] = 0xFFFFFFFF if trial else 0
        out = np.zeros(4, np.int32)
        _rows_both(grid, idx, sw, sc, x, ent, out)
        for r in range(2):
            mags = grid[idx.reshape(-1, 16)[:, r]].reshape(32).astype(np.int64)
            e = np.arange(32)
            neg = (int(sw[r]) >> (8 * (e % 4) + e // 4)) & 1
            want = int(sc[r]) * int((mags * np.where(neg, -1, 1) * x.astype(np.int64)).sum())
            assert out[r] == want and out[2 + r] == want, (trial, r, out, want)


@pytest.mark.parametrize("kernel", ["_k_q4_1", "_k_q6_k", "_k_iq4_xs"])
def test_isa_instructions_emitted(kernel):
    """VNNI hosts use vpdpbusd; AVX2 hosts without it vpmaddubsw + vpmaddwd (not the portable widening); the
    table types look their levels up with vpshufb."""
    from numba import cfunc

    from guild.kernels.cpu.intrinsics import _KSIG

    asm = cfunc(_KSIG)(getattr(qdot.kernels, kernel))._library.get_asm_str()  # a fresh compile (cached code: no asm)
    n = len(re.findall(r"\bvpdpbusd\b", asm))
    assert (n > 0) == simd.VNNI512, f"{n} vpdpbusd instructions, VNNI512={simd.VNNI512}"
    if simd.AVX2 and not simd.VNNI512:
        assert re.search(r"\bvpmaddubsw\b", asm) and re.search(r"\bvpmaddwd\b", asm)
    if kernel == "_k_iq4_xs" and simd.AVX2:
        assert re.search(r"\bvpshufb\b", asm)


def test_f32_numerics_keeps_fp32_kernels():
    raw, wi = _pack(Q.Q4_1, 64, 64)
    _, wf = _pack(Q.Q4_1, 64, 64, mode="f32")
    assert (wi.numerics, wf.numerics) == ("i8", "f32")
    assert [a.shape for a in wf.arrays] != [a.shape for a in wi.arrays]
    x = np.random.default_rng(5).standard_normal((2, 64)).astype(np.float32)
    W = ref_quant.dequantize(Q.Q4_1, raw, (64, 64))
    bound = 1e-4 * (np.abs(x).astype(np.float64) @ np.abs(W).T.astype(np.float64)) + 1e-30
    assert np.all(np.abs(_mm(wf, x).astype(np.float64) - ref_quant.matmul_ref(W, x)) <= bound)
    with pytest.raises(ValueError, match="numerics"):
        with kq.numerics("int4"):
            pass
    assert kq.layout(Q.Q4_1, 64, 64, "i8") == tuple((a.dtype, a.shape) for a in wi.arrays)
    assert kq.layout(Q.Q4_1, 64, 64, "f32") == tuple((a.dtype, a.shape) for a in wf.arrays)
    assert qdot.act_bytes(3, 64) == 3 * (64 + qdot.ACT_EXTRA * 2)


def test_expert_tables_are_bounded(monkeypatch):
    monkeypatch.setattr(kq.ExpertTable, "_MAX", 3)
    monkeypatch.setattr(kq.ExpertTable, "_CACHE", type(kq.ExpertTable._CACHE)())
    lists = [[_pack(Q.Q4_0, 64, 32, seed=i)[1]] for i in range(5)]
    for ws in lists:
        kq.ExpertTable.of(ws)
    assert len(kq.ExpertTable._CACHE) == 3 and id(lists[0]) not in kq.ExpertTable._CACHE
    assert kq.ExpertTable.of(lists[4]).ws is lists[4]


def test_q8_0_activations_match_gguf_py_but_at_exact_ties():
    """The activations of the 32-element weight types (one scale per 32) are gguf-py's Q8_0 of the row: the same
    quants, and a float32 scale whose f16 rounding is gguf-py's stored scale (guild keeps d in float32, ggml in
    f16), except at exact ties of x * (1 / d), where guild rounds half to even (as ggml's x86 quantize_row_q8_0,
    which llama.cpp runs on activations: tests/oracles/test_ggml_quantizers.py) and gguf-py half away from zero.
    The NumPy twin ref_quant.quantize_act_q8 is the same values."""
    from tests.helpers import q8

    for x in (q8.rows(5), q8.ties()):
        (qs, d), (gq, gd) = q8.act_q8(x, 1), q8.gguf_q8_0(x)
        assert np.array_equal(d.astype(np.float16), gd)
        tie = q8.exact_ties(x, d)
        assert np.array_equal(qs[~tie], gq[~tie])
        assert np.array_equal(qs[tie], np.rint(x[tie])) and np.array_equal(gq[tie], q8.half_away(x[tie]))
        twin = ref_quant.quantize_act_q8(x, 32)
        assert np.array_equal(twin, qs.astype(np.float64) * np.repeat(d, 32, axis=1).astype(np.float64))
    assert tie.sum() == x.size // 2 and (qs[tie] != gq[tie]).sum() == x.size // 2 * 5 // 8  # the ties rows' cases


@pytest.mark.parametrize("qt", sorted(qdot.PACKERS), ids=lambda q: Q(q).name)
def test_packers_write_the_twins_bytes(qt):
    rng = np.random.default_rng(int(qt))
    n, k = 150, (512 if qt in KQUANTS else 160)
    raw = ref_quant.random_raw(qt, n, k, rng)
    raw[3:9] = rng.integers(0, 256, raw[3:9].shape, dtype=np.uint8)  # any bytes: scales random bits too
    bs, ts = BLOCK[qt]
    nan, inf = (np.frombuffer(np.float16(v).tobytes(), np.uint8) for v in (np.nan, -np.inf))
    hit = [(r, b) for r, b in rng.integers(0, (n, k // bs), (6, 2))]  # inf/NaN scales, one row again
    for r, b in hit + [(hit[0][0], (hit[0][1] + 1) % (k // bs))]:
        for off in F16_SCALES[qt][: 1 + r % 2]:
            raw[r, b * ts + off : b * ts + off + 2] = nan if b % 2 else inf
    want = qdot.pack_numpy(qt, raw.reshape(n, k // bs, ts), n)
    parts = (raw[:1], raw[1:64], raw[64:65], raw[65:])  # parts across tiles, groups and lanes
    with kq.numerics("i8"):
        w, bad = kq.pack_checked(qt, parts, n, k)
    assert [(a.dtype, a.shape) for a in w.arrays] == [(a.dtype, a.shape) for a in want]
    for got, ref, (name, _, _) in zip(w.arrays, want, QUANT_TYPES[qt].i8, strict=True):
        assert np.array_equal(got.view(np.uint8), ref.view(np.uint8)), name
    scales = [raw.reshape(n, -1, ts)[..., o : o + 2].copy().view(np.uint16) for o in F16_SCALES[qt]]
    per_row = sum(((s & 0x7C00) == 0x7C00).sum(axis=(1, 2)) for s in scales) if scales else np.zeros(n, int)
    assert bad == tuple(int(per_row[p].sum()) for p in (slice(0, 1), slice(1, 64), slice(64, 65), slice(65, n)))
    assert sum(bad) >= (7 if F16_SCALES[qt] else 0) or not F16_SCALES[qt]
    with pytest.raises(ValueError, match="whole rows"):
        kq.pack_checked(qt, (raw[:, : row_bytes(qt, k) - 1],), n, k)


# the decode pass takes another form without software prefetch (_super_one: one group of features a pass, two
# integer chains); the slices' expert types and a 32-element type, with a clipped last group (every type meets
# the default form in the other tests)
@pytest.mark.parametrize("qt", [Q.Q4_K, Q.Q6_K, Q.Q8_0], ids=lambda q: q.name)
def test_prefetch_distance_leaves_the_bits(qt):
    """The kernels without software prefetch (AMD Zen's default, one group a decode pass) and with the farthest
    distance (two groups a pass) give the same bits for a decode row and a row triple, and both give the row
    alone what it gets among others."""
    from numba import cfunc

    from guild.kernels.cpu.intrinsics import _KSIG

    _, w = _pack(qt, 200, 512, seed=3)
    x = np.random.default_rng(4).standard_normal((3, 512)).astype(np.float32)
    got = []
    for pf in (0, 6):
        fn = cfunc(_KSIG)(qdot.kernels._entry(int(qt), f"_k_pf{pf}", pf))
        t = w.table
        addr = t.addr.copy()
        addr[0, 0] = fn.address
        for T in (1, 3):
            out = np.empty((T, 200), np.float32)
            kq.linear_rows(x[:T], addr, t.dims, t.sg, t.col, out, 2)
            got.append(out)
    assert np.array_equal(got[0], _mm(w, x[:1])) and np.array_equal(got[1], _mm(w, x))
    assert np.array_equal(got[0], got[2]) and np.array_equal(got[1], got[3])
    assert np.array_equal(got[0][0], got[1][0])


def test_only_zen4_goes_without_software_prefetch():
    """The host rule behind PF_BYTES' default: Zen 4 reads streamed weights faster without software prefetch,
    Zen 3, Zen 5 and Intel with it (kernels.py's measurements)."""
    assert [simd.isa.zen4(c) for c in ("znver4", "znver5", "znver3", "znver1", "skylake-avx512",
                                        "sapphirerapids", "znver", "")] == [True] + [False] * 7
    assert simd.isa.ZEN4 == simd.isa.zen4(simd.isa._host_cpu())


def test_prefetch_setting_is_validated():
    assert qdot.kernels.prefetch_bytes("0") == 0 and qdot.kernels.prefetch_bytes(" 4096 ") == 4096
    assert qdot.kernels.prefetch_bytes("") == (0 if simd.isa.ZEN4 else qdot.kernels.PF_BYTES_DEFAULT)
    for bad in ("-1", "1e3", "lots", str(1 << 20)):
        with pytest.raises(GuildError, match="GUILD_PREFETCH_BYTES=.*expected bytes"):
            qdot.kernels.prefetch_bytes(bad)
    if qdot.kernels.PF_BYTES == 0:
        assert all(qdot.kernels.prefetch_units(int(q)) == 0 for q in TYPES)


def _tile_extremes(qt, n, k):
    """Rows at the integer bounds, the rest random: every quant at its largest with every scale and min at its
    largest (row 0) or, for the signed scales of Q6_K, Q3_K and IQ4_XS, at their most negative (row 0) and
    largest (1); Q8_0's quants at −128 (row 0) and 127 (row 1)."""
    raw = ref_quant.random_raw(qt, n, k, np.random.default_rng(5))
    if qt == Q.Q8_0:  # [d, quants 32]
        blk = raw.reshape(n, k // 32, 34)
        blk[0, :, 2:] = 0x80
        blk[1, :, 2:] = 0x7F
        return raw
    blk = raw.reshape(n, k // 256, row_bytes(qt, 256))
    if qt == Q.IQ4_XS:  # [d, scales' high bits 2, low nibbles 4 (+32 offset: 0 → −32), quants 128 (0: −127)]
        blk[:2, :, 8:] = 0x00
        blk[0, :, 2:8] = 0x00
        blk[1, :, 2:8] = 0xFF
    elif qt in (Q.Q4_K, Q.Q5_K):  # [d, dmin, scales and mins 12, (Q5_K: high bits 32), quants 128]
        blk[0, :, 4:] = 0xFF
    elif qt == Q.Q2_K:  # [scale | min << 4 16, quants 64, d, dmin]
        blk[0, :, :80] = 0xFF
    elif qt == Q.Q3_K:  # [high bits 32, quants 64, scales 12 (+32 offset: 0x00 → −32), d]
        blk[:2, :, :96] = 0xFF
        blk[0, :, 96:108] = 0x00
        blk[1, :, 96:108] = 0xFF
    else:  # Q6_K: [low nibbles 128, high bits 64, scales 16, d]
        blk[:2, :, :192] = 0xFF
        blk[0, :, 192:208] = 0x80
        blk[1, :, 192:208] = 0x7F
    return raw


_AMX_FNS: dict = {}


@pytest.mark.skipif(not simd.amx.AMX, reason="the host has no AMX-INT8 (or Linux refused its tile state)")
@pytest.mark.parametrize("qt, n, k", [(q, n, k) for q in (Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.IQ4_XS, Q.Q8_0)
                                      for n, k in ((200, 512), (64, 768))] + [(Q.Q8_0, 64, 800)],  # odd blocks
                         ids=lambda v: v.name if isinstance(v, Q) else str(v))
def test_amx_tiles_give_the_vector_kernels_bits(qt, n, k):
    """The AMX path (tiles of 16 rows, a last one of fewer overlapping the one before it or, under 16 rows,
    reading on into the activations' fields) gives bitwise the vector kernel's output for every row count, at
    the integer bounds (extreme weights; activations of one sign, whose block sums split into negative high
    parts) and on random rows. The reference is the same kernel in calls of fewer than TILE_MIN rows, which
    take the vector path (one compile a type: each row is bitwise what it gets in any batch of the vector
    kernel, test_batch_invariance_up_to_prefill_chunks)."""
    from numba import cfunc

    from guild.kernels.cpu.intrinsics import _KSIG

    raw = _tile_extremes(qt, n, k)
    with kq.numerics("i8"):
        w = kq.pack(qt, raw, n, k)
    rng = np.random.default_rng(6)
    x = rng.standard_normal((100, k)).astype(np.float32)
    x[0], x[1] = 3.0, -3.0  # x̂ = ±127 everywhere: Σx̂ = ±4064 a block
    if qt not in _AMX_FNS:  # compiled once a type (a cfunc is not cached)
        _AMX_FNS[qt] = cfunc(_KSIG)(qdot.kernels._entry(int(qt), "_k_amx", None, True))
    fn = _AMX_FNS[qt]
    assert re.search(r"\btdpbs[us]d\b", fn._library.get_asm_str())
    t = w.table
    addr = t.addr.copy()
    addr[0, 0] = fn.address

    def rows(x):
        out = np.empty((x.shape[0], n), np.float32)
        kq.linear_rows(x, addr, t.dims, t.sg, t.col, out, 2)
        return out

    below = qdot.tiles.TILE_MIN - 1
    for T in (11, 12, 16, 17, 31, 32, 48, 53, 100):
        want = np.concatenate([rows(x[t0 : min(t0 + below, T)]) for t0 in range(0, T, below)])
        assert np.array_equal(rows(x[:T]), want), T
    assert np.array_equal(want[:2], _mm(w, x[:2]))


_EXPANDED_FNS: dict = {}
_AVX2_ONLY = simd.AVX2 and not simd.VNNI512  # the host's own kernels take _super_expanded


@pytest.mark.parametrize("qt", [Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K], ids=lambda q: q.name)
def test_expanded_super_blocks_give_the_vector_kernels_bits(qt):
    """The AVX2 path that takes a super-block's weights apart once for all rows (_super_expanded: dot32u,
    dot32h, the per-block terms in one vpmaddwd) gives bitwise the row-pair kernel's output, at the integer
    bounds (extreme weights and scales, x̂ = ±127: the i16 sums at their largest) and on random rows, for even
    and odd row counts. The reference is the host's kernel in calls of fewer than EXPAND_MIN rows. Where the
    host's kernels do not take the path (VNNI, or no AVX2), a kernel of it alone is compiled (`expand`), its
    integers in those ISAs' forms, for the three kinds that cover its arithmetic (the AVX2 forms of its
    intrinsics: test_dots_on_weights_taken_apart_exact_at_their_bounds under GUILD_NO_VNNI=1)."""
    from numba import cfunc

    from guild.kernels.cpu.intrinsics import _KSIG

    if not _AVX2_ONLY and qt in (Q.Q3_K, Q.Q5_K):
        pytest.skip("off AVX2-only hosts Q2_K, Q4_K and Q6_K cover the path (one compile each)")
    n, k = 200, 512
    raw = _tile_extremes(qt, n, k)
    with kq.numerics("i8"):
        w = kq.pack(qt, raw, n, k)
    rng = np.random.default_rng(7)
    x = rng.standard_normal((40, k)).astype(np.float32)
    x[0], x[1] = 3.0, -3.0
    t = w.table
    addr = t.addr.copy()
    if not _AVX2_ONLY:
        if qt not in _EXPANDED_FNS:  # compiled once a type (a cfunc is not cached)
            _EXPANDED_FNS[qt] = cfunc(_KSIG)(qdot.kernels._entry(int(qt), "_k_expanded", None, False, True))
        addr[0, 0] = _EXPANDED_FNS[qt].address

    def rows(x, a):
        out = np.empty((x.shape[0], n), np.float32)
        kq.linear_rows(x, a, t.dims, t.sg, t.col, out, 2)
        return out

    below = qdot.kernels.EXPAND_MIN - 1
    for T in (4, 5, 8, 9, 40):
        want = np.concatenate([rows(x[t0 : min(t0 + below, T)], t.addr) for t0 in range(0, T, below)])
        assert np.array_equal(rows(x[:T], addr), want), T
    assert np.array_equal(want[:2], _mm(w, x[:2]))


def test_amx_is_taken_only_where_the_host_has_it():
    from guild.kernels.cpu.simd.amx import _amx_wanted

    spr = "+avx512f,+amx-tile,+amx-int8,+amx-bf16"
    assert _amx_wanted(spr, "") and _amx_wanted(spr, "0")
    assert not _amx_wanted(spr, "1")  # GUILD_NO_AMX=1
    assert not _amx_wanted("+avx512f,+avx512vnni", "") and not _amx_wanted("+amx-tile", "")


def test_kernels_cache_keys_are_the_same_in_every_process():
    """Numba keys a cached function by its code and its closure's pickled values: a closure holding a dispatcher
    (which pickles with a per-process id) made every process compile every kernel again (~10 s each). The entry
    points' and the AMX tiles' closures hold plain constants only, and pickle to the same bytes in a second
    process."""
    import subprocess
    import sys

    from numba.core.serialize import dumps

    def plain(v):
        return isinstance(v, (bool, int, float, str)) or (isinstance(v, tuple) and all(map(plain, v)))

    probe = ("import hashlib; from numba.core.serialize import dumps; from guild.kernels.cpu.qdot import kernels as K;"
             "print(hashlib.sha256(dumps([[c.cell_contents for c in f.__closure__] for f in K.KERNELS.values()]))"
             ".hexdigest())")
    fns = list(qdot.kernels.KERNELS.values()) + [f.py_func for f in qdot.tiles.TILE_ROWS_OF.values()]
    for f in fns:
        assert all(plain(c.cell_contents) for c in f.__closure__), f.__name__
    import hashlib

    here = hashlib.sha256(dumps([[c.cell_contents for c in f.__closure__] for f in qdot.kernels.KERNELS.values()]))
    there = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.strip()
    assert there == here.hexdigest()
