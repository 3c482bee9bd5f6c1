"""The int8 path's C entry points, one per type: the loops over tiles, feature groups, rows and blocks around
the block arithmetic of kernels/cpu/qdot/dots.py (signature intrinsics._KSIG, compiled as cfuncs by
kernels/cpu/quant.py)."""

from __future__ import annotations

import os

import numpy as np
from gguf import GGMLQuantizationType as Q
from numba import carray, njit

from ....errors import GuildError
from ...quant_types import QUANT_TYPES
from ..drivers import NT
from ..intrinsics import _pf32, _pi32
from ..simd import (
    AVX2,
    VNNI512,
    add_i,
    bc_i32,
    bits_i,
    dot32h,
    dot32h4,
    dot32u,
    grid_rows2,
    hi4,
    hsum2,
    ld_f32,
    ld_i32,
    ld_s8,
    ld_u8,
    lo4,
    madd16,
    madd_w,
    mul_i,
    or_i,
    prefetch,
    splat_i,
    st_f32,
    st_i32,
    sub_i,
    zero_f,
    zero_i,
)
from ..simd.amx import AMX
from ..simd.isa import ZEN4
from . import tiles
from .dots import (
    _DEC,
    _M1,
    _M2,
    GRID_TILE_ROWS,
    _b1off,
    _b2off,
    _blk,
    _grid,
    _grid_blk,
    _grid_decode,
    _iblk,
    _put,
    _sfin,
    _unit,
)
from .tiles import TILE_MIN, TILE_ROWS_OF
from .types import _GRIDS, GL, IQ2_XXS, IQ3_XXS, IQ4_XS, NJ, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, QB, SB


