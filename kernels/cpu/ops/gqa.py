"""Causal GQA attention kernels: one row over a float32 cache (`attention`), and the score, softmax and value
passes of a window over a typed KV cache (`attention_kv`). Every score and output element is one chain in a
fixed order whatever rows share the call (row invariance)."""

from __future__ import annotations

import numpy as np
from numba import get_num_threads, njit, prange, types
from numba.extending import overload

from ..intrinsics import fma32
from ..simd import fma_f, lane, ld_f32, mul_f, splat_f, st_f32, zero_f
from .gqa_row import _fma4, _softmax_rows, _store_heads, _vmax, attention_row, kv_row_fits, row_fits
from .kv import KV_TILE, is_q8, k_scales, key_at, kv_block, kv_parts, kv_stride1, ld_kv, stored_f32, v_scale, value_at
from .rows import expf, sum_fixed


@njit(cache=True, parallel=True, error_model="numpy")
def attention(q, kt, vc, pos0, scale, out, scores):
    """Causal GQA attention of a window over the KV cache.

    q: [T, H, hd] (rows at positions pos0..pos0+T-1); kt: [Hkv, ctx/KV_TILE, hd, KV_TILE] (keys in tiles of
    positions, transposed within a tile: the score loop runs stride-1 over positions and a tile is one contiguous
    read, see KV_TILE); vc: [Hkv, ctx, hd]; out: [T, H, hd]; scores: [T*H, >= pos0+T] scratch.
    Row t reads positions 0..pos0+t; every score, sum and output element is computed in a fixed order: a score
    is one fma chain over i, an output element one fma chain over positions. One task per (KV head, row): the
    query heads sharing that KV head run together block by block, so each block of K and V is read from memory
    once and reused from L1. (Two rows per task sharing 32-position K blocks was faster with the cache hot, but
    1.4-1.8x slower over a model's 30 layers at 2k positions: the shorter strided runs defeat the prefetcher.)
    16-lane vector code (kernels/cpu/simd/) where hd is a multiple of 16 and the rows are stride-1, else scalar.
    """
    T, H, hd = q.shape
    Hkv = kt.shape[0]
    group = H // Hkv
    vec = (hd % 16 == 0 and kt.strides[3] == 4 and vc.strides[2] == 4 and scores.strides[1] == 4
           and out.strides[2] == 4 and q.strides[2] == 4)
    for u in prange(Hkv * T):
        g = u // T
        _attend(q, kt, vc, pos0, scale, out, scores, g, u - g * T, group, hd, vec)


@njit(cache=True, error_model="numpy")
def _attend(q, kt, vc, pos0, scale, out, scores, g, t, group, hd, vec):
    """Row t of the query heads g*group .. (g+1)*group - 1 (a function of its own: compiled outside the
    parallel region, where LLVM keeps the vector accumulators in registers)."""
    L = pos0 + t + 1
    H = q.shape[1]
    h0 = g * group
    if vec:
        _scores_vec(q, kt, g, t, h0, group, hd, L, scale, scores, t * H + h0, 0)
        _softmax_pv(vc, scores, out, g, t, h0, group, hd, L, True)
        return
    for h in range(h0, h0 + group):
        _scores_scalar(q, kt, kt, g, t, h, hd, 0, L, scale, scores[t * H + h])
    _softmax_pv(vc, scores, out, g, t, h0, group, hd, L, False)


@njit(cache=True, inline="always")
def _softmax_pv(vc, scores, out, g, t, h0, group, hd, L, vec):
    """out[t, h0 .. h0 + group - 1] from the row's scores[t * H + h, :L]: softmax, then the weighted values."""
    pb, invs = _softmax_rows(scores, t, out.shape[1], h0, group, L, vec)
    if vec:
        _pv_vec(pb, invs, vc, g, t, h0, group, L, out, hd, 0)
    else:
        for r in range(group):
            sc = pb[r]
            o = out[t, h0 + r]
            for i in range(hd):
                o[i] = 0.0
            for j in range(L):  # out[i] += p[j] * v[j, i], vectorised over i
                p = sc[j] * invs[r]
                vr = vc[g, j]
                for i in range(hd):
                    o[i] += p * vr[i]


@njit(cache=True, inline="always")
def _scores_scalar(q, kt, ks, g, t, h, hd, j0, L, scale, sc):
    """sc[j] for j0 <= j < L: one chain over i of (q[t, h, i] * scale) * k[g, i, j] (multiply, then add; kt, ks:
    kv_parts of the stored keys)."""
    for j in range(j0, L):
        sc[j] = 0.0
    for i in range(hd):  # s[j] += q[i] * k[j, i], vectorised over j
        qi = q[t, h, i] * scale
        for j in range(j0, L):
            sc[j] += qi * key_at(kt, ks, g, i, j)


