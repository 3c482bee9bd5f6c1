"""The int8 path on AMX tiles (simd/amx.py): whole tiles of 16 rows of a product, the same
integers as the vector kernels (dots.py) and the same float step (_sfin), so every row stays bitwise what it
gets alone.

A super-block's integer sum needs each block's (or half-block's) integer scale inside it, where a tile product
sums over all of k. So the weights are expanded with their scales in, split into bytes, per group of 16 features
and super-block (in L1 for every tile of rows that reads it, four bytes of a feature's k per 32-bit column
entry: the quad layout's own), and the per-block terms taken out of the activations' sums are one more small
tile product over the blocks, their sums split into bytes the same way:
  Q4_K, Q5_K: i = sc·Σ u·x̂ (u ≤ 15 or 31, sc ≤ 63), m = mn·s. sc = 8·sh + sl (sh, sl ≤ 7): u·sh and u·sl ≤ 217
        are bytes and Σ i = 8·(x̂ · B_sh) + x̂ · B_sl; Σ m = Σ mn·s over the 8 blocks, s = 128·(s >> 7) + (s & 127).
  Q6_K, Q3_K: i = sc·(Σ u·x̂ − c s) per half-block (u ≤ 63 or 7, sc a signed byte, c = 32 or 4). u·sc = 128·hi +
        lo (lo = its low 7 bits, |hi| ≤ 63): Σ u·sc·x̂ = 128·(x̂ · B_hi) + x̂ · B_lo, less c·Σ sc·s over the 16
        halves.
  Q2_K: i = sc·Σ u·x̂, m = mn·s per half-block (u ≤ 3, sc, mn ≤ 15): u·sc ≤ 45 is a byte, one product.
  IQ4_XS: i = sc·Σ v·x̂ (v its signed level, |v| ≤ 127, sc −32..31): v·sc = 128·hi + lo as Q6_K's, no terms.
Two products (Q2_K: one) over k = 256 a tile of rows and super-block, with nothing per block between them.
Q8_0 has a float step per 32-element block, so its tiles are one product of k = 32 per block and group (its
packed quads, q + 128, are B's layout as they lie), A loaded once for the tile's four groups, and each block's
float steps overlap the next blocks' products."""

from __future__ import annotations

import numpy as np
from numba import njit

from ..drivers import NT
from ..simd import (
    add_i,
    bits_i,
    cvt,
    fma_f,
    hi4,
    ld_f32,
    ld_h2f,
    ld_i32,
    ld_s8,
    ld_u8,
    lo4,
    mul_f,
    mul_i,
    mul_w,
    or_i,
    splat_f,
    splat_i,
    sra_w,
    st_f32,
    st_i32,
    sub_i,
    zero_f,
    zero_i,
)
from ..simd.amx import (
    tile_dpbssd,
    tile_dpbsud,
    tile_load,
    tile_load_config,
    tile_release,
    tile_shape,
    tile_store,
    tile_zero,
)
from .dots import _M1, _M2, _b1off, _b2off, _hoff, _lut_iq4_s, _put, _sfin, _unit
from .types import GL, IQ4_XS, NJ, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_0, QB, SB

TILE_ROWS = 16  # rows of activations a tile product takes
TILE_MIN = 12  # rows from which a product takes the tiles: 1.2-1.3x the vector kernels at 12, 0.9x at 8
_CHUNK = 2048  # scratch bytes per 64 elements of k: B_hi's tile (16 rows x 64 bytes), then B_lo's
_TERMS = 256  # scratch bytes of a super-block's per-block factors (mins or scales): up to 4 tile rows of 64
# tile registers: A (16 rows x 64 bytes of x̂), B_hi, B_lo, their products; the sums' two byte parts (16 rows x
# the super-block's 8 blocks or 16 halves) and the per-block factors (2 or 4 rows x 64 bytes)
_A, _BH, _BL, _CH, _CL, _SL, _SH, _M = 0, 1, 2, 3, 4, 5, 6, 7
# Q8_0's: A (16 rows x 32 bytes of a block), B in 1 and 2 by turns, the four groups' products in 3..6
_A0 = 0


_SCRATCH = SB // 2 * _CHUNK + _TERMS  # bytes of one super-block of a group of 16 features, expanded