def _entry(kind: int, name: str, pf: int | None = None, amx: bool | None = None, expand: bool | None = None):
    """Tiles g0..g1 of out [T, N], 16 features at a time: rows two at a time (one weight load and decode for
    both), then a last one alone, the blocks in memory order. Two accumulators a pass fit AVX2's registers,
    and three inlined block bodies keep the compile short.
    The C entry point of one kind (signature intrinsics._KSIG: p0..p5, nt, nb, the activation buffer, T, Kp,
    g0, g1, out, N), `kind` a closure constant. A kernel calling an inlined driver compiled several times
    slower: Numba copies an inlined body block by block, each copy with the whole scope (quadratic).
    Where the host has AMX (`amx`: this one, for tests), the K-quants' (Q2_K to Q6_K), IQ4_XS's and Q8_0's
    products of TILE_MIN rows or more take tile products (tiles.py): the same integers and float steps. On AVX2
    without VNNI the EXPANDED kinds' products of EXPAND_MIN rows or more take _super_expanded: the same again
    (`expand`: a test's kernel of that path alone, on any host)."""

    # Python constants: Numba drops the branches of the other kinds before typing them
    sup = QUANT_TYPES[Q(kind)].block == SB * QB  # 256-element super-blocks (ggml's Q8_K activations)
    grid = Q(kind) in _GRIDS  # grid types, whose magnitudes a tile of 3+ rows decodes once
    t1 = kind == IQ2_XXS or kind == IQ3_XXS  # grid types whose single row takes _grid_t1
    # the fields' bytes per unit, then the prefetch distance in units (pf: this one, for tests)
    ub = unit_bytes(kind) + (prefetch_units(kind) if pf is None else pf,)
    one = ub[5] == 0  # the hardware prefetchers alone feed decode: one weight stream per field (_super_one)
    ex = kind in EXPANDED and (AVX2 and not VNNI512 or bool(expand))  # _super_expanded
    only = bool(expand)  # a test's kernel: every call takes _super_expanded, the other paths are not compiled
    tiled = kind in TILE_ROWS_OF and (AMX if amx is None else amx)  # AMX's tiles of rows

    def kernel(p0, p1, p2, p3, p4, p5, nt, nb, pxp, T, Kp, g0, g1, pout, N):
        o = pxp + T * Kp
        xd = carray(_pf32(o), (T, nb))
        sx = carray(_pi32(o + 4 * T * nb), (T, nb))
        xs = carray(_pf32(o + 8 * T * nb), (T, nb))
        sh = carray(_pi32(o + 12 * T * nb), (T, nb, 2))
        out = carray(_pf32(pout), (T, N))
        if only:
            _expanded_tiles(kind, p0, p1, p2, p3, p4, nb, pxp, T, Kp, g0, g1, xd, sx, sh, pout, out, N, ub)
            return
        if tiled and T >= TILE_MIN:  # the kind's AMX entry, a global (tiles.rows_q2_k, ...)
            a = (p0, p1, p2, p3, p4, nb, pxp, T, Kp, g0, g1, xd, sx, sh, pout, out, N)
            if kind == Q2_K:
                done = tiles.rows_q2_k(*a)
            elif kind == Q3_K:
                done = tiles.rows_q3_k(*a)
            elif kind == Q4_K:
                done = tiles.rows_q4_k(*a)
            elif kind == Q5_K:
                done = tiles.rows_q5_k(*a)
            elif kind == Q6_K:
                done = tiles.rows_q6_k(*a)
            elif kind == IQ4_XS:
                done = tiles.rows_iq4_xs(*a)
            else:
                done = tiles.rows_q8_0(*a)
            if done == T:
                return  # every row on AMX tiles
        if sup:
            dec = grid and T >= GRID_TILE_ROWS
            # the grid types' magnitudes decoded once per group of 16 features for all rows (the gathers are most
            # of a grid block's cost)
            scratch = np.empty(nb * _DEC if dec else 0, np.uint8)
            pd = scratch.ctypes.data
            rows_t1 = t1 and T == 1
            rs = np.empty(GL if rows_t1 else 0, np.int32)  # the 16 rows' integer sums of a super-block (_grid_t1)
            prs = rs.ctypes.data
            if ex and T >= EXPAND_MIN:  # AVX2: each super-block's weights expanded once for all rows
                _expanded_tiles(kind, p0, p1, p2, p3, p4, nb, pxp, T, Kp, g0, g1, xd, sx, sh, pout, out, N, ub)
                return
            for g in range(g0, g1):
                for j in range(NJ):
                    n0 = g * NT + GL * j
                    if n0 >= N:
                        break
                    if grid and dec:
                        _grid_decode(kind, p0, p4, g, nb, j, pd)
                        _super_rows(kind, p0, p1, p2, p3, p4, nb, pxp, T, Kp, g, j, n0, xd, sx, sh, pout, out, N,
                                    pd, True, ub)
                    elif rows_t1:  # one row: elements in lanes, 16 rows one after another
                        _grid_t1(kind, p0, p1, p2, p3, p4, nb, pxp, g, j, n0, xd, pout, out, N, prs, ub)
                    elif T > 1:
                        _super_rows(kind, p0, p1, p2, p3, p4, nb, pxp, T, Kp, g, j, n0, xd, sx, sh, pout, out, N,
                                    pd, False, ub)
                    elif one:  # one row, no software prefetch: one group a pass, one stream per field
                        _super_one(kind, p0, p1, p2, p3, p4, nb, pxp, g, j, n0, xd, sx, sh, pout, out, N)
                    elif j % 2 == 0:  # one row: two groups of features a pass instead of two rows
                        k = j + 1 if n0 + GL < N else j
                        _super_groups(kind, p0, p1, p2, p3, p4, nb, pxp, g, j, k, n0, xd, sx, sh, pout, out, N, ub)
            return
        for g in range(g0, g1):
            for j in range(NJ):
                n0 = g * NT + GL * j
                if n0 >= N:
                    break
                for t in range(0, T - 1, 2):
                    y = z = zero_f()
                    u = t + 1
                    for b in range(nb):
                        xa = pxp + t * Kp + b * QB
                        if t == 0:
                            _ahead(ub, p0, p1, p2, p3, p4, _unit(g, j, nb, b + ub[5]))
                        elif t == 2:  # the next group's weights (_super_rows)
                            _fetch(ub, p0, p1, p2, p3, p4, _unit(g, j, nb, b) + nb)
                        y = _blk(kind, p0, p1, p2, p3, g, nb, b, j, xa, xd[t, b], sx[t, b], xs[t, b], y)
                        z = _blk(kind, p0, p1, p2, p3, g, nb, b, j, xa + Kp, xd[u, b], sx[u, b], xs[u, b], z)
                    _put(pout, out, t, N, n0, y)
                    _put(pout, out, u, N, n0, z)
                if T % 2 == 1:  # the last row alone
                    t = T - 1
                    y = zero_f()
                    for b in range(nb):
                        if t == 0:
                            _ahead(ub, p0, p1, p2, p3, p4, _unit(g, j, nb, b + ub[5]))
                        y = _blk(kind, p0, p1, p2, p3, g, nb, b, j, pxp + t * Kp + b * QB, xd[t, b], sx[t, b],
                                 xs[t, b], y)
                    _put(pout, out, t, N, n0, y)

    kernel.__name__ = kernel.__qualname__ = name
    return kernel


