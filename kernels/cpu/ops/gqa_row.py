"""One row's attention (T = 1, every decode step) on an AVX-512 host, over a KV cache of any stored type, and the
vector helpers it shares with the window kernels of gqa.py.

The general row loop (gqa.attention) handles one to three optional heads per pass, and LLVM leaves those
loop-invariant branches inside its inner loops (3-4x the work at 512 positions). Here the query heads of a KV head
go in fours (a group a multiple of 4, head_dim a multiple of 64: Qwen3, Qwen3.5, Llama-3): four heads x 64
positions (scores) or 64 features (values) in 16 of AVX-512's 32 registers, with no branch in the inner loops.
Every score and output element is the general loops' chain (the same products in the same order, the stored
values read exactly as the window passes read them), so a row is bitwise what `attention` and the window passes
give it: row invariance holds across the two.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from ..intrinsics import fma32
from ..simd import AVX512BW, fma_f, lane, ld_f32, max_f, prefetch, splat_f, st_f32, zero_f
from .kv import KV_TILE, is_q8, k_scales, key_at, kv_block, kv_parts, ld_kv, stored_f32, v_scale
from .rows import expf, sum_fixed

WIDE_ROW = AVX512BW  # 16 accumulators and their operands fit 32 registers; AVX2's 16 would spill


def row_fits(q, k, v, out, scores) -> bool:
    """Whether attention_row takes this call: one row, heads in fours, whole 64s of head_dim, stride-1 operands."""
    T, H, hd = q.shape
    return T == 1 and kv_row_fits(H, hd, k, v) and all(a.strides[-1] == a.itemsize for a in (q, out, scores))


def kv_row_fits(H: int, hd: int, k, v) -> bool:
    """row_fits for a row of H heads of size hd over these stored operands, its own arrays stride-1."""
    parts = [*(k if isinstance(k, tuple) else (k,)), *(v if isinstance(v, tuple) else (v,))]
    Hkv = parts[0].shape[0]
    return (WIDE_ROW and H % Hkv == 0 and (H // Hkv) % 4 == 0 and hd % 64 == 0
            and all(a.strides[-1] == a.itemsize for a in parts))


@njit(cache=True, parallel=True, error_model="numpy")
def attention_row(q, k, v, pos0, scale, out, scores):
    """Row 0 of q [1, H, hd] at position pos0 over stored keys and values (gqa.attention_kv's operands): one task
    per KV head, the heads sharing it in fours. scores [H, >= pos0 + 1] scratch."""
    kq, ks = kv_parts(k)
    vq, vs = kv_parts(v)
    H = q.shape[1]
    Hkv = kq.shape[0]
    for g in prange(Hkv):
        _attend_row(q, kq, ks, vq, vs, pos0, scale, out, scores, g, H // Hkv)


@njit(cache=True, error_model="numpy")
def _attend_row(q, kq, ks, vq, vs, pos0, scale, out, scores, g, group):
    """KV head g's query heads (outside the parallel region, where LLVM keeps the accumulators in registers)."""
    L = pos0 + 1
    h0 = g * group
    _scores_row(q, kq, ks, g, h0, group, L, scale, scores)
    pb, invs = _softmax_rows(scores, 0, q.shape[1], h0, group, L, True)
    _values_row(pb, invs, vq, vs, g, h0, group, L, out)


@njit(cache=True, inline="always")
def _scores_row(q, kq, ks, g, h0, group, L, scale, scores):
    """scores[h0 + r, j], j < L: whole key tiles four heads at a time (a tile read from memory once, then from L1
    by the next four; past L only where the tile and the scratch row have room: those scores go unused), then
    16 positions a head at a time, then lane by lane."""
    hd = q.shape[2]
    qs = np.empty((group, hd), np.float32)  # q * scale: the product each chain step starts with
    for r in range(group):
        for i in range(hd):
            qs[r, i] = q[0, h0 + r, i] * scale
    blk = kv_block(kq, hd)
    pk = kq.ctypes.data + g * kq.strides[0]
    pd = ks.ctypes.data + g * ks.strides[0]
    ss = scores.strides[0]
    ps = scores.ctypes.data + h0 * ss
    W = min(kq.shape[1] * KV_TILE, scores.shape[1])
    j = 0
    while j < L and j + KV_TILE <= W:
        tk, td = pk + j // KV_TILE * kq.strides[1], pd + j // KV_TILE * ks.strides[1]
        _scores_four(qs, 0, kq, ks, tk, td, blk, ps + 4 * j, ss, True)  # it prefetches the next tile
        for r in range(4, group, 4):
            _scores_four(qs, r, kq, ks, tk, td, blk, ps + r * ss + 4 * j, ss, False)
        j += KV_TILE
    while j < L and j + 16 <= W:
        o = j % KV_TILE
        for r in range(group):
            _scores_16(qs, r, kq, ks, pk + j // KV_TILE * kq.strides[1] + kq.itemsize * o,
                       pd + j // KV_TILE * ks.strides[1] + ks.itemsize * o, blk, ps + r * ss + 4 * j)
        j += 16
    for r in range(group):
        for jj in range(j, L):
            a = np.float32(0.0)
            for i in range(hd):
                a = fma32(qs[r, i], key_at(kq, ks, g, i, jj), a)
            scores[h0 + r, jj] = a


@njit(cache=True, inline="always")
def _scores_four(qs, r, kq, ks, pk, pd, blk, ps, ss, pf):
    """Heads r .. r + 3 at the 64 positions of one key tile (dimension i at pk + i * kq.strides[2]; q8_0: the
    scales of dimensions ib .. ib + 31 at pd + ib // 32 * ks.strides[2]) into ps, ps + ss, ps + 2 ss, ps + 3 ss;
    `pf` (a constant at each call) prefetches the next tile (a decode step finds the cache cold)."""
    hd = qs.shape[1]
    sk = kq.strides[2]
    w = 16 * kq.itemsize
    dw = 16 * ks.itemsize
    a0 = a1 = a2 = a3 = b0 = b1 = b2 = b3 = c0 = c1 = c2 = c3 = d0 = d1 = d2 = d3 = zero_f()
    for ib in range(0, hd, blk):
        p = pd + ib // 32 * ks.strides[2]
        s0, s1, s2, s3 = k_scales(kq, p), k_scales(kq, p + dw), k_scales(kq, p + 2 * dw), k_scales(kq, p + 3 * dw)
        for i in range(ib, ib + blk):
            p = pk + i * sk
            if pf:
                _ahead(p + kq.strides[1], 4 * w)
            k0 = ld_kv(p, kq, s0)
            k1 = ld_kv(p + w, kq, s1)
            k2 = ld_kv(p + 2 * w, kq, s2)
            k3 = ld_kv(p + 3 * w, kq, s3)
            a0, a1, a2, a3 = _fma4(splat_f(qs[r, i]), k0, k1, k2, k3, a0, a1, a2, a3)
            b0, b1, b2, b3 = _fma4(splat_f(qs[r + 1, i]), k0, k1, k2, k3, b0, b1, b2, b3)
            c0, c1, c2, c3 = _fma4(splat_f(qs[r + 2, i]), k0, k1, k2, k3, c0, c1, c2, c3)
            d0, d1, d2, d3 = _fma4(splat_f(qs[r + 3, i]), k0, k1, k2, k3, d0, d1, d2, d3)
    _st4(ps, a0, a1, a2, a3)
    _st4(ps + ss, b0, b1, b2, b3)
    _st4(ps + 2 * ss, c0, c1, c2, c3)
    _st4(ps + 3 * ss, d0, d1, d2, d3)


@njit(cache=True, inline="always")
def _scores_16(qs, r, kq, ks, pk, pd, blk, ps):
    """Head r at 16 positions (their keys at pk, scales at pd as _scores_four's) into ps."""
    hd = qs.shape[1]
    a = zero_f()
    for ib in range(0, hd, blk):
        s = k_scales(kq, pd + ib // 32 * ks.strides[2])
        for i in range(ib, ib + blk):
            a = fma_f(splat_f(qs[r, i]), ld_kv(pk + i * kq.strides[2], kq, s), a)
    st_f32(ps, a)


@njit(cache=True, inline="always")
def _values_row(pb, invs, vq, vs, g, h0, group, L, out):
    """out[0, h0 + r, i] = the chain over j < L of (p[r, j] * inv[r]) * v[j, i]: the weights formed once (the
    products the general loop forms), then per key tile of positions (their V rows read from memory once, then
    from L1) one loop per four heads x 64 features, the accumulators kept in `acc` between tiles (which leaves
    every chain as it is). q8_0: a tile's scales converted to float32 first (as the window pass does)."""
    hd = vq.shape[2]
    for r in range(group):
        w = pb[r]
        iv = invs[r]
        for j in range(L):
            w[j] = w[j] * iv
    pv = vq.ctypes.data + g * vq.strides[0]
    sj = vq.strides[1]
    acc = np.zeros((group, hd), np.float32)
    pa = acc.ctypes.data
    sa = acc.strides[0]
    ds = np.empty((KV_TILE, hd // 32) if is_q8(vq) else (0, 0), np.float32)  # the tile's scales, float32
    pds = ds.ctypes.data
    for j0 in range(0, L, KV_TILE):
        j1 = min(j0 + KV_TILE, L)
        if is_q8(vq):
            for j in range(j0, j1):
                for b in range(hd // 32):
                    ds[j - j0, b] = stored_f32(vs[g, j, b])
        for c in range(0, hd, 64):  # the first four heads prefetch the next tile's rows, the others find them
            _values_four(pb, 0, vq, pv, sj, pds, pa + 4 * c, sa, c, j0, j1, True)
            for r in range(4, group, 4):
                _values_four(pb, r, vq, pv, sj, pds, pa + r * sa + 4 * c, sa, c, j0, j1, False)
    for r in range(group):
        for i in range(hd):
            out[0, h0 + r, i] = acc[r, i]


@njit(cache=True, inline="always")
def _values_four(pb, r, vq, pv, sj, pds, p, sa, c, j0, j1, pf):
    """Heads r .. r + 3, features c .. c + 63, positions j0 .. j1 - 1: the accumulators at p, p + sa, ... carried
    on; `pf` (a constant at each call) prefetches the next tile's rows of these features."""
    hd = vq.shape[2]
    w = 16 * vq.itemsize
    a0, a1, a2, a3 = _ld4(p)
    b0, b1, b2, b3 = _ld4(p + sa)
    c0, c1, c2, c3 = _ld4(p + 2 * sa)
    d0, d1, d2, d3 = _ld4(p + 3 * sa)
    for j in range(j0, j1):
        v = pv + j * sj + vq.itemsize * c
        if pf:
            _ahead(v + KV_TILE * sj, 4 * w)  # a decode step finds the cache cold
        e = pds + 4 * ((j - j0) * (hd // 32) + c // 32)  # q8_0: the scales of features c.., c + 32..
        v0 = ld_kv(v, vq, v_scale(vq, e))
        v1 = ld_kv(v + w, vq, v_scale(vq, e))
        v2 = ld_kv(v + 2 * w, vq, v_scale(vq, e + 4))
        v3 = ld_kv(v + 3 * w, vq, v_scale(vq, e + 4))
        a0, a1, a2, a3 = _fma4(splat_f(pb[r, j]), v0, v1, v2, v3, a0, a1, a2, a3)
        b0, b1, b2, b3 = _fma4(splat_f(pb[r + 1, j]), v0, v1, v2, v3, b0, b1, b2, b3)
        c0, c1, c2, c3 = _fma4(splat_f(pb[r + 2, j]), v0, v1, v2, v3, c0, c1, c2, c3)
        d0, d1, d2, d3 = _fma4(splat_f(pb[r + 3, j]), v0, v1, v2, v3, d0, d1, d2, d3)
    _st4(p, a0, a1, a2, a3)
    _st4(p + sa, b0, b1, b2, b3)
    _st4(p + 2 * sa, c0, c1, c2, c3)
    _st4(p + 3 * sa, d0, d1, d2, d3)


@njit(cache=True, inline="always")
def _ahead(p, n):
    """Prefetch the n bytes at p (whole cache lines; a hint that never faults)."""
    for c in range(0, n, 64):
        prefetch(p + c)


@njit(cache=True, inline="always")
def _ld4(p):
    return ld_f32(p), ld_f32(p + 64), ld_f32(p + 128), ld_f32(p + 192)


@njit(cache=True, inline="always")
def _st4(p, a0, a1, a2, a3):
    st_f32(p, a0)
    st_f32(p + 64, a1)
    st_f32(p + 128, a2)
    st_f32(p + 192, a3)


@njit(cache=True, inline="always")
def _fma4(p, k0, k1, k2, k3, a0, a1, a2, a3):
    """a_i + p * k_i for four vectors (one chain step of four accumulators)."""
    return fma_f(p, k0, a0), fma_f(p, k1, a1), fma_f(p, k2, a2), fma_f(p, k3, a3)


@njit(cache=True, inline="always")
def _vmax(sc, L):
    """max(sc[:L]) (exact in any order): 16 lanes at a time."""
    p = sc.ctypes.data
    m = sc[0]
    if L >= 16:
        v = ld_f32(p)
        j = 16
        while j + 16 <= L:
            v = max_f(v, ld_f32(p + 4 * j))
            j += 16
        for i in range(16):
            m = max(m, lane(v, i))
    else:
        j = 1
    for jj in range(j, L):
        m = max(m, sc[jj])
    return m


@njit(cache=True, inline="always")
def _softmax_rows(scores, t, H, h0, group, L, vec):
    """(exp(s - max) [group, L], 1 / their sums [group]) of the row's scores[t * H + h, :L] for the heads
    h = h0 .. h0 + group - 1."""
    invs = np.empty(group, np.float32)
    pb = np.empty((group, L), np.float32)  # exp(s - max): a separate buffer (in place, LLVM's alias check fails)
    for r in range(group):
        sc = scores[t * H + h0 + r][:L]
        m = _vmax(sc, L) if vec else np.max(sc)
        p = pb[r]
        for j in range(L):  # one vectorised pass (expf: fmas, 16 lanes)
            p[j] = expf(sc[j] - m)
        invs[r] = np.float32(1.0) / sum_fixed(p)
    return pb, invs


@njit(cache=True, inline="always")
def _store_heads(out, t, h, c, n, a0, a1, a2, a3):
    po = out.ctypes.data + t * out.strides[0] + h * out.strides[1] + 4 * c
    st_f32(po, a0)
    if n > 1:
        st_f32(po + 64, a1)
    if n > 2:
        st_f32(po + 128, a2)
    if n > 3:
        st_f32(po + 192, a3)