@njit(cache=True, inline="always")
def _pair16(v):
    """A byte per lane (a small unsigned value or a sign-extended one) in both 16-bit halves (mul_w's
    multiplier)."""
    return or_i(bits_i(v, 0, 0xFFFF, 0), bits_i(v, 0, 0xFFFF, 16))


@njit(cache=True, inline="always")
def _split(pe, po, ph, pl):
    """16-bit products of a lane's even and odd bytes (|p| < 2^13) as 128·hi + lo per byte: hi's bytes to ph,
    lo's (7 bits) to pl."""
    st_i32(pl, or_i(bits_i(pe, 0, 0x007F007F, 0), bits_i(po, 0, 0x007F007F, 8)))
    st_i32(ph, or_i(bits_i(sra_w(pe, 7), 0, 0x00FF00FF, 0), bits_i(sra_w(po, 7), 0, 0x00FF00FF, 8)))


@njit(cache=True, inline="always")
def _split_products(u, sc2, ph, pl):
    """The 4 unsigned bytes u (≤ 63) of each lane times its signed scale (sc2: _pair16), split (_split)."""
    _split(mul_w(bits_i(u, 0, 0x00FF00FF, 0), sc2), mul_w(bits_i(u, 8, 0x00FF00FF, 0), sc2), ph, pl)


@njit(cache=True, inline="always")
def _split_signed(v, sc2, ph, pl):
    """The 4 signed bytes v of each lane times its signed scale (sc2: _pair16), split (_split)."""
    _split(mul_w(sra_w(bits_i(v, 0, 0x00FF00FF, 8), 8), sc2), mul_w(sra_w(v, 8), sc2), ph, pl)