@njit(cache=True, inline="always")
def _super_rows(kind, p0, p1, p2, p3, p4, nb, pxp, T, Kp, g, j, n0, xd, sx, sh, pout, out, N, pd, dec, ub):
    """Every row of group j of tile g for a super-block kind: per super-block, each row's integer sums over
    its 8 blocks, then one float step (_sfin); `dec`: the grid magnitudes come from pd (_grid_decode). Rows
    two at a time; an odd last row is paired with itself (one loop body: a lone-row loop compiled markedly
    slower). A single row (T = 1) takes _super_groups or _super_one instead."""
    for t in range(0, T, 2):
        u = min(t + 1, T - 1)
        y = z = zero_f()
        for s in range(0, nb, SB):
            a1 = m1 = a2 = m2 = zero_i()
            for b in range(s, s + SB):
                xa = pxp + t * Kp + b * QB
                xu = pxp + u * Kp + b * QB
                if t == 0:  # the later row pairs find the group's weights in cache
                    _ahead(ub, p0, p1, p2, p3, p4, _unit(g, j, nb, b + ub[5]))
                elif t == 2:  # the next group's weights, fetched while the later pairs compute (its first pass
                    # then finds them in cache instead of waiting on memory: prefill's experts, ~32 rows each)
                    _fetch(ub, p0, p1, p2, p3, p4, _unit(g, j, nb, b) + nb)
                if dec:
                    a1 = add_i(a1, _grid_blk(kind, p1, p2, g, nb, b, j, xa, pd))
                    a2 = add_i(a2, _grid_blk(kind, p1, p2, g, nb, b, j, xu, pd))
                else:
                    a1, m1 = _iblk(kind, p0, p1, p2, p3, p4, g, nb, b, j, xa, sx[t, b], sh[t, b, 0], sh[t, b, 1],
                                   a1, m1)
                    a2, m2 = _iblk(kind, p0, p1, p2, p3, p4, g, nb, b, j, xu, sx[u, b], sh[u, b, 0], sh[u, b, 1],
                                   a2, m2)
            y = _sfin(kind, p1, p2, p3, p4, g, nb, s, j, a1, m1, xd[t, s], y)
            z = _sfin(kind, p1, p2, p3, p4, g, nb, s, j, a2, m2, xd[u, s], z)
        _put(pout, out, t, N, n0, y)
        if u != t:
            _put(pout, out, u, N, n0, z)


# AVX2 (no VNNI): from this many rows a super-block's weights are taken apart once for all rows (_super_expanded)
EXPAND_MIN = 4
EXPANDED = (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K)  # the kinds that take _super_expanded
_EXU = 12 * 64  # bytes of an expanded block: 8 vectors of the weights as bytes, then up to 3 of scales and mins
_EXB = SB * _EXU // 4  # an expanded super-block, in f32 slots of the scratch


@njit(cache=True, inline="always")
def _pairs(a, b):
    """a's low 16 bits in each lane's low half, b's in its high half (vpmaddwd operands)."""
    return or_i(bits_i(a, 0, 0xFFFF, 0), bits_i(b, 0, 0xFFFF, 16))