@njit(cache=True, inline="always")
def _scores_vec(q, kt, g, t, h0, group, hd, L, scale, scores, th0, j0):
    """scores[th0 + r, j] = fma chain over i of (q[t, h0 + r, i] * scale) * k[g, i, j] for r < group, j0 <= j < L:
    up to three heads x 64 positions at a time in registers (each K vector loaded once for the three), then
    16 positions, then lane by lane where a whole vector would pass the end of the cache or scratch row."""
    pk = kt.ctypes.data + g * kt.strides[0]
    st = kt.strides[1]
    sk = kt.strides[2]
    ss = scores.strides[0]
    W = min(kt.shape[1] * KV_TILE, scores.shape[1])  # whole vectors may be loaded and stored below this position
    for r in range(0, group, 3):
        b1 = r + 1 < group
        b2 = r + 2 < group
        h = h0 + r
        ps = scores.ctypes.data + (th0 + r) * ss
        j = j0
        while j + 64 <= L:
            a0 = a1 = a2 = a3 = c0 = c1 = c2 = c3 = e0 = e1 = e2 = e3 = zero_f()
            for i in range(hd):
                p = pk + j // KV_TILE * st + i * sk + 4 * (j % KV_TILE)
                k0 = ld_f32(p)
                k1 = ld_f32(p + 64)
                k2 = ld_f32(p + 128)
                k3 = ld_f32(p + 192)
                a0, a1, a2, a3 = _fma4(splat_f(q[t, h, i] * scale), k0, k1, k2, k3, a0, a1, a2, a3)
                if b1:
                    c0, c1, c2, c3 = _fma4(splat_f(q[t, h + 1, i] * scale), k0, k1, k2, k3, c0, c1, c2, c3)
                if b2:
                    e0, e1, e2, e3 = _fma4(splat_f(q[t, h + 2, i] * scale), k0, k1, k2, k3, e0, e1, e2, e3)
            o = ps + 4 * j
            st_f32(o, a0)
            st_f32(o + 64, a1)
            st_f32(o + 128, a2)
            st_f32(o + 192, a3)
            if b1:
                st_f32(o + ss, c0)
                st_f32(o + ss + 64, c1)
                st_f32(o + ss + 128, c2)
                st_f32(o + ss + 192, c3)
            if b2:
                st_f32(o + 2 * ss, e0)
                st_f32(o + 2 * ss + 64, e1)
                st_f32(o + 2 * ss + 128, e2)
                st_f32(o + 2 * ss + 192, e3)
            j += 64
        while j < L and j + 16 <= W:
            a0 = zero_f()
            c0 = zero_f()
            e0 = zero_f()
            for i in range(hd):
                k0 = ld_f32(pk + j // KV_TILE * st + i * sk + 4 * (j % KV_TILE))
                a0 = fma_f(splat_f(q[t, h, i] * scale), k0, a0)
                if b1:
                    c0 = fma_f(splat_f(q[t, h + 1, i] * scale), k0, c0)
                if b2:
                    e0 = fma_f(splat_f(q[t, h + 2, i] * scale), k0, e0)
            st_f32(ps + 4 * j, a0)
            if b1:
                st_f32(ps + ss + 4 * j, c0)
            if b2:
                st_f32(ps + 2 * ss + 4 * j, e0)
            j += 16
        for rr in range(r, min(r + 3, group)):
            for jj in range(j, L):  # the same chain, one lane
                a = np.float32(0.0)
                for i in range(hd):
                    a = fma32(q[t, h0 + rr, i] * scale, key_at(kt, kt, g, i, jj), a)
                scores[th0 + rr, jj] = a


@njit(cache=True, inline="always")
def _pv_vec(scores, invs, vc, g, t, h0, group, L, out, hd, th0):
    """out[t, h0 + r, i] = fma chain over j < L of (scores[th0 + r, j] * invs[r]) * v[g, j, i]: up to three
    heads x 64 features at a time in registers, each V vector loaded once for the three (hd a multiple of
    16)."""
    pv = vc.ctypes.data + g * vc.strides[0]
    sj = vc.strides[1]
    for r in range(0, group, 3):
        b1 = r + 1 < group
        b2 = r + 2 < group
        sa = scores[th0 + r]
        sb = scores[th0 + r + 1] if b1 else sa
        sc_ = scores[th0 + r + 2] if b2 else sa
        ia = invs[r]
        ib = invs[r + 1] if b1 else ia
        ic = invs[r + 2] if b2 else ia
        for c in range(0, hd, 64):
            n = min(64, hd - c) // 16
            a0 = a1 = a2 = a3 = c0 = c1 = c2 = c3 = e0 = e1 = e2 = e3 = zero_f()
            for j in range(L):
                v = pv + j * sj + 4 * c
                v0 = ld_f32(v)
                v1 = ld_f32(v + 64) if n > 1 else v0
                v2 = ld_f32(v + 128) if n > 2 else v0
                v3 = ld_f32(v + 192) if n > 3 else v0
                a0, a1, a2, a3 = _fma4(splat_f(sa[j] * ia), v0, v1, v2, v3, a0, a1, a2, a3)
                if b1:
                    c0, c1, c2, c3 = _fma4(splat_f(sb[j] * ib), v0, v1, v2, v3, c0, c1, c2, c3)
                if b2:
                    e0, e1, e2, e3 = _fma4(splat_f(sc_[j] * ic), v0, v1, v2, v3, e0, e1, e2, e3)
            _store_heads(out, t, h0 + r, c, n, a0, a1, a2, a3)
            if b1:
                _store_heads(out, t, h0 + r + 1, c, n, c0, c1, c2, c3)
            if b2:
                _store_heads(out, t, h0 + r + 2, c, n, e0, e1, e2, e3)


# =========================================================================================================
# Attention over a typed KV cache (--cache-type-k / --cache-type-v, guild/engine/state.py): the kernels read the
# stored type, never a float32 copy of the cache. f16: IEEE halves, passed as their uint16 bits. q8_0: llama.cpp's
# block_q8_0 split in two arrays, int8 quants and an f16 scale (uint16 bits) per 32 values along head_dim; keys
# in tiles as the f32 kernel wants them (quants [Hkv, ctx/KV_TILE, hd, KV_TILE], scales [Hkv, ctx/KV_TILE, hd/32,
# KV_TILE]), values per position (quants [Hkv, ctx, hd], scales [Hkv, ctx, hd/32]). A window takes a pass of
# scores by the key type, then softmax and values by the value type (float32 on both sides: windows of two rows
# or more; one row is `attention`). The passes read each K and V block once for all the rows of a window (score
# tasks split positions, value tasks blocks of rows, never a reduction), and every score and output element is
# one chain in a fixed order whatever rows share the call: row invariance for every pair of types. Every type
# runs `attention`'s chains over the values it stores, in the same register-tiled code: f16 converts 16 halves
# per load (vcvtph2ps), q8_0 16 quants (vpmovsxbd, vcvtdq2ps) times their scales (vmulps; q * d is exact in
# float32), so a q8_0 row is bitwise float32 attention over the dequantised cache. A q8_0 block that more than
# six (row, head) pairs read is dequantised once into L1 instead (the same values). One layer of SmolLM2-135M at
# 32K positions, 2 threads, T = 1 / 4, medians of 6 runs alternated with the scalar loops these replaced
# (OMP_WAIT_POLICY=PASSIVE, load 2.4-3.2 on 2 cores): q8_0 4.1 / 11.3 ms (scalar 14.4 / 40.4), f16 5.4 / 13.2 ms
# in the same runs.
# =========================================================================================================
KV_ROWS = 16  # rows per pass over V: their accumulators stay in L1 (every verification window is one pass)
# rows per block of a prefill chunk's attention: a 512-row chunk at 16K positions (SmolLM2's heads, f16) 0.80x
# the time of one block, at 4.6K (Qwen3-30B-A3B's, f32) 0.92x; 16 or 64 rows did no better
PREFILL_ROWS = 2 * KV_ROWS


@njit(cache=True, parallel=True, error_model="numpy")
def scores_kv(q, kt, pos0, scale, scores):
    """The score pass over stored keys [Hkv, ctx/KV_TILE, hd, KV_TILE] (float32, f16 bits (uint16) or a q8_0 pair:
    quants, scale bits [Hkv, ctx/KV_TILE, hd/32, KV_TILE]): scores[t * H + h, :pos0 + t + 1], each score the chain
    `attention` computes over the keys as float32 (a q8_0 key q * d is exact in float32). One task per (KV head,
    key tile) serves every row of the window, so each K tile is read from memory once per window (one contiguous
    block) and reused from L1."""
    T, H, hd = q.shape
    kq, ks = kv_parts(kt)
    n_tiles = (pos0 + T + KV_TILE - 1) // KV_TILE
    vec = hd % 16 == 0 and kv_stride1(kq, ks) and scores.strides[1] == 4 and q.strides[2] == 4
    qs = (q * scale).reshape(T * H, hd)  # the products every chain starts its steps with
    for u in prange(kq.shape[0] * n_tiles):
        g = u // n_tiles
        _scores_tile(q, qs, kq, ks, pos0, scale, scores, g, (u - g * n_tiles) * KV_TILE, vec)


@njit(cache=True, error_model="numpy")
def _scores_tile(q, qs, kt, ks, pos0, scale, scores, g, j0, vec):
    """Positions j0 .. j0 + KV_TILE - 1 of KV head g for every row that reaches them (outside the parallel
    region, like _attend). Vectorised: 16 positions at a time, six (row, head) pairs per K vector load (12 of
    an AVX2 host's 16 registers); the rows that end inside the 16 take the same vector chains, each row's lanes
    stored up to its own end (lane by lane, they were a third of the pass at T = 512). q8_0 keys that more than six
    pairs read are dequantised once into a float32 block in L1 (the same values: the same bits)."""
    T, H, hd = q.shape
    group = H // kt.shape[0]
    if not vec:
        for t in range(max(0, j0 - pos0), T):
            for h in range(g * group, (g + 1) * group):
                _scores_scalar(q, kt, ks, g, t, h, hd, j0, min(j0 + KV_TILE, pos0 + t + 1), scale, scores[t * H + h])
        return
    pk = kt.ctypes.data + g * kt.strides[0] + j0 // KV_TILE * kt.strides[1] - kt.itemsize * j0  # + itemsize * jc
    pd = ks.ctypes.data + g * ks.strides[0] + j0 // KV_TILE * ks.strides[1] - ks.itemsize * j0
    n_c = (min(j0 + KV_TILE, pos0 + T) - j0 + 15) // 16  # chunks of 16 positions
    N = T * group  # the (row, head) pairs; pair P: row P // group, head g * group + P % group
    # q8_0: the tile staged once, chunk c's dimension i of 16 positions at 64 (c hd + i) bytes (qs stands in where
    # nothing is staged: no allocation per tile)
    q8 = is_q8(kt) and N > 6
    kf = np.empty((n_c * hd, 16), np.float32) if q8 else qs
    if q8:
        for c in range(n_c):
            jc = j0 + 16 * c
            _stage_keys(kt, pk + jc, kt.strides[2], pd + 2 * jc, ks.strides[2], hd, kf[c * hd :])  # 1 and 2 bytes
    # blocks of six pairs (ending at N), each over every chunk all its rows reach, its rows of qs staying in L1
    # (chunk by chunk over every pair, the window's rows were read from L2 again for each 16 positions)
    for e in range(N, 0, -6):
        b = max(0, e - 6)
        for c in range(n_c):
            if b // group < j0 + 16 * c + 15 - pos0:  # its first row ends inside this chunk, and the next ones
                break
            _chunk_six(qs, kt, ks, kf, q8, pk, pd, scores, j0 + 16 * c, c, g, group, H, hd, b, e - b)
    for c in range(n_c):
        jc = j0 + 16 * c
        tf = max(0, jc + 15 - pos0)  # rows tf.. reach all 16 positions
        lo = tf * group
        e = N - 6 * ((N - lo - 1) // 6)  # the end of the block holding pair lo
        if lo < N and max(0, e - 6) < lo:  # that block began in a row that ends inside the chunk: its pairs from lo
            _chunk_six(qs, kt, ks, kf, q8, pk, pd, scores, jc, c, g, group, H, hd, lo, e - lo)
        t0 = max(0, jc - pos0)  # rows t0 .. tf - 1 end inside the 16: their lanes up to the row's end are kept
        for p in range(0, (min(tf, T) - t0) * group, 6):
            _scores_diag(qs, kt, pk + kt.itemsize * jc, kt.strides[2], pd + ks.itemsize * jc, ks.strides[2], scores,
                         jc, t0, pos0, g, group, H, hd, p, min(6, (min(tf, T) - t0) * group - p))


@njit(cache=True, inline="always")
def _chunk_six(qs, kt, ks, kf, q8, pk, pd, scores, jc, c, g, group, H, hd, p, m):
    """Positions jc .. jc + 15 (chunk c of a tile) of the pairs p .. p + m - 1 (m <= 6; from row 0): _six's
    chains, from the staged float32 keys where q8, else from the stored keys; missing pairs unstored."""
    if q8:
        r0, r1, r2, r3, r4, r5, a0, a1, a2, a3, a4, a5 = _six(qs, kf, kf.ctypes.data + 64 * c * hd, 64, 0, 0, 0, g,
                                                              group, H, hd, p, m)
    else:
        r0, r1, r2, r3, r4, r5, a0, a1, a2, a3, a4, a5 = _six(qs, kt, pk + kt.itemsize * jc, kt.strides[2],
                                                              pd + ks.itemsize * jc, ks.strides[2], 0, g, group, H,
                                                              hd, p, m)
    _store_six(scores.ctypes.data + 4 * jc, scores.strides[0], m, r0, r1, r2, r3, r4, r5, a0, a1, a2, a3, a4, a5)


@njit(cache=True, inline="always")
def _scores_diag(qs, kt, pj, sk, pd, sd, scores, jc, t0, pos0, g, group, H, hd, p, m):
    """_chunk_six for pairs of rows t0.. that end inside positions jc .. jc + 15: every lane's chain is
    computed (the same chain as a full row's), each row's lanes stored up to its own last position only (the
    rest would run past the row, or past the scores' last column)."""
    r0, r1, r2, r3, r4, r5, a0, a1, a2, a3, a4, a5 = _six(qs, kt, pj, sk, pd, sd, t0, g, group, H, hd, p, m)
    _store_upto(scores, jc, pos0, H, r0, a0)
    if m > 1:
        _store_upto(scores, jc, pos0, H, r1, a1)
    if m > 2:
        _store_upto(scores, jc, pos0, H, r2, a2)
    if m > 3:
        _store_upto(scores, jc, pos0, H, r3, a3)
    if m > 4:
        _store_upto(scores, jc, pos0, H, r4, a4)
    if m > 5:
        _store_upto(scores, jc, pos0, H, r5, a5)


@njit(cache=True, inline="always")
def _store_upto(scores, jc, pos0, H, r, a):
    """scores[r, jc .. pos0 + t] = a's first lanes, t = r // H the pair's row (its last position pos0 + t)."""
    for i in range(min(16, pos0 + r // H + 1 - jc)):
        scores[r, jc + i] = lane(a, i)


@njit(cache=True, inline="always")
def _six(qs, kt, pj, sk, pd, sd, t0, g, group, H, hd, p, m):
    """The six chains of pairs p .. p + m - 1 of rows t0.. (pair p: row t0 + p // group, head g * group +
    p % group) over 16 positions, one fma chain over i per score: their scores rows and the accumulators (missing
    pairs repeat the last one). kt: an array of the keys' type; their dimension i at pj + i * sk, q8_0 their
    scales' block b at pd + b * sd (converted once per 32 dimensions)."""
    r0 = _pair_row(p, t0, g, group, H)
    r1, h = _next_row(r0, p % group, 1, m, group, H)
    r2, h = _next_row(r1, h, 2, m, group, H)
    r3, h = _next_row(r2, h, 3, m, group, H)
    r4, h = _next_row(r3, h, 4, m, group, H)
    r5, h = _next_row(r4, h, 5, m, group, H)
    a0 = a1 = a2 = a3 = a4 = a5 = zero_f()
    nb = kv_block(kt, hd)
    for i0 in range(0, hd, nb):
        d = k_scales(kt, pd + i0 // 32 * sd)
        for i in range(i0, i0 + nb):
            a0, a1, a2, a3, a4, a5 = _fma_six(qs, i, r0, r1, r2, r3, r4, r5, m, ld_kv(pj + i * sk, kt, d),
                                              a0, a1, a2, a3, a4, a5)
    return r0, r1, r2, r3, r4, r5, a0, a1, a2, a3, a4, a5


@njit(cache=True, inline="always")
def _stage_keys(kt, pj, sk, pd, sd, hd, kf):
    """kf[i] = the 16 keys of dimension i at pj + i * sk as float32 (q8_0: times their scales, block b's at
    pd + b * sd)."""
    for i0 in range(0, hd, 32):
        d = k_scales(kt, pd + i0 // 32 * sd)
        for i in range(i0, i0 + 32):
            st_f32(kf.ctypes.data + 64 * i, ld_kv(pj + i * sk, kt, d))


@njit(cache=True, inline="always")
def _fma_six(w, c, r0, r1, r2, r3, r4, r5, m, v, a0, a1, a2, a3, a4, a5):
    """One chain step of six accumulators: a_k + w[r_k, c] * v, the last three only where m > 3 (a test the
    caller's loop does not change: LLVM compiles a three-pair loop and a six-pair one)."""
    a0 = fma_f(splat_f(w[r0, c]), v, a0)
    a1 = fma_f(splat_f(w[r1, c]), v, a1)
    a2 = fma_f(splat_f(w[r2, c]), v, a2)
    if m > 3:
        a3 = fma_f(splat_f(w[r3, c]), v, a3)
        a4 = fma_f(splat_f(w[r4, c]), v, a4)
        a5 = fma_f(splat_f(w[r5, c]), v, a5)
    return a0, a1, a2, a3, a4, a5


@njit(cache=True, inline="always")
def _store_six(base, stride, m, r0, r1, r2, r3, r4, r5, a0, a1, a2, a3, a4, a5):
    """The vector a_k at base + r_k * stride for k < m."""
    st_f32(base + r0 * stride, a0)
    if m > 1:
        st_f32(base + r1 * stride, a1)
    if m > 2:
        st_f32(base + r2 * stride, a2)
    if m > 3:
        st_f32(base + r3 * stride, a3)
    if m > 4:
        st_f32(base + r4 * stride, a4)
    if m > 5:
        st_f32(base + r5 * stride, a5)


@njit(cache=True, inline="always")
def _next_row(r, h, k, m, group, H):
    """(row, head in its group) of a six's pair k from pair k - 1's (r, h), the same where k >= m: the next
    head, or the group's first in the next row (no division per pair)."""
    if k >= m:
        return r, h
    if h + 1 == group:
        return r + 1 + H - group, 0
    return r + 1, h + 1


@njit(cache=True, inline="always")
def _pair_row(p, t0, g, group, H):
    """Row t * H + h of the pair p of a task's (row, head) pairs: row t0 + p // group, head g * group + p % group."""
    return (t0 + p // group) * H + g * group + p % group


@njit(cache=True, parallel=True, error_model="numpy")
def softmax_window(scores, T, H, pos0, inv):
    """scores[t * H + h, :L] (L = pos0 + t + 1) → exp(s - max) in place, inv[t * H + h] = 1 / their sum."""
    vec = scores.strides[1] == 4
    for u in prange(T * H):
        inv[u] = _softmax_row(scores[u], pos0 + u // H + 1, vec)


@njit(cache=True, error_model="numpy")
def _softmax_row(s, L, vec):
    """s[:L] → exp(s - max) in place; 1 / their sum. Outside the parallel region, like _attend, with the max 16
    lanes at a time (exact in any order): the pass at T = 4 and 32K positions 0.78 -> 0.61 ms."""
    m = _vmax(s, L) if vec else np.max(s[:L])
    for j in range(L):
        s[j] = expf(s[j] - m)
    return np.float32(1.0) / sum_fixed(s[:L])


@njit(cache=True, parallel=True, error_model="numpy")
def values_kv(scores, inv, vc, pos0, out, halves=False):
    """The value pass over stored values [Hkv, ctx, hd] (float32, f16 bits (uint16) or a q8_0 pair: quants, scale
    bits [Hkv, ctx, hd/32]) after softmax_window: out[t, h, i] = the chain over positions j <= pos0 + t of
    (p[t, h, j] * inv[t, h]) * v[j, i] that `attention` computes (an fma chain where vectorised; a q8_0 value
    q * d is exact in float32). One task per (KV head, KV_ROWS rows) walks the positions in tiles of KV_TILE,
    each V tile read from memory once, whole rows in order (tasks of 32 features, each reading half of every row,
    were slower at 32K positions), then reused from L1 by every row and head of the task; the accumulators wait
    in a scratch block between tiles, which leaves every chain as it is. With `halves` (the caller's: the KV heads
    do not divide among the threads) and more than six (row, head) pairs a head (compute, not the read, bounds
    the pass), each head's pairs split in two tasks, the halves of a head at the same time on different threads
    (the second read of a tile comes from the shared cache): 32K positions, three KV heads, T = 4: 1.78 -> 1.51 ms."""
    T, H, hd = out.shape
    vq, vs = kv_parts(vc)
    vec = hd % 16 == 0 and vq.strides[2] == vq.itemsize and scores.strides[1] == 4 and out.strides[2] == 4
    Hkv = vq.shape[0]
    group = H // Hkv
    nb = (T + KV_ROWS - 1) // KV_ROWS
    ns = 2 if halves and nb == 1 and T * group > 6 else 1
    for u in prange(Hkv * nb * ns):
        g, b, c = u // nb, u % nb, 0
        if ns > 1:
            g, b, c = u % Hkv, 0, u // Hkv
        t0 = b * KV_ROWS
        t1 = min(t0 + KV_ROWS, T)
        n = (t1 - t0) * group
        _values_task(scores, inv, vq, vs, pos0, out, g, t0, c * n // ns, (c + 1) * n // ns, vec)


@njit(cache=True, error_model="numpy")
def _values_task(scores, inv, vc, vs, pos0, out, g, t0, p0, p1, vec):
    """The pairs p0 .. p1 - 1 of rows t0.. and the heads of g (pair p: row t0 + p // group, head g * group +
    p % group), outside the parallel region, like _attend. Vectorised: per tile, the weights of its pairs once,
    then 16 features at a time, six pairs per V vector load; the rows that end inside the tile one pair at a
    time. q8_0: the tile's scales are converted to float32 first (a half converted in the loop merges into a
    register that LLVM may take from an accumulator: a false dependency that serialised the chains); a tile that
    more than six pairs read is dequantised once into a float32 tile in L1 (the same values: the same bits)."""
    H, w = out.shape[1], out.shape[2]
    group = H // vc.shape[0]
    n = p1 - p0  # local pair k is pair p0 + k
    e0 = pos0 + t0 + 1  # pair p's row reads positions below e0 + p // group
    acc = np.zeros((n, w), np.float32)
    pt = np.empty((n, KV_TILE), np.float32)
    vf = np.empty((KV_TILE, w), np.float32) if is_q8(vc) and n > 6 else acc  # the staged tile
    ds = np.empty((w // 32, KV_TILE), np.float32) if is_q8(vc) else pt  # its scales: block b's at ds[b]
    pv = vc.ctypes.data + g * vc.strides[0]
    for j0 in range(0, e0 + (p1 - 1) // group, KV_TILE):
        j1 = min(j0 + KV_TILE, e0 + (p1 - 1) // group)
        ka = min(n, max(0, (j0 + 1 - e0) * group - p0))  # local pairs ka.. reach this tile
        kb = min(n, max(ka, (j1 - e0) * group - p0))  # kb.. reach all of it
        for k in range(ka, n):
            th = _pair_row(p0 + k, t0, g, group, H)
            e = min(j1, e0 + (p0 + k) // group)
            _weights(scores, th, inv[th], j0, e, pt, k, vec)
            if not vec:
                a = acc[k]
                for j in range(j0, e):  # as _softmax_pv's scalar loop
                    for i in range(w):
                        a[i] += pt[k, j - j0] * value_at(vc, vs, g, j, i)
        if not vec:
            continue
        if is_q8(vc):
            for b in range(w // 32):
                for j in range(j0, j1):
                    ds[b, j - j0] = stored_f32(vs[g, j, b])  # h2f (the branch compiles for every type)
        if is_q8(vc) and n - ka > 6:
            for j in range(j0, j1):
                for c in range(0, w, 16):
                    st_f32(vf.ctypes.data + vf.strides[0] * (j - j0) + 4 * c,
                           ld_kv(pv + j * vc.strides[1] + c, vc, v_scale(vc, ds.ctypes.data + c // 32 * ds.strides[0]
                                                                         + 4 * (j - j0))))
            for c in range(0, w, 16):
                _values_tile(pt, acc, vf, vf.ctypes.data + 4 * c, vf.strides[0], 0, 0, j0, j1, c, n, ka, kb, e0, p0,
                             group)
        else:
            for c in range(0, w, 16):
                _values_tile(pt, acc, vc, pv + j0 * vc.strides[1] + vc.itemsize * c, vc.strides[1],
                             ds.ctypes.data + c // 32 * ds.strides[0], 4, j0, j1, c, n, ka, kb, e0, p0, group)
    for k in range(n):  # element by element: a slice assignment compiles a shape-error path (seconds, per type)
        o = out[t0 + (p0 + k) // group, g * group + (p0 + k) % group]
        for i in range(w):
            o[i] = acc[k, i]


@njit(cache=True, inline="always")
def _weights(scores, th, f, j0, e, pt, k, vec):
    """pt[k, :e - j0] = scores[th, j0:e] * f, 16 products at a time where vectorised (the loop element by element
    was not: 45 % of the value pass at 3.5K positions)."""
    n16 = (e - j0) // 16 * 16 if vec else 0
    ps = scores.ctypes.data + th * scores.strides[0] + 4 * j0
    pp = pt.ctypes.data + k * pt.strides[0]
    fv = splat_f(f)
    for j in range(0, n16, 16):
        st_f32(pp + 4 * j, mul_f(ld_f32(ps + 4 * j), fv))
    for j in range(j0 + n16, e):
        pt[k, j - j0] = scores[th, j] * f


@njit(cache=True, inline="always")
def _values_tile(pt, acc, vc, pv, sj, pd, sd, j0, j1, c, n, ka, kb, e0, p0, group):
    """Features c .. c + 15 of the tile's positions j0 .. j1 - 1 for the task's local pairs ka.. that reach it:
    six pairs at a time for kb.., which reach all of it, then one at a time (see _values_six)."""
    for k in range(kb, n, 6):
        _values_six(pt, acc, vc, pv, sj, pd, sd, j0, j1, c, k, min(6, n - k))
    for k in range(ka, kb):
        _values_six(pt, acc, vc, pv, sj, pd, sd, j0, min(j1, e0 + (p0 + k) // group), c, k, 1)


@njit(cache=True, inline="always")
def _values_six(pt, acc, vc, pv, sj, pd, sd, j0, j1, c, p, m):
    """acc[p + r, c : c + 16] continues its fma chain over positions j0 <= j < j1 with pt[p + r, j - j0] *
    v[j, c : c + 16] for r < m <= 6. vc: an array of the values' type; position j0 + k's 16 values at pv + k * sj,
    q8_0 their scale (float32) at pd + k * sd. Missing pairs repeat the last one, unstored."""
    p1 = p + min(1, m - 1)
    p2 = p + min(2, m - 1)
    p3 = p + min(3, m - 1)
    p4 = p + min(4, m - 1)
    p5 = p + min(5, m - 1)
    pa = acc.ctypes.data + 4 * c
    sa = acc.strides[0]
    a0 = ld_f32(pa + p * sa)
    a1 = ld_f32(pa + p1 * sa)
    a2 = ld_f32(pa + p2 * sa)
    a3 = ld_f32(pa + p3 * sa)
    a4 = ld_f32(pa + p4 * sa)
    a5 = ld_f32(pa + p5 * sa)
    for j in range(j0, j1):
        v = ld_kv(pv + (j - j0) * sj, vc, v_scale(vc, pd + (j - j0) * sd))
        a0, a1, a2, a3, a4, a5 = _fma_six(pt, j - j0, p, p1, p2, p3, p4, p5, m, v, a0, a1, a2, a3, a4, a5)
    _store_six(pa, sa, m, p, p1, p2, p3, p4, p5, a0, a1, a2, a3, a4, a5)


def attention_kv(q, k, v, pos0, scale, out, scores) -> None:
    """Attention over a cache layer's stored keys and values, each a float32 array, f16 bits (uint16) or a q8_0
    (quants, scale bits) pair. float32 on both sides: one row is the one-pass `attention`, a window the score,
    softmax and value passes that read each K and V block once per PREFILL_ROWS rows (bitwise the same rows);
    `attention` also takes the rare layouts that are not stride-1, where the two would choose different code."""
    T, H, hd = q.shape
    if hd % 32 and (isinstance(k, tuple) or isinstance(v, tuple)):  # the passes read whole blocks
        raise ValueError(f"q8_0 KV needs a head size that is a multiple of 32, got {hd}")
    if row_fits(q, k, v, out, scores):  # one row, heads in fours, on an AVX-512 host: gqa_row.py
        attention_row(q, k, v, pos0, scale, out, scores)
        return
    if not isinstance(k, tuple) and not isinstance(v, tuple) and k.dtype == v.dtype == np.float32:
        if T == 1 or any(a.strides[-1] != 4 for a in (q, k, v, out, scores)):
            attention(q, k, v, pos0, scale, out, scores)
            return
    # a prefill chunk in blocks of PREFILL_ROWS rows: each block's scores (not the chunk's: 300 MB at 16K
    # positions) stay in the shared cache between the passes; each row's chains are what they are alone
    halves = (v[0] if isinstance(v, tuple) else v).shape[0] % get_num_threads() != 0
    inv = np.empty(min(T, PREFILL_ROWS) * H, np.float32)
    for t0 in range(0, T, PREFILL_ROWS):
        t1 = min(T, t0 + PREFILL_ROWS)
        scores_kv(q[t0:t1], k, pos0 + t0, scale, scores)
        softmax_window(scores, t1 - t0, H, pos0 + t0, inv)
        values_kv(scores, inv, v, pos0 + t0, out[t0:t1], halves)


# attention_kv's choice for one C-contiguous row, named to a compiled caller by the dtype of an empty array
# (MARKS[mode]) so that only the chosen kernel is compiled into it (kernels/cpu/decode_row.py: a literal argument
# sends every call through Numba's slow dispatch, a function-typed one keeps the caller out of its cache):
# attention_row, `attention`, the window passes (values_kv's `halves` as it would be now: a compiled function
# that asks the thread count cannot be cached)
ROW, ONE_PASS, PASSES, PASSES_HALVES = 0, 1, 2, 3
MARKS = tuple(np.empty(0, t) for t in (np.int8, np.int16, np.int32, np.int64))


def row_mode(H: int, hd: int, k, v) -> int:
    """attention_kv's kernel for one row of H heads of size hd over stored operands k, v."""
    if kv_row_fits(H, hd, k, v):
        return ROW
    if not isinstance(k, tuple) and not isinstance(v, tuple) and k.dtype == v.dtype == np.float32:
        return ONE_PASS
    return window_mode(v)


def window_mode(v) -> int:
    """attention_kv's kernel for a window of 2 to PREFILL_ROWS stride-1 rows over stored values v: the passes,
    the value pass in halves where the KV heads do not split evenly over the threads."""
    return PASSES_HALVES if (v[0] if isinstance(v, tuple) else v).shape[0] % get_num_threads() else PASSES


def attend_row(mark, q, k, v, pos0, scale, out, scores):
    """Row 0 of q [1, H, hd] by the kernel MARKS[row_mode(...)] names (Numba only)."""
    raise NotImplementedError


@overload(attend_row)
def _attend_row(mark, q, k, v, pos0, scale, out, scores):
    m = {types.int8: ROW, types.int16: ONE_PASS, types.int32: PASSES, types.int64: PASSES_HALVES}[mark.dtype]
    if m == ROW:
        return lambda mark, q, k, v, pos0, scale, out, scores: attention_row(q, k, v, pos0, scale, out, scores)
    if m == ONE_PASS:
        return lambda mark, q, k, v, pos0, scale, out, scores: attention(q, k, v, pos0, scale, out, scores)
    halves = m == PASSES_HALVES

    def passes(mark, q, k, v, pos0, scale, out, scores):
        inv = np.empty(q.shape[0] * q.shape[1], np.float32)
        scores_kv(q, k, pos0, scale, scores)
        softmax_window(scores, q.shape[0], q.shape[1], pos0, inv)
        # a bool, not the constant's literal type: values_kv's specialisation is attention_kv's (one compile, which a
        # compile helper may already have cached)
        h = halves if q.shape[0] >= 0 else not halves
        values_kv(scores, inv, v, pos0, out, h)
    return passes