@njit(cache=True, inline="always")
def _expand(kind, p0, p1, p2, g, nb, j, s, pb):
    """Super-block s (its first block) of group j of tile g, expanded at pb (_SCRATCH bytes): per block, 8 tile rows
    (k = 4r..4r + 3 of the block in each 32-bit column entry) of B_hi, the same of B_lo; then the per-block
    factors, four a 32-bit column entry (Q4_K, Q5_K: the 8 mins in 2 rows; the others: the 16 half-blocks' scales
    or, Q2_K, mins in 4)."""
    pm = pb + SB // 2 * _CHUNK
    m = zero_i()
    for b in range(s, s + SB):
        oq = _unit(g, j, nb, b) * 4 * GL * 4
        base = pb + (b - s) // 2 * _CHUNK + (b % 2) * 8 * 64
        if kind == Q4_K or kind == Q5_K:
            psm = p1 if kind == Q4_K else p2  # the scales and mins
            hw = ld_i32(p1 + _unit(g, j, nb, b) * GL * 4) if kind == Q5_K else zero_i()  # Q5_K's 5th bits
            sc = ld_u8(psm + _b2off(g, nb, b, 0, j))
            sh = _pair16(bits_i(sc, 3, 7, 0))
            sl = _pair16(bits_i(sc, 0, 7, 0))
            for q in range(4):
                w = ld_i32(p0 + oq + q * GL * 4)
                lo = or_i(lo4(w), bits_i(hw, q, _M1, 4))  # elements 4q..4q + 3 of the block
                hi = or_i(hi4(w), bits_i(hw, 4 + q, _M1, 4))  # elements 16 + 4q..
                st_i32(base + q * 64, mul_w(lo, sh))  # bytes ≤ 31·7: no carry between them
                st_i32(base + (4 + q) * 64, mul_w(hi, sh))
                st_i32(base + 1024 + q * 64, mul_w(lo, sl))
                st_i32(base + 1024 + (4 + q) * 64, mul_w(hi, sl))
            m = or_i(m, bits_i(ld_u8(psm + _b2off(g, nb, b, 1, j)), 0, 0xFF, 8 * (b % 4)))
            if b % 4 == 3:
                st_i32(pm + (b - s) // 4 * 64, m)
                m = zero_i()
        elif kind == IQ4_XS:  # the signed levels (≤ 127) times the block's signed scale (−32..31)
            sc2 = _pair16(ld_s8(p1 + _b1off(g, nb, b, j)))
            for q in range(4):
                w = ld_i32(p0 + oq + q * GL * 4)
                _split_signed(_lut_iq4_s(lo4(w)), sc2, base + q * 64, base + 1024 + q * 64)
                _split_signed(_lut_iq4_s(hi4(w)), sc2, base + (4 + q) * 64, base + 1024 + (4 + q) * 64)
        else:  # one factor a half-block: a scale (and Q2_K's min) for each 16 elements
            if kind == Q6_K:  # u: the nibble and the two bits above it from the planes (dots._q6)
                oh = _unit(g, j, nb, b) * 2 * GL * 4
                h0 = ld_i32(p1 + oh)
                h1 = ld_i32(p1 + oh + GL * 4)
                sA = ld_s8(p2 + _b2off(g, nb, b, 0, j))
                sB = ld_s8(p2 + _b2off(g, nb, b, 1, j))
                for q in range(4):
                    w = ld_i32(p0 + oq + q * GL * 4)
                    _split_products(or_i(lo4(w), bits_i(h0, 2 * q, _M2, 4)), _pair16(sA), base + q * 64,
                                    base + 1024 + q * 64)
                    _split_products(or_i(hi4(w), bits_i(h1, 2 * q, _M2, 4)), _pair16(sB), base + (4 + q) * 64,
                                    base + 1024 + (4 + q) * 64)
            else:  # Q2_K, Q3_K: u from the 2-bit quads (Q3_K's 3rd bit from the plane, dots._halves2)
                o2 = _unit(g, j, nb, b) * 2 * GL * 4
                hw = ld_i32(p1 + _unit(g, j, nb, b) * GL * 4) if kind == Q3_K else zero_i()
                if kind == Q2_K:  # the scale in each byte's low nibble, the min in its high one
                    vA = ld_u8(p1 + _b2off(g, nb, b, 0, j))
                    vB = ld_u8(p1 + _b2off(g, nb, b, 1, j))
                    sA = bits_i(vA, 4, 15, 0)  # the mins: the per-half factors
                    sB = bits_i(vB, 4, 15, 0)
                    cA = _pair16(bits_i(vA, 0, 15, 0))
                    cB = _pair16(bits_i(vB, 0, 15, 0))
                else:
                    sA = ld_s8(p2 + _b2off(g, nb, b, 0, j))
                    sB = ld_s8(p2 + _b2off(g, nb, b, 1, j))
                    cA = _pair16(sA)
                    cB = _pair16(sB)
                for h in range(2):
                    w = ld_i32(p0 + o2 + h * GL * 4)
                    for q in range(4):
                        u = or_i(bits_i(w, 2 * q, _M2, 0), bits_i(hw, 4 * h + q, _M1, 2))
                        r = base + (4 * h + q) * 64
                        if kind == Q2_K:  # u·sc ≤ 45: one byte, B_lo alone
                            st_i32(r + 1024, mul_w(u, cA if h == 0 else cB))
                        else:
                            _split_products(u, cA if h == 0 else cB, r, r + 1024)
            m = or_i(m, or_i(bits_i(sA, 0, 0xFF, 16 * (b % 2)), bits_i(sB, 0, 0xFF, 16 * (b % 2) + 8)))
            if b % 2 == 1:
                st_i32(pm + (b - s) // 2 * 64, m)
                m = zero_i()


@njit(cache=True, inline="always")
def _dp(kind, c, a, b):
    """C += A·B, B's bytes unsigned (Q4_K's, Q5_K's and Q2_K's weights and mins) or signed (Q6_K's, Q3_K's,
    IQ4_XS's)."""
    if kind != Q6_K and kind != Q3_K and kind != IQ4_XS:
        tile_dpbsud(c, a, b)
    else:
        tile_dpbssd(c, a, b)


@njit(cache=True, inline="always")
def _tiles(kind, p0, p1, p2, p3, p4, nb, pxp, T, Kp, g, j, xd, wb, cb, yb, sxb):
    """Rows 0..T − 1 of group j of tile g into yb [Tp, 16] f32 (Tp: T rounded up to 16): per super-block, its
    weights expanded (_expand), then per tile of 16 rows the tile products and per row _sfin as in _super_rows.
    wb: _SCRATCH bytes, cb: 4 KiB for the int32 results, sxb [2, Tp, terms]: the activations' sums per term,
    low 7 bits and the rest (0 past T); arrays, so that they live as long as the caller's loop. Rows are taken
    16 at a time (_tile_at). The caller has loaded the tile configuration."""
    pb, pc, py, ps = wb.ctypes.data, cb.ctypes.data, yb.ctypes.data, sxb.ctypes.data
    Tp = sxb.shape[1]
    pm = pb + SB // 2 * _CHUNK
    nk = nb * (1 if kind == Q4_K or kind == Q5_K else 2)  # the sums' parts a row holds
    for t in range(Tp):
        st_f32(py + t * 64, zero_f())
    for s in range(0, nb, SB):
        _expand(kind, p0, p1, p2, g, nb, j, s, pb)
        k0 = s * (1 if kind == Q4_K or kind == Q5_K else 2)
        for t0 in range(0, T, TILE_ROWS):
            ta = _tile_at(t0, T)
            pa = pxp + ta * Kp
            tile_zero(_CH)
            tile_zero(_CL)
            for c in range(SB // 2):
                tile_load(_A, pa + s * 32 + c * 64, Kp)
                tile_load(_BL, pb + c * _CHUNK + 1024, 64)
                if kind != Q2_K:  # Q2_K's weights and scales fit B_lo alone
                    tile_load(_BH, pb + c * _CHUNK, 64)
                    _dp(kind, _CH, _A, _BH)
                _dp(kind, _CL, _A, _BL)
            tile_store(_CH, pc, 64)
            tile_store(_CL, pc + 1024, 64)
            if kind != IQ4_XS:  # IQ4_XS has no per-block terms
                tile_zero(_CH)
                tile_zero(_CL)
                tile_load(_SL, ps + ta * nk + k0, nk)
                tile_load(_SH, ps + (Tp + ta) * nk + k0, nk)
                tile_load(_M, pm, 64)
                _dp(kind, _CL, _SL, _M)
                _dp(kind, _CH, _SH, _M)
                tile_store(_CL, pc + 2048, 64)
                tile_store(_CH, pc + 3072, 64)
            for t in range(t0, min(t0 + TILE_ROWS, T)):
                o = (t - ta) * 64
                if kind == IQ4_XS:
                    terms_ = zero_i()
                else:
                    terms_ = add_i(ld_i32(pc + 2048 + o), mul_i(ld_i32(pc + 3072 + o), splat_i(np.int32(128))))
                if kind == Q4_K or kind == Q5_K:
                    acc = add_i(mul_i(ld_i32(pc + o), splat_i(np.int32(8))), ld_i32(pc + 1024 + o))
                    macc = terms_
                elif kind == Q2_K:
                    acc = ld_i32(pc + 1024 + o)
                    macc = terms_
                else:  # Q6_K, Q3_K, IQ4_XS: 128·hi + lo; Q6_K, Q3_K less 32 or 4 times Σ scale·half-sum
                    acc = add_i(mul_i(ld_i32(pc + o), splat_i(np.int32(128))), ld_i32(pc + 1024 + o))
                    if kind != IQ4_XS:
                        acc = sub_i(acc, mul_i(terms_, splat_i(np.int32(32 if kind == Q6_K else 4))))
                    macc = zero_i()
                y = _sfin(kind, p1, p2, p3, p4, g, nb, s, j, acc, macc, xd[t, s], ld_f32(py + t * 64))
                st_f32(py + t * 64, y)


@njit(cache=True, inline="always")
def _tile_at(t0, T):
    """The first row of the tile of 16 that holds rows t0..min(t0 + 16, T) − 1: t0 itself, or for a last tile of
    fewer rows the 16 that end at T (their earlier rows' results, already taken, are not read again), or under 16
    rows 0 (rows T..15 of A read on into the activations' own fields: a call's activations are T·Kp bytes of
    x̂ then ACT_EXTRA = 20 bytes a row and block, 52·T·nb ≥ 16·Kp = 512·nb from T = 10 rows, below TILE_MIN;
    each row of C depends on its own row of A alone, and those past T are not read)."""
    return t0 if t0 + TILE_ROWS <= T else max(T - TILE_ROWS, 0)


@njit(cache=True, inline="always")
def _q8_pass(p0, b, g, nb, j, cb, tb, tc):
    """Group j's block b (tb: its B register) times A (block b of 16 rows) into C register tc, stored at cb's
    j-th KiB."""
    tile_load(tb, p0 + _unit(g, j, nb, b) * 8 * GL * 4, 64)
    tile_zero(tc)
    tile_dpbsud(tc, _A0, tb)
    tile_store(tc, cb + 1024 * j, 64)


@njit(cache=True, inline="always")
def _q8_products(p0, pa, Kp, b, g, nb, pb):
    """Block b of the four groups of tile g times A (block b of 16 rows at pa, rows Kp apart): the four int32
    sums (16 rows x 16 features each) to pb, pb + 1024, ..."""
    tile_load(_A0, pa + b * QB, Kp)
    _q8_pass(p0, b, g, nb, 0, pb, 1, 3)
    _q8_pass(p0, b, g, nb, 1, pb, 2, 4)
    _q8_pass(p0, b, g, nb, 2, pb, 1, 5)
    _q8_pass(p0, b, g, nb, 3, pb, 2, 6)


@njit(cache=True, inline="always")
def _q8_step(y, c, s, d, dx):
    return fma_f(cvt(sub_i(ld_i32(c), s)), mul_f(d, dx), y)


@njit(cache=True, inline="always")
def _q8_steps(p1, nb, g, b, nblk, xd, sx, ta, t0, t1, pc, py):
    """Rows t0..t1 − 1 of y [T, NJ, GL] (at py) + the float steps of blocks b..b + nblk − 1 (1 or 2), their
    four groups' sums at pc, pc + 4096 (16 rows x 16 int32 a group, from row ta): (C − 128·Σx̂)·(d·dx) in block
    order, _blk's."""
    d0 = ld_h2f(p1 + _hoff(g, nb, b, 0))
    d1 = ld_h2f(p1 + _hoff(g, nb, b, 1))
    d2 = ld_h2f(p1 + _hoff(g, nb, b, 2))
    d3 = ld_h2f(p1 + _hoff(g, nb, b, 3))
    e = b + nblk - 1
    e0 = ld_h2f(p1 + _hoff(g, nb, e, 0))
    e1 = ld_h2f(p1 + _hoff(g, nb, e, 1))
    e2 = ld_h2f(p1 + _hoff(g, nb, e, 2))
    e3 = ld_h2f(p1 + _hoff(g, nb, e, 3))
    for t in range(t0, t1):
        o = py + 256 * t
        c = pc + 64 * (t - ta)
        dx = splat_f(xd[t, b])
        s = splat_i(128 * sx[t, b])
        y0 = _q8_step(ld_f32(o), c, s, d0, dx)
        y1 = _q8_step(ld_f32(o + 64), c + 1024, s, d1, dx)
        y2 = _q8_step(ld_f32(o + 128), c + 2048, s, d2, dx)
        y3 = _q8_step(ld_f32(o + 192), c + 3072, s, d3, dx)
        if nblk == 2:
            dx = splat_f(xd[t, e])
            s = splat_i(128 * sx[t, e])
            y0 = _q8_step(y0, c + 4096, s, e0, dx)
            y1 = _q8_step(y1, c + 5120, s, e1, dx)
            y2 = _q8_step(y2, c + 6144, s, e2, dx)
            y3 = _q8_step(y3, c + 7168, s, e3, dx)
        st_f32(o, y0)
        st_f32(o + 64, y1)
        st_f32(o + 128, y2)
        st_f32(o + 192, y3)


@njit(cache=True, inline="always")
def _rows_q8(p0, p1, nb, pxp, T, Kp, g0, g1, xd, sx, pout, out, N):
    """Every row of tiles g0..g1 of a Q8_0 product: per tile of 16 rows and block, A (x̂, 16 rows x 32 bytes)
    once and a tile product of k = 32 per group of 16 features (the packed quads, q + 128, are B's layout as
    they lie), then _blk's float step per row, block and group, so each row is bitwise the vector kernel's."""
    cfg = np.zeros(64, np.uint8)
    tile_shape(cfg, _A0, TILE_ROWS, QB)
    for t in (1, 2):
        tile_shape(cfg, t, QB // 4, 64)  # B: 8 rows of 16 features x 4 bytes
    for t in range(3, 3 + NJ):
        tile_shape(cfg, t, TILE_ROWS, 64)
    tile_load_config(cfg.ctypes.data)
    cb = np.empty(4 * NJ * TILE_ROWS * 64, np.uint8)
    yb = np.empty(T * NT, np.float32)  # [T, NJ, GL]
    pc, py = cb.ctypes.data, yb.ctypes.data
    for g in range(g0, g1):
        for t in range(T * NJ):
            st_f32(py + 64 * t, zero_f())
        for t0 in range(0, T, TILE_ROWS):
            ta = _tile_at(t0, T)
            pa = pxp + ta * Kp
            t1 = min(t0 + TILE_ROWS, T)
            # the products of blocks b, b + 1, then the float steps of the two before them (overlapping them)
            for b in range(0, nb + 1, 2):
                pb = pc + (b % 4) * 4096
                if b + 1 < nb:
                    _q8_products(p0, pa, Kp, b, g, nb, pb)
                    _q8_products(p0, pa, Kp, b + 1, g, nb, pb + 4096)
                if b > 0:
                    _q8_steps(p1, nb, g, b - 2, 2, xd, sx, ta, t0, t1, pc + ((b - 2) % 4) * 4096, py)
            if nb % 2 == 1:
                _q8_products(p0, pa, Kp, nb - 1, g, nb, pc)
                _q8_steps(p1, nb, g, nb - 1, 1, xd, sx, ta, t0, t1, pc, py)
        for j in range(NJ):
            n0 = g * NT + GL * j
            if n0 < N:
                for t in range(T):
                    _put(pout, out, t, N, n0, ld_f32(py + 256 * t + 64 * j))
    tile_release()
    return T


@njit(cache=True, inline="always")
def _rows(kind, p0, p1, p2, p3, p4, nb, pxp, T, Kp, g0, g1, xd, sx, sh, pout, out, N):
    """Every row of tiles g0..g1 of the product (the kernel's arguments), 16 rows a tile product, the last tile's
    rows those that end at T (_tile_at); returns T (the rows done)."""
    Tp = -(-T // TILE_ROWS) * TILE_ROWS
    q4 = kind == Q4_K or kind == Q5_K  # a sum and a min a block; else a sum and a factor a half-block
    nk = 0 if kind == IQ4_XS else (nb if q4 else 2 * nb)
    cfg = np.zeros(64, np.uint8)
    for t in (_A, _BH, _BL, _CH, _CL):
        tile_shape(cfg, t, TILE_ROWS, 64)
    tile_shape(cfg, _SL, TILE_ROWS, SB if q4 else 2 * SB)
    tile_shape(cfg, _SH, TILE_ROWS, SB if q4 else 2 * SB)
    tile_shape(cfg, _M, 2 if q4 else 4, 64)
    sxb = np.zeros((2, Tp, nk), np.uint8)
    for t in range(T):
        for k in range(nk):
            v = sx[t, k] if q4 else sh[t, k // 2, k % 2]
            sxb[0, t, k] = v & 127
            sxb[1, t, k] = (v >> 7) & 255
    tile_load_config(cfg.ctypes.data)
    wb = np.empty(_SCRATCH, np.uint8)
    cb = np.empty(4 * TILE_ROWS * 64, np.uint8)
    yb = np.empty(Tp * GL, np.float32)
    for g in range(g0, g1):
        for j in range(NJ):
            n0 = g * NT + GL * j
            if n0 >= N:
                break
            _tiles(kind, p0, p1, p2, p3, p4, nb, pxp, T, Kp, g, j, xd, wb, cb, yb, sxb)
            for t in range(T):
                _put(pout, out, t, N, n0, ld_f32(yb.ctypes.data + 64 * t))
    tile_release()
    return T


def _entry(kind: int, name: str):
    """_rows of one kind (a closure constant), compiled under its own name."""

    def rows(p0, p1, p2, p3, p4, nb, pxp, T, Kp, g0, g1, xd, sx, sh, pout, out, N):
        if kind == Q8_0:
            return _rows_q8(p0, p1, nb, pxp, T, Kp, g0, g1, xd, sx, pout, out, N)
        return _rows(kind, p0, p1, p2, p3, p4, nb, pxp, T, Kp, g0, g1, xd, sx, sh, pout, out, N)

    rows.__name__ = rows.__qualname__ = name
    return njit(cache=True)(rows)


TILE_ROWS_OF = {k: _entry(k, f"rows_{k}") for k in (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS, Q8_0)}
"""The kinds with a tile path, and its entry."""
# by name too: a kernel calls its kind's entry as a global (a dispatcher held in a kernel's closure pickles with a
# per-process id, and the closure keys Numba's cache: the kernel would compile again in every process)
rows_q2_k, rows_q3_k, rows_q4_k, rows_q5_k, rows_q6_k, rows_iq4_xs, rows_q8_0 = TILE_ROWS_OF.values()