@njit(cache=True, inline="always")
def _expand_block(kind, p0, p1, p2, g, nb, b, j, e):
    """Block b of group j, its weights as bytes at e: vector i (64 bytes, 4 a lane) pairs with the activations'
    quad i (elements 4i..4i + 3). Then the scales of the block's two halves, each in both i16 halves of a lane
    (Q4_K: the first alone), and the per-block term's factors: the min (Q4_K, Q5_K; times the row's block sum),
    or the two halves' mins (Q2_K) or scales (Q6_K, Q3_K) side by side, times the row's two half sums in one
    vpmaddwd."""
    u = _unit(g, j, nb, b)
    if kind == Q4_K or kind == Q5_K:
        hw = ld_i32(p1 + u * GL * 4) if kind == Q5_K else zero_i()  # Q5_K's 5th bits
        for q in range(4):
            w = ld_i32(p0 + u * 4 * GL * 4 + q * GL * 4)
            st_i32(e + q * 64, or_i(lo4(w), bits_i(hw, q, _M1, 4)))
            st_i32(e + (4 + q) * 64, or_i(hi4(w), bits_i(hw, 4 + q, _M1, 4)))
        psm = p1 if kind == Q4_K else p2
        sc = ld_u8(psm + _b2off(g, nb, b, 0, j))
        st_i32(e + 512, _pairs(sc, sc))
        st_i32(e + 576, _pairs(sc, sc))
        st_i32(e + 640, ld_u8(psm + _b2off(g, nb, b, 1, j)))
        return
    if kind == Q6_K:  # the low nibbles from the quads, the two bits above them from the planes (dots._q6)
        h0 = ld_i32(p1 + u * 2 * GL * 4)
        h1 = ld_i32(p1 + u * 2 * GL * 4 + GL * 4)
        for q in range(4):
            w = ld_i32(p0 + u * 4 * GL * 4 + q * GL * 4)
            st_i32(e + q * 64, or_i(lo4(w), bits_i(h0, 2 * q, _M2, 4)))
            st_i32(e + (4 + q) * 64, or_i(hi4(w), bits_i(h1, 2 * q, _M2, 4)))
    else:  # Q2_K, Q3_K: 2-bit quads (Q3_K's 3rd bit from the plane: dots._halves2)
        hw = ld_i32(p1 + u * GL * 4) if kind == Q3_K else zero_i()
        for h in range(2):
            w = ld_i32(p0 + u * 2 * GL * 4 + h * GL * 4)
            for q in range(4):
                st_i32(e + (4 * h + q) * 64, or_i(bits_i(w, 2 * q, _M2, 0), bits_i(hw, 4 * h + q, _M1, 2)))
    if kind == Q2_K:  # the scale in each byte's low nibble, the min in its high one
        vA = ld_u8(p1 + _b2off(g, nb, b, 0, j))
        vB = ld_u8(p1 + _b2off(g, nb, b, 1, j))
        st_i32(e + 512, _pairs(bits_i(vA, 0, 15, 0), bits_i(vA, 0, 15, 0)))
        st_i32(e + 576, _pairs(bits_i(vB, 0, 15, 0), bits_i(vB, 0, 15, 0)))
        st_i32(e + 640, _pairs(bits_i(vA, 4, 15, 0), bits_i(vB, 4, 15, 0)))
    else:
        sA = ld_s8(p2 + _b2off(g, nb, b, 0, j))
        sB = ld_s8(p2 + _b2off(g, nb, b, 1, j))
        st_i32(e + 512, _pairs(sA, sA))
        st_i32(e + 576, _pairs(sB, sB))
        st_i32(e + 640, _pairs(sA, sB))


@njit(cache=True, inline="always")
def _expanded_blk(kind, e, xa, s1, s2, acc, macc):
    """One row's block from its expanded form at e: acc + the scaled sums; macc + the per-block term (Q4_K,
    Q5_K: min · s1, the row's block sum; the others: the two factors times s1, s2, its half sums), which Q6_K
    and Q3_K take off acc 32 or 4 times and the others leave to _sfin."""
    xs = (bc_i32(xa), bc_i32(xa + 4), bc_i32(xa + 8), bc_i32(xa + 12), bc_i32(xa + 16), bc_i32(xa + 20),
          bc_i32(xa + 24), bc_i32(xa + 28))
    us = (ld_i32(e), ld_i32(e + 64), ld_i32(e + 128), ld_i32(e + 192), ld_i32(e + 256), ld_i32(e + 320),
          ld_i32(e + 384), ld_i32(e + 448))
    if kind == Q4_K:  # nibbles: eight pairs' i16 sums in one (dot32u)
        acc = dot32u(acc, ld_i32(e + 512), *us, *xs)
    elif kind == Q6_K:  # u <= 63: two pairs' i16 sums at a time
        acc = dot32h(acc, ld_i32(e + 512), ld_i32(e + 576), *us, *xs)
    else:  # u <= 31: a half's four pairs at once
        acc = dot32h4(acc, ld_i32(e + 512), ld_i32(e + 576), *us, *xs)
    if kind == Q4_K or kind == Q5_K:
        return acc, add_i(macc, madd16(ld_i32(e + 640), splat_i(s1)))
    return acc, add_i(macc, madd_w(ld_i32(e + 640), splat_i((s1 & 0xFFFF) | (s2 << 16))))


