"""The int8 path's block arithmetic: one 32-element block of 16 features (group j of tile g) for one row, per
type, as integer dot products (kernels/cpu/simd/), and a super-block's float step. Inlined into the kernels
(kernels/cpu/qdot/kernels.py); the arithmetic per type is in kernels/cpu/qdot/__init__.py."""

from __future__ import annotations

import numpy as np
from numba import njit

from ...blocks import (
    GRID_IQ1S,
    GRID_IQ2S,
    GRID_IQ2XS,
    GRID_IQ2XXS,
    GRID_IQ3S,
    GRID_IQ3XXS,
    KVALUES_IQ4NL,
    KVALUES_MXFP4,
)
from ..simd import (
    AVX2,
    VNNI512,
    add_i,
    bc_i32,
    bits_i,
    cvt,
    dot4ss,
    dot8,
    dot_nib,
    dpbusd,
    e8m0_f,
    fma_f,
    gather_u32,
    hi4,
    inline_here,
    lane,
    ld_h2f,
    ld_i32,
    ld_s8,
    ld_u8,
    ld_u16,
    lo4,
    lookup16,
    madd16,
    mul_f,
    mul_i,
    neg_bytes,
    neg_i,
    or_i,
    splat_f,
    splat_i,
    st_f32,
    st_i32,
    sub_i,
    xor80,
    zero_i,
)
from .types import (
    GL,
    IQ1_M,
    IQ1_S,
    IQ2_S,
    IQ2_XS,
    IQ2_XXS,
    IQ3_S,
    IQ3_XXS,
    IQ4_NL,
    IQ4_XS,
    MXFP4,
    NJ,
    Q2_K,
    Q3_K,
    Q4_0,
    Q4_1,
    Q4_K,
    Q5_0,
    Q5_1,
    Q5_K,
    Q6_K,
    Q8_0,
    SB,
)


@njit(cache=True, inline="always")
def _put(pout, out, t, N, n0, y):
    """out[t, n0:n0 + GL] = y, clipped at N."""
    if n0 + GL <= N:
        st_f32(pout + 4 * (t * N + n0), y)
    elif n0 < N:
        for i in range(N - n0):
            out[t, n0 + i] = lane(y, i)


# ---------------------------------------------------------------------------------------------------------
# kernels: one 32-element block of 16 features (group j of tile g) for one row → y
_M1, _M2 = 0x01010101, 0x03030303


@njit(cache=True)
def _unit(g, j, nb, b):
    inline_here()
    return (g * NJ + j) * nb + b  # block b of group j of tile g: a field's units in memory order


@njit(cache=True)
def _hoff(g, nb, b, j):
    inline_here()
    return _unit(g, j, nb, b) * GL * 2  # an f16 per block [nt, NJ, nb, GL]


