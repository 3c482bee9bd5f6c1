"""The KV cache's stored forms for the attention kernels: keys in tiles of KV_TILE positions (and their
NumPy accessors), the q8_0 quantiser of rows, and the typed accessors (f32, f16 bits, q8_0 pairs) that the
attention passes read through."""

from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.extending import overload

from ..intrinsics import f2h, h2f
from ..simd import bc_f32, cvt, ld_f32, ld_h2f, ld_s8, mul_f, zero_f

# Keys are stored in tiles of KV_TILE positions, [..., ctx/KV_TILE, hd, KV_TILE]: within a tile each dimension's
# positions are adjacent (the score loops run over positions), and a tile is one contiguous block, so a score pass
# streams K from memory. Transposed whole ([hd, ctx]) it read hd strided rows at once, more streams than the
# hardware prefetchers follow: 3-5 GB/s from memory where the tiles read at 7-8 (same chains, bitwise).
KV_TILE = 64  # positions per key tile, and per score task: a tile stays in L1 while every row and head uses it


def key_tiles(rows: int) -> int:
    """Tiles that hold `rows` key positions."""
    return -(-rows // KV_TILE)


def tile_keys(kt: np.ndarray) -> np.ndarray:
    """Keys transposed [..., hd, ctx] -> tiles [..., key_tiles(ctx), hd, KV_TILE] (positions past ctx zero)."""
    *lead, hd, ctx = kt.shape
    n = key_tiles(ctx)
    out = np.zeros((*lead, n, hd, KV_TILE), kt.dtype)
    put_keys(out, 0, kt)
    return out


def _key_spans(lo: int, hi: int):
    """(tile, first, end) of positions lo .. hi - 1 within each key tile they touch, and their offset from lo."""
    j = lo
    while j < hi:
        t, a = divmod(j, KV_TILE)
        b = min(KV_TILE, a + hi - j)
        yield t, a, b, j - lo
        j += b - a


def put_keys(tiles: np.ndarray, lo: int, x: np.ndarray) -> None:
    """Positions lo .. lo + n of key tiles [..., n_tiles, hd, KV_TILE] = x [..., hd, n] (broadcast over the leading
    axes)."""
    for t, a, b, o in _key_spans(lo, lo + x.shape[-1]):
        tiles[..., t, :, a:b] = x[..., o : o + b - a]


def get_keys(tiles: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """Positions lo .. hi - 1 of key tiles [..., n_tiles, hd, KV_TILE] as [..., hd, hi - lo] (a copy)."""
    *lead, _, hd, _ = tiles.shape
    out = np.empty((*lead, hd, hi - lo), tiles.dtype)
    for t, a, b, o in _key_spans(lo, hi):
        out[..., o : o + b - a] = tiles[..., t, :, a:b]
    return out

@njit(cache=True, error_model="numpy")
def kv_quantize_q8_0(x, qs, d):
    """Rows x [N, hd] (hd a multiple of 32) → quants qs [N, hd] int8 and scales d [N, hd/32] float32 (stored as
    f16 by the caller): Q8_0's rule, d = max|x| / 127, q = rint(x * (1 / d)) in float32."""
    N, hd = x.shape
    for n in range(N):
        for b in range(hd // 32):
            amax = np.float32(0.0)
            for i in range(32 * b, 32 * b + 32):
                amax = max(amax, abs(x[n, i]))
            db = amax / np.float32(127.0)
            inv = np.float32(1.0) / db if db > 0 else np.float32(0.0)
            d[n, b] = db
            for i in range(32 * b, 32 * b + 32):
                qs[n, i] = np.int8(np.rint(x[n, i] * inv))



def put_key_row(kt, k, pos):
    """Position pos of a layer's stored keys (tiles of any stored type, as kv_layer gives them) = k [Hkv, hd]
    float32, converted as HostBackend.kv_write converts a window's rows (Numba only: a decode row's one call)."""
    raise NotImplementedError


def put_value_row(vc, v, pos):
    """Position pos of a layer's stored values = v [Hkv, hd], as put_key_row (Numba only)."""
    raise NotImplementedError


@overload(put_key_row)
def _put_key_row(kt, k, pos):
    if isinstance(kt, types.BaseTuple):  # q8_0: quants and f16 scale bits per 32 dimensions
        def put(kt, k, pos):
            qs, d = _q8_rows(k)
            t, j = pos // KV_TILE, pos % KV_TILE
            for g in range(k.shape[0]):
                for i in range(k.shape[1]):
                    kt[0][g, t, i, j] = qs[g, i]
                for b in range(d.shape[1]):
                    kt[1][g, t, b, j] = f2h(d[g, b])
        return put
    conv = _to_stored(kt.dtype)

    def put(kt, k, pos):
        t, j = pos // KV_TILE, pos % KV_TILE
        for g in range(k.shape[0]):
            for i in range(k.shape[1]):
                kt[g, t, i, j] = conv(k[g, i])
    return put


@overload(put_value_row)
def _put_value_row(vc, v, pos):
    if isinstance(vc, types.BaseTuple):
        def put(vc, v, pos):
            qs, d = _q8_rows(v)
            for g in range(v.shape[0]):
                for i in range(v.shape[1]):
                    vc[0][g, pos, i] = qs[g, i]
                for b in range(d.shape[1]):
                    vc[1][g, pos, b] = f2h(d[g, b])
        return put
    conv = _to_stored(vc.dtype)

    def put(vc, v, pos):
        for g in range(v.shape[0]):
            for i in range(v.shape[1]):
                vc[g, pos, i] = conv(v[g, i])
    return put


def layer_operand(a, li):
    """Layer li of a stacked KV operand (KVCache.kv_stacked: an array [L, ...], or (quants, scales)), as kv_layer
    gives it (Numba only)."""
    raise NotImplementedError


@overload(layer_operand, inline="always")
def _layer_operand(a, li):
    if isinstance(a, types.BaseTuple):
        return lambda a, li: (a[0][li], a[1][li])
    return lambda a, li: a[li]


def _to_stored(dtype):
    """float32 → the stored element: itself, or f16 bits."""
    if dtype == types.uint16:
        return njit(inline="always")(lambda x: f2h(x))
    return njit(inline="always")(lambda x: x)


@njit(cache=True)
def _q8_rows(x):
    """kv_quantize_q8_0 of rows x [N, hd]: (quants, float32 scales)."""
    qs = np.empty(x.shape, np.int8)
    d = np.empty((x.shape[0], x.shape[1] // 32), np.float32)
    kv_quantize_q8_0(x, qs, d)
    return qs, d

# Stored KV values by type, for the passes above: an array of float32 or f16 bits (uint16), or a q8_0 pair
# (int8 quants, f16 scale bits). The passes take a pair's arrays apart once (kv_parts: a float array stands for
# its own scales, unused), so their loops index plain arrays, with no reference counting. A q8_0 value q * d is
# exact in float32 (8 bits of q times 11 of d): every type's chains are float32 attention's over the stored values.
def kv_parts(k):
    """(values or quants, scale bits or the array itself) of a stored K or V operand."""
    raise NotImplementedError


def stored_f32(x):
    """A stored float32 or f16 value (uint16 bits) as float32 (Numba only)."""
    raise NotImplementedError


def kv_stride1(k, ks):
    """Whether the vectors of kv_parts (k, ks) are stride-1 along their last axis (q8_0: both arrays)."""
    raise NotImplementedError


def kv_block(k, hd):
    """Dimensions per key scale: 32 for q8_0, hd (one loop) for the float types."""
    raise NotImplementedError


def key_at(kt, ks, g, i, j):
    """Key dimension i of position j of KV head g as float32, from kv_parts (kt, ks) of any stored type."""
    raise NotImplementedError


def value_at(vc, vs, g, j, i):
    """Value feature i of position j of KV head g as float32, from kv_parts (vc, vs) of any stored type."""
    raise NotImplementedError


def k_scales(kt, addr):
    """q8_0 keys: 16 positions' scales (f16 bits at addr) as f32 lanes; the float types: unused zeros."""
    raise NotImplementedError


def v_scale(vc, addr):
    """q8_0 values: one scale (the float32 at addr) in every lane; the float types: unused zeros."""
    raise NotImplementedError


def is_q8(k):
    """Whether kv_parts' first array holds q8_0 quants (a constant for the compiler)."""
    raise NotImplementedError


def ld_kv(addr, like, d):
    """16 stored KV values at addr as float32 lanes, for an array `like` of float32, f16 bits or q8_0 quants
    (times the scales d: exact)."""
    raise NotImplementedError


def _q8(a):
    return isinstance(a, types.Array) and a.dtype == types.int8


@overload(is_q8, inline="always")
def _is_q8(k):
    return (lambda k: True) if _q8(k) else (lambda k: False)


@overload(kv_parts, inline="always")
def _kv_parts(k):
    return (lambda k: (k[0], k[1])) if isinstance(k, types.BaseTuple) else (lambda k: (k, k))


@overload(stored_f32, inline="always")
def _stored_f32(x):
    if x == types.uint16:
        return lambda x: h2f(x)
    return lambda x: np.float32(x)


@overload(kv_stride1, inline="always")
def _kv_stride1(k, ks):
    if _q8(k):
        return lambda k, ks: k.strides[3] == 1 and ks.strides[3] == 2
    return lambda k, ks: k.strides[3] == k.itemsize


@overload(kv_block, inline="always")
def _kv_block(k, hd):
    return (lambda k, hd: 32) if _q8(k) else (lambda k, hd: hd)


@overload(key_at, inline="always")
def _key_at(kt, ks, g, i, j):
    if _q8(kt):
        return lambda kt, ks, g, i, j: (np.float32(kt[g, j // KV_TILE, i, j % KV_TILE])
                                        * h2f(ks[g, j // KV_TILE, i // 32, j % KV_TILE]))
    return lambda kt, ks, g, i, j: stored_f32(kt[g, j // KV_TILE, i, j % KV_TILE])


@overload(value_at, inline="always")
def _value_at(vc, vs, g, j, i):
    if _q8(vc):
        return lambda vc, vs, g, j, i: np.float32(vc[g, j, i]) * h2f(vs[g, j, i // 32])
    return lambda vc, vs, g, j, i: stored_f32(vc[g, j, i])


@overload(k_scales, inline="always")
def _k_scales(kt, addr):
    return (lambda kt, addr: ld_h2f(addr)) if _q8(kt) else (lambda kt, addr: zero_f())


@overload(v_scale, inline="always")
def _v_scale(vc, addr):
    return (lambda vc, addr: bc_f32(addr)) if _q8(vc) else (lambda vc, addr: zero_f())


@overload(ld_kv, inline="always")
def _ld_kv(addr, like, d):
    if _q8(like):
        return lambda addr, like, d: mul_f(cvt(ld_s8(addr)), d)  # vpmovsxbd, vcvtdq2ps, vmulps
    if like.dtype == types.uint16:
        return lambda addr, like, d: ld_h2f(addr)  # vcvtph2ps
    return lambda addr, like, d: ld_f32(addr)