@njit(cache=True, inline="always")
def _expanded_tiles(kind, p0, p1, p2, p3, p4, nb, pxp, T, Kp, g0, g1, xd, sx, sh, pout, out, N, ub):
    """Tiles g0..g1 by _super_expanded, a group of 16 features at a time."""
    eb = np.empty(_EXB + T * GL, np.float32)
    for g in range(g0, g1):
        for j in range(NJ):
            n0 = g * NT + GL * j
            if n0 >= N:
                break
            _super_expanded(kind, p0, p1, p2, p3, p4, nb, pxp, T, Kp, g, j, n0, xd, sx, sh, pout, out, N,
                            eb.ctypes.data, ub)


@njit(cache=True, inline="always")
def _super_expanded(kind, p0, p1, p2, p3, p4, nb, pxp, T, Kp, g, j, n0, xd, sx, sh, pout, out, N, pe, ub):
    """Every row of group j of tile g on AVX2 (EXPANDED kinds): per super-block its 8 blocks' weights, scales and
    mins are taken apart once into pe (L1, _expand_block), then each row's integer sums read them and the float
    step (_sfin) goes to the row's slot of y. The same integers and float steps in the same order: bitwise
    _super_rows, the weights' decode paid once per super-block instead of once per row pair."""
    py = pe + 4 * _EXB
    for t in range(T):
        st_f32(py + 64 * t, zero_f())
    for s in range(0, nb, SB):
        for b in range(s, s + SB):
            _ahead(ub, p0, p1, p2, p3, p4, _unit(g, j, nb, b + ub[5]))
            _expand_block(kind, p0, p1, p2, g, nb, b, j, pe + (b - s) * _EXU)
        for t in range(T):
            a = m = zero_i()
            for b in range(s, s + SB):
                xa = pxp + t * Kp + b * QB
                if kind == Q4_K or kind == Q5_K:
                    a, m = _expanded_blk(kind, pe + (b - s) * _EXU, xa, sx[t, b], 0, a, m)
                else:
                    a, m = _expanded_blk(kind, pe + (b - s) * _EXU, xa, sh[t, b, 0], sh[t, b, 1], a, m)
            if kind == Q6_K or kind == Q3_K:  # less 32 or 4 times Σ scale·half-sum (dots._iblk)
                a = sub_i(a, mul_i(m, splat_i(np.int32(32 if kind == Q6_K else 4))))
                m = zero_i()
            st_f32(py + 64 * t, _sfin(kind, p1, p2, p3, p4, g, nb, s, j, a, m, xd[t, s], ld_f32(py + 64 * t)))
    for t in range(T):
        _put(pout, out, t, N, n0, ld_f32(py + 64 * t))


@njit(cache=True, inline="always")
def _grid_t1(kind, p0, p1, p2, p3, p4, nb, pxp, g, j, n0, xd, pout, out, N, prs, ub):
    """Row 0 alone (T = 1) for group j of a grid type with its index bytes alone in p0 (IQ2_XXS, IQ3_XXS): each
    of the 16 features' blocks with its elements in lanes (grid_rows2: a row's entries load into place, where
    the features-in-lanes form gathers 16 rows' entries lane by lane), their integer sums gathered per
    super-block into the 16 lanes, then _sfin: the same integers and float steps, so bitwise _super_rows."""
    base = _grid(kind)
    ngr = 4 if kind == IQ2_XXS else 8
    y = zero_f()
    for s in range(0, nb, SB):
        for b in range(s + SB, s + 2 * SB):  # the next super-block: this one's rows read each unit 8 times
            _ahead(ub, p0, p1, p2, p3, p4, _unit(g, j, nb, b))
        for r in range(0, GL, 2):
            acc = zero_i()
            for b in range(s, s + SB):
                u = _unit(g, j, nb, b)
                ia = p0 + u * ngr * GL + r
                sa = p1 + u * GL * 4 + 4 * r
                ca = p2 + _b1off(g, nb, b, j) + r
                if kind == IQ2_XXS:
                    acc = add_i(acc, grid_rows2(base, ia, sa, ca, pxp + b * QB, 8))
                else:
                    acc = add_i(acc, grid_rows2(base, ia, sa, ca, pxp + b * QB, 4))
            hsum2(acc, prs + 4 * r)
        y = _sfin(kind, p1, p2, p3, p4, g, nb, s, j, ld_i32(prs), zero_i(), xd[0, s], y)
    _put(pout, out, 0, N, n0, y)