@njit(cache=True)
def _hsoff(g, nb, b, j):
    inline_here()
    return ((g * NJ + j) * (nb // SB) + b // SB) * GL * 2  # an f16 per super-block [nt, NJ, nb / 8, GL]


@njit(cache=True)
def _b1off(g, nb, b, j):
    inline_here()
    return _unit(g, j, nb, b) * GL  # a byte per block [nt, NJ, nb, GL]


@njit(cache=True)
def _b2off(g, nb, b, h, j):
    inline_here()
    return (_unit(g, j, nb, b) * 2 + h) * GL  # two bytes per block [nt, NJ, nb, 2, GL]


@njit(cache=True)
def _nibbles(kind, p0, ph, g, nb, b, j, xa):
    """Σ u·x̂ over the block for the nibble types (the 5th bit from the plane at ph for Q5_*)."""
    inline_here()
    oq = _unit(g, j, nb, b) * 4 * GL * 4
    five = kind == Q5_0 or kind == Q5_1 or kind == Q5_K
    hw = ld_i32(ph + _unit(g, j, nb, b) * GL * 4) if five else zero_i()
    a = zero_i()
    for q in range(4):
        w = ld_i32(p0 + oq + q * GL * 4)
        lo = lo4(w)
        hi = hi4(w)
        if five:
            lo = or_i(lo, bits_i(hw, q, _M1, 4))
            hi = or_i(hi, bits_i(hw, 4 + q, _M1, 4))
        a = dot8(a, lo, bc_i32(xa + 4 * q), hi, bc_i32(xa + 16 + 4 * q))
    return a


@njit(cache=True)
def _q4k(p0, p1, g, nb, b, j, xa, acc):
    """acc + sc·Σ u·x̂ over a Q4_K block (its 6-bit scale sc from p1): _nibbles' integer (simd.dot_nib: the high
    nibbles taken in place on VNNI, the scale applied as the i16 sums widen on AVX2)."""
    inline_here()
    oq = _unit(g, j, nb, b) * 4 * GL * 4
    return dot_nib(acc, ld_u8(p1 + _b2off(g, nb, b, 0, j)), ld_i32(p0 + oq), ld_i32(p0 + oq + GL * 4),
                   ld_i32(p0 + oq + 2 * GL * 4), ld_i32(p0 + oq + 3 * GL * 4), bc_i32(xa), bc_i32(xa + 4),
                   bc_i32(xa + 8), bc_i32(xa + 12), bc_i32(xa + 16), bc_i32(xa + 20), bc_i32(xa + 24), bc_i32(xa + 28))


# the signed levels a nibble indexes (blocks.KVALUES_*), and the same + 128 for vpdpbusd's unsigned operand
_lut_iq4_s, _lut_iq4_u = lookup16(KVALUES_IQ4NL), lookup16(KVALUES_IQ4NL.astype(np.int32) + 128)
_lut_fp4_s, _lut_fp4_u = lookup16(KVALUES_MXFP4), lookup16(KVALUES_MXFP4.astype(np.int32) + 128)
_SIGNED = AVX2 and not VNNI512  # signed levels, |w| · sign(x, w) pairs; else unsigned levels + 128 (vpdpbusd)


@njit(cache=True)
def _levels(kind, v):
    inline_here()
    if kind == MXFP4:
        return _lut_fp4_s(v) if _SIGNED else _lut_fp4_u(v)
    return _lut_iq4_s(v) if _SIGNED else _lut_iq4_u(v)


@njit(cache=True)
def _lut_dot(kind, p0, g, nb, b, j, xa, sx):
    """Σ w·x̂ over the block for the table types: each nibble looked up in the type's signed levels."""
    inline_here()
    oq = _unit(g, j, nb, b) * 4 * GL * 4
    a = zero_i()
    for q in range(4):
        w = ld_i32(p0 + oq + q * GL * 4)
        if _SIGNED:
            a = dot4ss(a, _levels(kind, lo4(w)), bc_i32(xa + 4 * q))
            a = dot4ss(a, _levels(kind, hi4(w)), bc_i32(xa + 16 + 4 * q))
        else:
            a = dpbusd(a, _levels(kind, lo4(w)), bc_i32(xa + 4 * q))
            a = dpbusd(a, _levels(kind, hi4(w)), bc_i32(xa + 16 + 4 * q))
    return a if _SIGNED else sub_i(a, splat_i(128 * sx))


_G2XXS, _G2XS, _G2S, _G3XXS, _G3S = GRID_IQ2XXS, GRID_IQ2XS, GRID_IQ2S, GRID_IQ3XXS, GRID_IQ3S
_G1S_U = (GRID_IQ1S + 1).astype(np.uint8)  # IQ1_S's values −1, 0, 1 as unsigned 0..2 (Σ x̂ taken back out)


@njit(cache=True)
def _iq1s(p0, p1, g, nb, b, j, xa, sx):
    """sc · (8 Σ g·x̂ + σ Σ x̂) for IQ1_S's block: the grid values g ∈ {−1, 0, 1} (read as g + 1), the scale
    sc = 2s + 1 and σ the sign of ±IQ1S_DELTA = ±1/8 from the block's u16."""
    inline_here()
    qh = ld_u16(p1 + _hoff(g, nb, b, j))
    base = _G1S_U.ctypes.data
    a = zero_i()
    for gl in range(4):
        ix = or_i(ld_u8(p0 + (_unit(g, j, nb, b) * 4 + gl) * GL), bits_i(qh, 3 * gl, 7, 8))
        a = dot8(a, gather_u32(base, ix, 8, 0), bc_i32(xa + 8 * gl), gather_u32(base, ix, 8, 4),
                 bc_i32(xa + 8 * gl + 4))
    s = splat_i(sx)
    tot = add_i(mul_i(sub_i(a, s), splat_i(8)), mul_i(sub_i(splat_i(1), bits_i(qh, 15, 1, 1)), s))
    return mul_i(or_i(bits_i(qh, 12, 7, 1), splat_i(1)), tot)


@njit(cache=True)
def _grid(kind):
    inline_here()
    if kind == IQ2_XXS:
        return _G2XXS.ctypes.data
    if kind == IQ2_XS:
        return _G2XS.ctypes.data
    if kind == IQ2_S:
        return _G2S.ctypes.data
    if kind == IQ3_XXS:
        return _G3XXS.ctypes.data
    return _G3S.ctypes.data


@njit(cache=True)
def _gidx(kind, pi, ph, g, nb, b, j, ngr, gl):
    """Grid indices of group gl (of ngr per block) for the 16 features: the low byte and the bits above it."""
    inline_here()
    lo = ld_u8(pi + (_unit(g, j, nb, b) * ngr + gl) * GL)
    if kind == IQ2_XXS or kind == IQ3_XXS:
        return lo
    hb = ld_u8(ph + _unit(g, j, nb, b) * GL)
    if kind == IQ2_S:
        return or_i(lo, bits_i(hb, 2 * gl, 3, 8))
    return or_i(lo, bits_i(hb, gl, 1, 8))


@njit(cache=True)
def _grid_dot(kind, pi, ps, ph, g, nb, b, j, xa):
    """(Σ_A, Σ_B) over the block's halves of |w|·(±x̂) for the grid types: the magnitudes of each quad read from
    the type's grid by index, the signs applied to the activations' bytes (u8 magnitudes ≤ 62: dot8 is exact)."""
    inline_here()
    base = _grid(kind)
    sw = ld_i32(ps + _unit(g, j, nb, b) * GL * 4)
    aA = zero_i()
    aB = zero_i()
    if kind == IQ3_XXS or kind == IQ3_S:  # an index per 4 elements (quad r), 4-byte entries
        for r in range(0, 8, 2):
            u0 = gather_u32(base, _gidx(kind, pi, ph, g, nb, b, j, 8, r), 4, 0)
            u1 = gather_u32(base, _gidx(kind, pi, ph, g, nb, b, j, 8, r + 1), 4, 0)
            x0 = neg_bytes(bc_i32(xa + 4 * r), sw, r)
            x1 = neg_bytes(bc_i32(xa + 4 * r + 4), sw, r + 1)
            if r < 4:
                aA = dot8(aA, u0, x0, u1, x1)
            else:
                aB = dot8(aB, u0, x0, u1, x1)
    else:  # an index per 8 elements (quads 2l, 2l + 1), 8-byte entries
        for gl in range(4):
            ix = _gidx(kind, pi, ph, g, nb, b, j, 4, gl)
            u0 = gather_u32(base, ix, 8, 0)
            u1 = gather_u32(base, ix, 8, 4)
            x0 = neg_bytes(bc_i32(xa + 8 * gl), sw, 2 * gl)
            x1 = neg_bytes(bc_i32(xa + 8 * gl + 4), sw, 2 * gl + 1)
            if gl < 2:
                aA = dot8(aA, u0, x0, u1, x1)
            else:
                aB = dot8(aB, u0, x0, u1, x1)
    return aA, aB


GRID_TILE_ROWS = 3  # from this many rows the grid types decode a tile's magnitudes once for all its rows
_DEC = 8 * 64  # decoded bytes per block and 16 features: 8 quads of 16 lanes × 4 magnitudes


@njit(cache=True)
def _grid_decode(kind, pi, ph, g, nb, j, pd):
    """The magnitudes of group j's 16 features for every block, as _grid_dot's gathers read them: quad r of
    block b (elements 4r..4r + 3) at pd + b·_DEC + 64 r."""
    inline_here()
    base = _grid(kind)
    for b in range(nb):
        o = pd + b * _DEC
        if kind == IQ3_XXS or kind == IQ3_S:
            for r in range(8):
                st_i32(o + 64 * r, gather_u32(base, _gidx(kind, pi, ph, g, nb, b, j, 8, r), 4, 0))
        else:
            for gl in range(4):
                ix = _gidx(kind, pi, ph, g, nb, b, j, 4, gl)
                st_i32(o + 128 * gl, gather_u32(base, ix, 8, 0))
                st_i32(o + 128 * gl + 64, gather_u32(base, ix, 8, 4))


@njit(cache=True)
def _grid_blk(kind, ps, p2, g, nb, b, j, xa, pd):
    """_iblk's integer sum for the grid types from magnitudes decoded by _grid_decode: exactly the gathering
    path's integers, so the same bits."""
    inline_here()
    sw = ld_i32(ps + _unit(g, j, nb, b) * GL * 4)
    o = pd + b * _DEC
    aA = zero_i()
    aB = zero_i()
    for r in range(0, 8, 2):
        x0 = neg_bytes(bc_i32(xa + 4 * r), sw, r)
        x1 = neg_bytes(bc_i32(xa + 4 * r + 4), sw, r + 1)
        if r < 4:
            aA = dot8(aA, ld_i32(o + 64 * r), x0, ld_i32(o + 64 * r + 64), x1)
        else:
            aB = dot8(aB, ld_i32(o + 64 * r), x0, ld_i32(o + 64 * r + 64), x1)
    return _grid_int(kind, p2, g, nb, b, j, aA, aB)


@njit(cache=True)
def _iq1m(p0, p1, p2, g, nb, b, j, xa, sA, sB):
    """sc_A·tot_A + sc_B·tot_B for IQ1_M's block, tot_h = 8 Σ g·x̂ + Σ_l σ_l s_l over the half's two groups of 8
    (s_l their activation sums, σ_l the sign of their ±1/8 delta), sc = 2s + 1 per half."""
    inline_here()
    base = _G1S_U.ctypes.data
    ones = splat_i(0x01010101)
    sc = ld_u8(p2 + _b1off(g, nb, b, j))
    acc = zero_i()
    for h in range(2):
        qb = ld_u8(p1 + _b2off(g, nb, b, h, j))
        a = zero_i()
        d = zero_i()
        for e in range(2):
            gl = 2 * h + e
            ix = or_i(ld_u8(p0 + (_unit(g, j, nb, b) * 4 + gl) * GL), bits_i(qb, 4 * e, 7, 8))
            x0 = bc_i32(xa + 8 * gl)
            x1 = bc_i32(xa + 8 * gl + 4)
            a = dot8(a, gather_u32(base, ix, 8, 0), x0, gather_u32(base, ix, 8, 4), x1)
            sl = dot8(zero_i(), ones, x0, ones, x1)  # the group's activation sum, in every lane
            d = add_i(d, mul_i(sub_i(splat_i(1), bits_i(qb, 4 * e + 3, 1, 1)), sl))
        s = splat_i(sA) if h == 0 else splat_i(sB)
        tot = add_i(mul_i(sub_i(a, s), splat_i(8)), d)
        acc = add_i(acc, mul_i(or_i(bits_i(sc, 3 * h, 7, 1), splat_i(1)), tot))
    return acc


@njit(cache=True)
def _halves2(kind, p0, ph, g, nb, b, j, xa):
    """(Σ_A, Σ_B) of u·x̂ over the block's two halves for the 2-bit-quad types (Q3_K's 3rd bit from ph)."""
    inline_here()
    o = _unit(g, j, nb, b) * 2 * GL * 4
    hw = ld_i32(ph + _unit(g, j, nb, b) * GL * 4) if kind == Q3_K else zero_i()
    aA = zero_i()
    aB = zero_i()
    for h in range(2):
        w = ld_i32(p0 + o + h * GL * 4)
        a = zero_i()
        for q in range(0, 4, 2):
            u0 = bits_i(w, 2 * q, _M2, 0)
            u1 = bits_i(w, 2 * q + 2, _M2, 0)
            if kind == Q3_K:
                u0 = or_i(u0, bits_i(hw, 4 * h + q, _M1, 2))
                u1 = or_i(u1, bits_i(hw, 4 * h + q + 1, _M1, 2))
            a = dot8(a, u0, bc_i32(xa + 16 * h + 4 * q), u1, bc_i32(xa + 16 * h + 4 * q + 4))
        if h == 0:
            aA = a
        else:
            aB = a
    return aA, aB


@njit(cache=True)
def _q6(p0, ph, g, nb, b, j, xa):
    """(Σ_A, Σ_B) of u·x̂ for Q6_K: low nibbles from the quads, the two high bits from the planes."""
    inline_here()
    oq = _unit(g, j, nb, b) * 4 * GL * 4
    oh = _unit(g, j, nb, b) * 2 * GL * 4
    h0 = ld_i32(ph + oh)
    h1 = ld_i32(ph + oh + GL * 4)
    aA = zero_i()
    aB = zero_i()
    for q in range(0, 4, 2):
        w0 = ld_i32(p0 + oq + q * GL * 4)
        w1 = ld_i32(p0 + oq + (q + 1) * GL * 4)
        aA = dot8(aA, or_i(lo4(w0), bits_i(h0, 2 * q, _M2, 4)), bc_i32(xa + 4 * q),
                  or_i(lo4(w1), bits_i(h0, 2 * q + 2, _M2, 4)), bc_i32(xa + 4 * q + 4))
        aB = dot8(aB, or_i(hi4(w0), bits_i(h1, 2 * q, _M2, 4)), bc_i32(xa + 16 + 4 * q),
                  or_i(hi4(w1), bits_i(h1, 2 * q + 2, _M2, 4)), bc_i32(xa + 20 + 4 * q))
    return aA, aB


@njit(cache=True)
def _blk(kind, p0, p1, p2, p3, g, nb, b, j, xa, xd, sx, xs, y):
    """y + the contribution of block b to the 16 features of group j (fields p0.. in the type's order) for one
    row of a 32-element-block type (its quantised block at xa, scale xd, Σq sx, xd·Σq xs)."""
    inline_here()
    dx = splat_f(xd)
    if kind == Q8_0:
        o = _unit(g, j, nb, b) * 8 * GL * 4
        a = zero_i()
        if AVX2 and not VNNI512:  # signed bytes: |w| · sign(x, w) pairs stay within i16
            for q in range(8):
                a = dot4ss(a, xor80(ld_i32(p0 + o + q * GL * 4)), bc_i32(xa + 4 * q))
        else:
            for q in range(8):
                a = dpbusd(a, ld_i32(p0 + o + q * GL * 4), bc_i32(xa + 4 * q))
            a = sub_i(a, splat_i(128 * sx))
        return fma_f(cvt(a), mul_f(ld_h2f(p1 + _hoff(g, nb, b, j)), dx), y)
    if kind == IQ4_NL or kind == MXFP4:
        a = _lut_dot(kind, p0, g, nb, b, j, xa, sx)
        if kind == IQ4_NL:
            return fma_f(cvt(a), mul_f(ld_h2f(p1 + _hoff(g, nb, b, j)), dx), y)
        return fma_f(cvt(a), mul_f(e8m0_f(ld_u8(p1 + _b1off(g, nb, b, j))), dx), y)
    if kind == Q4_0 or kind == Q4_1:
        a = _nibbles(kind, p0, p0, g, nb, b, j, xa)
        if kind == Q4_0:
            return fma_f(cvt(sub_i(a, splat_i(8 * sx))), mul_f(ld_h2f(p1 + _hoff(g, nb, b, j)), dx), y)
        y = fma_f(cvt(a), mul_f(ld_h2f(p1 + _hoff(g, nb, b, j)), dx), y)
        return fma_f(ld_h2f(p2 + _hoff(g, nb, b, j)), splat_f(xs), y)
    # Q5_0, Q5_1
    a = _nibbles(kind, p0, p1, g, nb, b, j, xa)
    if kind == Q5_0:
        return fma_f(cvt(sub_i(a, splat_i(16 * sx))), mul_f(ld_h2f(p2 + _hoff(g, nb, b, j)), dx), y)
    y = fma_f(cvt(a), mul_f(ld_h2f(p2 + _hoff(g, nb, b, j)), dx), y)
    return fma_f(ld_h2f(p3 + _hoff(g, nb, b, j)), splat_f(xs), y)


@njit(cache=True)
def _grid_int(kind, p2, g, nb, b, j, aA, aB):
    """The grid types' integer block sum: sc·(a_A + a_B), or sc_A·a_A + sc_B·a_B (IQ2_XS, IQ2_S: 2s + 1 per
    half from the byte's two nibbles)."""
    inline_here()
    v = ld_u8(p2 + _b1off(g, nb, b, j))
    if kind == IQ2_XS or kind == IQ2_S:
        one = splat_i(1)
        return add_i(mul_i(or_i(bits_i(v, 0, 15, 1), one), aA), mul_i(or_i(bits_i(v, 4, 15, 1), one), aB))
    return mul_i(v, add_i(aA, aB))


@njit(cache=True)
def _iblk(kind, p0, p1, p2, p3, p4, g, nb, b, j, xa, sx, sA, sB, acc, macc):
    """Block b of a super-block kind for one row, in integers: acc + the block's scaled sum, macc + its
    scaled min term (Q4_K, Q5_K, Q2_K); exact in int32 over a super-block's 8 blocks."""
    inline_here()
    if kind == Q4_K:
        mn = ld_u8(p1 + _b2off(g, nb, b, 1, j))
        return _q4k(p0, p1, g, nb, b, j, xa, acc), add_i(macc, madd16(mn, splat_i(sx)))
    if kind == Q5_K:
        a = _nibbles(kind, p0, p1, g, nb, b, j, xa)
        sc = ld_u8(p2 + _b2off(g, nb, b, 0, j))
        mn = ld_u8(p2 + _b2off(g, nb, b, 1, j))
        return add_i(acc, mul_i(sc, a)), add_i(macc, madd16(mn, splat_i(sx)))
    if kind == Q6_K or kind == Q3_K:
        if kind == Q6_K:
            aA, aB = _q6(p0, p1, g, nb, b, j, xa)
            c = 32
        else:
            aA, aB = _halves2(kind, p0, p1, g, nb, b, j, xa)
            c = 4
        t = add_i(mul_i(ld_s8(p2 + _b2off(g, nb, b, 0, j)), sub_i(aA, splat_i(c * sA))),
                  mul_i(ld_s8(p2 + _b2off(g, nb, b, 1, j)), sub_i(aB, splat_i(c * sB))))
        return add_i(acc, t), macc
    if kind == Q2_K:  # scale in the low nibble of each byte, min in the high nibble
        aA, aB = _halves2(kind, p0, p0, g, nb, b, j, xa)
        vA = ld_u8(p1 + _b2off(g, nb, b, 0, j))
        vB = ld_u8(p1 + _b2off(g, nb, b, 1, j))
        # |aA|, |aB| <= 16·3·127 and the half sums <= 16·127: every product one vpmaddwd (madd16)
        acc = add_i(acc, add_i(madd16(bits_i(vA, 0, 15, 0), aA), madd16(bits_i(vB, 0, 15, 0), aB)))
        return acc, add_i(macc, add_i(madd16(bits_i(vA, 4, 15, 0), splat_i(sA)),
                                       madd16(bits_i(vB, 4, 15, 0), splat_i(sB))))
    if kind == IQ4_XS:
        return add_i(acc, mul_i(ld_s8(p1 + _b1off(g, nb, b, j)), _lut_dot(kind, p0, g, nb, b, j, xa, sx))), macc
    if kind == IQ1_S:
        return add_i(acc, _iq1s(p0, p1, g, nb, b, j, xa, sx)), macc
    if kind == IQ1_M:
        return add_i(acc, _iq1m(p0, p1, p2, g, nb, b, j, xa, sA, sB)), macc
    aA, aB = _grid_dot(kind, p0, p1, p4, g, nb, b, j, xa)
    return add_i(acc, _grid_int(kind, p2, g, nb, b, j, aA, aB)), macc


@njit(cache=True)
def _sfin(kind, p1, p2, p3, p4, g, nb, b, j, acc, macc, xd, y):
    """y + a super-block's integer sums (_iblk over its 8 blocks, b its first) times D·dx (and −macc·M·dx):
    one rounding of each sum, the float chain over super-blocks fixed per (row, feature)."""
    inline_here()
    dx = splat_f(xd)
    pd = p2 if kind == Q4_K or kind == Q2_K or kind == IQ4_XS or kind == IQ1_S else p3  # the field d
    d = mul_f(ld_h2f(pd + _hsoff(g, nb, b, j)), dx)
    # ggml's (0.5 + s)·c factors of the grid types: 1/8 (IQ2_*, IQ1_*), 1/4 (IQ3_XXS), 1 (IQ3_S)
    if (kind == IQ2_XXS or kind == IQ2_XS or kind == IQ2_S or kind == IQ3_XXS or kind == IQ3_S or kind == IQ1_S
            or kind == IQ1_M):
        f = 0.25 if kind == IQ3_XXS else (1.0 if kind == IQ3_S else 0.125)
        d = mul_f(d, splat_f(np.float32(f)))
    y = fma_f(cvt(acc), d, y)
    if kind == Q4_K or kind == Q2_K or kind == Q5_K:
        pm = p4 if kind == Q5_K else p3
        y = fma_f(cvt(neg_i(macc)), mul_f(ld_h2f(pm + _hsoff(g, nb, b, j)), dx), y)
    return y