# Prefetch distance: decode reads its weights once, from memory, and without software prefetch the kernels'
# compute and the loads' latency add up instead of overlapping (the hardware prefetchers restart at every 4 KiB
# page of each field's stream). Counted in bytes of all of a kind's fields, so that a kind with large units does
# not run as far ahead (past what the line fill buffers hold): 6 units of Q4_K measured best (12-layer
# Qwen3-30B-A3B slice, 2 threads: decode +12 %; 10 and above, or into L2 only, gave less), and 3 units of Q8_0
# instead of 6: decode of the 4-layer Q8_0 slice +9 % (58.0-61.3 against 52.1-55.2 tok/s, three alternated pairs).
PF_BYTES_DEFAULT = 1776
# AMD Zen 4 cores' stream prefetchers keep up with the weight streams alone, and software prefetches only take
# load slots: without them a Zen 4 VM read every matrix of a 12-layer slice's token 22 % faster (17.8 against 23.0
# ms, six alternated rounds) and decoded ~8 % faster (median of 13 alternated pairs, 0.92-1.24), where the Xeon
# lost 12 %. A Zen 3 VM decoded 1.10-1.13x faster with them (the same slice, the kernels swapped in one process,
# 16 alternated blocks of 8 steps; the embedded models 1.07-1.08x): Zen 3 and earlier take PF_BYTES_DEFAULT. So
# does Zen 5: a 2-core Zen 5 VM decoded the Q4_K_M slice 1.12-1.53x faster with it (four alternated pairs of
# processes; 3,552 bytes slower in four more pairs, 888 slower).
PF_BYTES_ZEN4 = 0
PREFETCH_ENV = "GUILD_PREFETCH_BYTES"


def prefetch_bytes(env: str | None = None) -> int:
    """The prefetch distance in bytes: GUILD_PREFETCH_BYTES where set (0: no software prefetch), else 0 on AMD
    Zen 4 and PF_BYTES_DEFAULT elsewhere. A value that is not a whole number of bytes is refused in one
    line."""
    v = (os.environ.get(PREFETCH_ENV, "") if env is None else env).strip()
    if not v:
        return PF_BYTES_ZEN4 if ZEN4 else PF_BYTES_DEFAULT
    if not v.isdigit() or int(v) > 1 << 16:
        raise GuildError(f"{PREFETCH_ENV}={v!r}: expected bytes from 0 to 65536 (0: no software prefetch)")
    return int(v)


PF_BYTES = prefetch_bytes()


# bytes per unit of each field role (types.py); "hs" (an f16 per 8 units) as 4: the same cache line
_ROLE_BYTES = {"q4": 256, "q8": 512, "w": 64, "w2": 128, "b2": 32, "b": 16, "h": 32, "hs": 4, "g4": 64, "g8": 128}


def unit_bytes(kind: int) -> tuple:
    """Each of a kind's fields' bytes per unit, 0 past its last field (five slots: p0..p4)."""
    r = [_ROLE_BYTES[role] for _, role, _ in QUANT_TYPES[Q(kind)].i8]
    return tuple(r + [0] * (5 - len(r)))


def prefetch_units(kind: int) -> int:
    """Units ahead that the kernels of `kind` prefetch: PF_BYTES of its fields, 2 to 12; 0 where PF_BYTES is 0
    (none). Q2_K's 11 units (1,848 bytes) against the 6 it had: its decode kernel +30 %, the 12-layer slice's
    decode 1.06-1.17x in four alternated pairs of processes (a Zen 5 VM)."""
    if PF_BYTES == 0:
        return 0
    return max(2, min(12, round(PF_BYTES / sum(unit_bytes(kind)))))


@njit(cache=True, inline="always")
def _pf_field(p, u, n):
    """Prefetch unit u of a field of n bytes per unit: each of its lines, or (n < 64) the line it starts."""
    a = p + u * n
    if n >= 64:
        for c in range(0, n, 64):
            prefetch(a + c)
    elif n and (a & 63) < n:
        prefetch(a)


@njit(cache=True, inline="always")
def _fetch(ub, p0, p1, p2, p3, p4, u):
    """Prefetch unit u of every field, whatever the distance (a past-the-end unit is a harmless hint)."""
    _pf_field(p0, u, ub[0])
    _pf_field(p1, u, ub[1])
    _pf_field(p2, u, ub[2])
    _pf_field(p3, u, ub[3])
    _pf_field(p4, u, ub[4])


@njit(cache=True, inline="always")
def _ahead(ub, p0, p1, p2, p3, p4, u):
    """Prefetch unit u of every field (ub: unit_bytes, then the distance; 0: none, a constant the kernel drops)."""
    if ub[5] != 0:
        _fetch(ub, p0, p1, p2, p3, p4, u)


@njit(cache=True, inline="always")
def _super_groups(kind, p0, p1, p2, p3, p4, nb, pxp, g, j, k, n0, xd, sx, sh, pout, out, N, ub):
    """Row 0 alone (T = 1, decode) for groups j and k of tile g: the row-pair body of _super_rows with the
    second accumulator on the next 16 features, so no pass computes a row twice. Each feature's chain is
    _super_rows' (same blocks, same order): bitwise the same outputs."""
    y = z = zero_f()
    for s in range(0, nb, SB):
        a1 = m1 = a2 = m2 = zero_i()
        for b in range(s, s + SB):
            xa = pxp + b * QB
            # the pass after this one reads groups j + 2 and k + 2 (the next units of each stream past nb)
            ua = _unit(g, j, nb, b + ub[5]) + (nb if b + ub[5] >= nb else 0)
            _ahead(ub, p0, p1, p2, p3, p4, ua)
            _ahead(ub, p0, p1, p2, p3, p4, ua + (k - j) * nb)
            a1, m1 = _iblk(kind, p0, p1, p2, p3, p4, g, nb, b, j, xa, sx[0, b], sh[0, b, 0], sh[0, b, 1], a1, m1)
            a2, m2 = _iblk(kind, p0, p1, p2, p3, p4, g, nb, b, k, xa, sx[0, b], sh[0, b, 0], sh[0, b, 1], a2, m2)
        y = _sfin(kind, p1, p2, p3, p4, g, nb, s, j, a1, m1, xd[0, s], y)
        z = _sfin(kind, p1, p2, p3, p4, g, nb, s, k, a2, m2, xd[0, s], z)
    _put(pout, out, 0, N, n0, y)
    if k != j:
        _put(pout, out, 0, N, n0 + GL, z)


@njit(cache=True, inline="always")
def _super_one(kind, p0, p1, p2, p3, p4, nb, pxp, g, j, n0, xd, sx, sh, pout, out, N):
    """Row 0 alone (T = 1) for group j of tile g where the hardware prefetchers alone fetch the weights (no
    software prefetch): one group a pass reads each field as one stream (two groups a pass read two, nb units
    apart, and a Zen 4 streamed the experts 1.1-1.4x slower that way), its even and odd blocks in two integer
    chains so that the loads overlap. The integer sums are exact, the float step per super-block _super_rows':
    bitwise the same."""
    y = zero_f()
    for s in range(0, nb, SB):
        a1 = m1 = a2 = m2 = zero_i()
        for b in range(s, s + SB, 2):
            xa = pxp + b * QB
            a1, m1 = _iblk(kind, p0, p1, p2, p3, p4, g, nb, b, j, xa, sx[0, b], sh[0, b, 0], sh[0, b, 1], a1, m1)
            c = b + 1
            a2, m2 = _iblk(kind, p0, p1, p2, p3, p4, g, nb, c, j, xa + QB, sx[0, c], sh[0, c, 0], sh[0, c, 1], a2,
                           m2)
        y = _sfin(kind, p1, p2, p3, p4, g, nb, s, j, add_i(a1, a2), add_i(m1, m2), xd[0, s], y)
    _put(pout, out, 0, N, n0, y)


# the C entry points by type, and by name (_k_q4_0, ...: each type's symbols and cache files)
KERNELS = {q: _entry(int(q), "_k_" + t.name) for q, t in QUANT_TYPES.items() if t.i8}
globals().update({f.__name__: f for f in KERNELS.values()})
