"""Plain-NumPy twins of the quantized-matrix kernels (the oracle for kernels/cpu/quant.py).

`dequantize` is written from the ggml block layouts (ggml-common.h / ggml-quants.c `dequantize_row_*`),
not by calling `gguf.quants`; the tests check that both agree bit for bit. Every product and sum is done in
float32 in the same order as ggml's reference C code, which is what makes bit-exactness possible.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as Q

# block facts live in kernels/blocks.py and the records of kernels/quant_types.py (shared with the fast kernels);
# re-exported for callers
from . import blocks as B
from .blocks import KVALUES_IQ4NL, QK, QK_K, iq4xs_scales, k_scale_min  # noqa: F401
from .quant_types import BLOCK, F16_SCALES, act_block, row_bytes  # noqa: F401


def _f16(b: np.ndarray) -> np.ndarray:
    """[..., 2] little-endian bytes → float32 [...] (exact)."""
    return np.ascontiguousarray(b).view(np.float16)[..., 0].astype(np.float32)


def _nibbles(qs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return qs & np.uint8(0x0F), qs >> np.uint8(4)


def _blocks(raw: np.ndarray, qtype: int, shape) -> tuple[np.ndarray, int, int]:
    shape = tuple(int(s) for s in shape)
    n_cols = shape[-1]
    n_rows = int(np.prod(shape[:-1])) if len(shape) > 1 else 1
    bs, ts = BLOCK[Q(qtype)]
    b = np.ascontiguousarray(raw).view(np.uint8).reshape(n_rows, row_bytes(qtype, n_cols))
    return b.reshape(n_rows, n_cols // bs, ts), n_rows, n_cols


def dequantize(qtype: int, raw: np.ndarray, shape) -> np.ndarray:
    """Raw GGUF tensor data → float32 array of `shape` (numpy order, last axis = row)."""
    qt = Q(int(qtype))
    shape = tuple(int(s) for s in shape)
    if qt not in BLOCK:
        raise NotImplementedError(f"no reference dequantisation for {qt.name}")
    blk, n_rows, n_cols = _blocks(raw, qt, shape)
    nb = blk.shape[1]
    f32 = np.float32
    if qt == Q.F32:
        y = blk.reshape(n_rows, -1).view(np.float32).copy()
    elif qt == Q.F16:
        y = blk.reshape(n_rows, -1).view(np.float16).astype(f32)
    elif qt == Q.BF16:
        y = (blk.reshape(n_rows, -1).view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    elif qt == Q.Q8_0:
        d = _f16(blk[..., 0:2])[..., None]
        q = blk[..., 2:34].view(np.int8).astype(f32)
        y = q * d
    elif qt in (Q.Q4_0, Q.Q4_1, Q.IQ4_NL):
        off = 4 if qt == Q.Q4_1 else 2
        d = _f16(blk[..., 0:2])[..., None]
        lo, hi = _nibbles(blk[..., off : off + 16])
        q = np.concatenate([lo, hi], axis=-1)  # element j ← low nibble of byte j, j+16 ← high nibble
        if qt == Q.Q4_0:
            y = d * (q.astype(np.int8) - np.int8(8)).astype(f32)
        elif qt == Q.Q4_1:
            m = _f16(blk[..., 2:4])[..., None]
            y = d * q.astype(f32) + m
        else:
            y = d * KVALUES_IQ4NL[q].astype(f32)
    elif qt == Q.Q5_0:
        d = _f16(blk[..., 0:2])[..., None]
        qh = np.ascontiguousarray(blk[..., 2:6]).view(np.uint32)  # [n_rows, nb, 1]
        lo, hi = _nibbles(blk[..., 6:22])
        q = np.concatenate([lo, hi], axis=-1).astype(np.int32)
        hb = (qh >> np.arange(32, dtype=np.uint32)) & 1
        q = (q | (hb.astype(np.int32) << 4)) - 16
        y = d * q.astype(f32)
    elif qt in (Q.Q4_K, Q.Q5_K):
        d = _f16(blk[..., 0:2])[..., None]
        dmin = _f16(blk[..., 2:4])[..., None]
        sc, mn = k_scale_min(blk[..., 4:16])
        if qt == Q.Q4_K:
            qs = blk[..., 16:144].reshape(n_rows, nb, 4, 32)
        else:
            qh = blk[..., 16:48]  # bit s of qh[j] → high bit of element 32*s + j
            qs = blk[..., 48:176].reshape(n_rows, nb, 4, 32)
        lo, hi = _nibbles(qs)  # sub-block 2i ← low nibbles of bytes 32i.., 2i+1 ← high nibbles
        q = np.stack([lo, hi], axis=3).reshape(n_rows, nb, 8, 32).astype(np.int32)
        if qt == Q.Q5_K:
            hb = (qh[:, :, None, :].astype(np.int32) >> np.arange(8)[None, None, :, None]) & 1
            q = q | (hb << 4)
        ds = (d * sc.astype(f32))[..., None]  # d * scale, rounded to f32 first
        dm = (dmin * mn.astype(f32))[..., None]
        y = ds * q.astype(f32) - dm
    elif qt == Q.Q6_K:
        ql = blk[..., 0:128].reshape(n_rows, nb, 2, 64)
        qh = blk[..., 128:192].reshape(n_rows, nb, 2, 32)
        sc = blk[..., 192:208].view(np.int8).astype(f32)  # one per 16 elements
        d = _f16(blk[..., 208:210])[..., None]
        lo, hi = _nibbles(ql)
        q4 = np.concatenate([lo, hi], axis=-1).reshape(n_rows, nb, 2, 4, 32)  # r = 64*nib + l64
        h2 = (qh[:, :, :, None, :] >> (2 * np.arange(4, dtype=np.uint8))[None, None, None, :, None]) & 3
        q = (q4.astype(np.int32) | (h2.astype(np.int32) << 4)) - 32
        ds = (d * sc).reshape(n_rows, nb, 16, 1)
        y = ds * q.reshape(n_rows, nb, 16, 16).astype(f32)
    elif qt == Q.IQ4_XS:
        d = _f16(blk[..., 0:2])[..., None]
        sh = np.ascontiguousarray(blk[..., 2:4]).view(np.uint16)[..., 0]
        ls = iq4xs_scales(sh, blk[..., 4:8])
        lo, hi = _nibbles(blk[..., 8:136].reshape(n_rows, nb, 8, 16))
        q = np.concatenate([lo, hi], axis=-1)  # [.., 8, 32]
        dl = (d * ls.astype(f32))[..., None]
        y = dl * KVALUES_IQ4NL[q].astype(f32)
    elif qt in _NEW:
        y = _NEW[qt](blk, n_rows, nb)
    else:  # pragma: no cover
        raise NotImplementedError(qt.name)
    return np.ascontiguousarray(y, dtype=np.float32).reshape(shape)


# ---------------------------------------------------------------------------------------------------------
# the K-quants below 4 bits, the IQ2/IQ3/IQ1 grids and MXFP4, one function each:
# blk [n_rows, nb, bytes] → float32 [n_rows, nb, ...]
def _signs(bits: np.ndarray, n: int = 8) -> np.ndarray:
    """[...] sign bytes → float32 [..., n]: -1 where bit j is set (kmask_iq2xs[j]), else +1."""
    b = (bits[..., None].astype(np.uint32) >> np.arange(n, dtype=np.uint32)) & 1
    return np.where(b == 1, np.float32(-1), np.float32(1))


def _deq_q5_1(blk, n_rows, nb):  # dequantize_row_q5_1: x*d + m, 5th bit j of qh → element j
    d, m = _f16(blk[..., 0:2])[..., None], _f16(blk[..., 2:4])[..., None]
    qh = np.ascontiguousarray(blk[..., 4:8]).view(np.uint32)
    lo, hi = _nibbles(blk[..., 8:24])
    q = np.concatenate([lo, hi], axis=-1).astype(np.int32) | (((qh >> np.arange(32, dtype=np.uint32)) & 1) << 4)
    return q.astype(np.float32) * d + m


def _deq_q2_k(blk, n_rows, nb):  # dequantize_row_q2_K: 16 sub-blocks of 16, 4-bit scale and min per sub-block
    sc = blk[..., 0:16]
    d, dmin = _f16(blk[..., 80:82])[..., None], _f16(blk[..., 82:84])[..., None]
    dl = (d * (sc & 15).astype(np.float32))[..., None]  # [.., 16, 1]
    ml = (dmin * (sc >> 4).astype(np.float32))[..., None]
    qs = blk[..., 16:80].reshape(n_rows, nb, 2, 1, 32)  # half, shift, byte l → element 128h + 32s + l
    q = (qs >> (2 * np.arange(4, dtype=np.uint8))[:, None]) & 3
    return dl * q.reshape(n_rows, nb, 16, 16).astype(np.float32) - ml


def _deq_q3_k(blk, n_rows, nb):  # dequantize_row_q3_K: 2 low bits in qs, -4 unless the hmask bit is set
    hm = blk[..., 0:32]
    qs = blk[..., 32:96].reshape(n_rows, nb, 2, 1, 32)
    dl = (_f16(blk[..., 108:110])[..., None] * B.q3k_scales(blk[..., 96:108]).astype(np.float32))[..., None]
    lo = ((qs >> (2 * np.arange(4, dtype=np.uint8))[:, None]) & 3).astype(np.int8)  # [.., 2, 4, 32]
    hb = (hm[:, :, None, :] >> np.arange(8, dtype=np.uint8)[:, None]) & 1  # bit 4h + s → [.., 8, 32]
    q = lo.reshape(n_rows, nb, 8, 32) - np.where(hb == 1, 0, 4).astype(np.int8)
    return dl * q.reshape(n_rows, nb, 16, 16).astype(np.float32)


def _deq_mxfp4(blk, n_rows, nb):  # dequantize_row_mxfp4: kvalues_mxfp4[nibble] * e8m0_half(e)
    d = B.e8m0_half(blk[..., 0])[..., None]
    lo, hi = _nibbles(blk[..., 1:17])
    return B.KVALUES_MXFP4[np.concatenate([lo, hi], axis=-1)].astype(np.float32) * d


def _grid_signs(db, grid, signs):
    """db * grid[j] * (±1), rounded as ggml does: (db * grid) then the sign (exact)."""
    return db * grid.astype(np.float32) * signs


def _deq_iq2_xxs(blk, n_rows, nb):  # dequantize_row_iq2_xxs: per 32: 4 grid bytes + u32 (4 x 7 sign bits, scale)
    d = _f16(blk[..., 0:2])
    q = blk[..., 2:66].reshape(n_rows, nb, 8, 8)
    aux = np.ascontiguousarray(q[..., 4:8]).view(np.uint32)[..., 0]  # [.., 8]
    db = d[..., None] * (np.float32(0.5) + (aux >> 28).astype(np.float32)) * np.float32(0.25)
    sidx = (aux[..., None] >> (7 * np.arange(4, dtype=np.uint32))) & 127
    signs = _signs(B.KSIGNS_IQ2XS[sidx])  # [.., 8, 4, 8]
    return _grid_signs(db[..., None, None], B.GRID_IQ2XXS[q[..., 0:4]], signs)


def _iq2_db(sc):
    """IQ2_XS / IQ2_S: two 4-bit scales per 32 → float32 [.., 8, 2] factors (0.5 + s) * 0.25 before d."""
    return np.stack([sc & 15, sc >> 4], axis=-1).astype(np.float32)


def _deq_iq2_xs(blk, n_rows, nb):  # dequantize_row_iq2_xs: u16 = 9-bit grid index | 7-bit sign index
    d = _f16(blk[..., 0:2])[..., None, None]
    qs = np.ascontiguousarray(blk[..., 2:66]).view(np.uint16).reshape(n_rows, nb, 8, 4)
    db = d * (np.float32(0.5) + _iq2_db(blk[..., 66:74])) * np.float32(0.25)  # [.., 8, 2]
    signs = _signs(B.KSIGNS_IQ2XS[qs >> 9])
    return _grid_signs(np.repeat(db, 2, axis=-1)[..., None], B.GRID_IQ2XS[qs & 511], signs)


def _deq_iq2_s(blk, n_rows, nb):  # dequantize_row_iq2_s: 8 + 2 (qh) bit grid index, explicit sign bytes
    d = _f16(blk[..., 0:2])[..., None, None]
    qs = blk[..., 2:34].reshape(n_rows, nb, 8, 4).astype(np.int32)
    sg = blk[..., 34:66].reshape(n_rows, nb, 8, 4)
    qh = blk[..., 66:74].astype(np.int32)[..., None]
    idx = qs | ((qh << (8 - 2 * np.arange(4))) & 0x300)
    db = d * (np.float32(0.5) + _iq2_db(blk[..., 74:82])) * np.float32(0.25)
    return _grid_signs(np.repeat(db, 2, axis=-1)[..., None], B.GRID_IQ2S[idx], _signs(sg))


def _deq_iq3_xxs(blk, n_rows, nb):  # dequantize_row_iq3_xxs: 2 grid bytes (4 + 4 elements) per 8, u32 per 32
    d = _f16(blk[..., 0:2])[..., None]
    qs = blk[..., 2:66].reshape(n_rows, nb, 8, 4, 2)
    aux = np.ascontiguousarray(blk[..., 66:98]).view(np.uint32)  # [.., 8]
    db = d * (np.float32(0.5) + (aux >> 28).astype(np.float32)) * np.float32(0.5)
    signs = _signs(B.KSIGNS_IQ2XS[(aux[..., None] >> (7 * np.arange(4, dtype=np.uint32))) & 127])
    grid = B.GRID_IQ3XXS[qs].reshape(n_rows, nb, 8, 4, 8)
    return _grid_signs(db[..., None, None], grid, signs)


def _deq_iq3_s(blk, n_rows, nb):  # dequantize_row_iq3_s: 8 + 1 (qh) bit grid index per 4, sign bytes, odd scales
    d = _f16(blk[..., 0:2])[..., None]
    qs = blk[..., 2:66].reshape(n_rows, nb, 8, 8).astype(np.int32)
    qh = blk[..., 66:74].astype(np.int32)[..., None]
    idx = qs | ((qh << (8 - np.arange(8))) & 256)  # grid k of 32: bit k of qh
    sg = blk[..., 74:106].reshape(n_rows, nb, 8, 4)
    sc = blk[..., 106:110]
    s4 = np.stack([sc & 15, sc >> 4], axis=-1).reshape(n_rows, nb, 8)
    db = d * (1 + 2 * s4).astype(np.float32)
    grid = B.GRID_IQ3S[idx].reshape(n_rows, nb, 8, 4, 8)
    return _grid_signs(db[..., None, None], grid, _signs(sg))


def _iq1(dl, grid, neg):
    """dl * (grid[j] + delta), delta = -IQ1S_DELTA where `neg` else +IQ1S_DELTA (exact in float32)."""
    delta = np.where(neg, np.float32(-B.IQ1S_DELTA), np.float32(B.IQ1S_DELTA))
    return dl * (grid.astype(np.float32) + delta)


def _deq_iq1_s(blk, n_rows, nb):  # dequantize_row_iq1_s: 8 + 3 bit grid index per 8, u16 per 32 (scale, sign)
    d = _f16(blk[..., 0:2])[..., None]
    qs = blk[..., 2:34].reshape(n_rows, nb, 8, 4).astype(np.int32)
    qh = np.ascontiguousarray(blk[..., 34:50]).view(np.uint16).astype(np.int32)  # [.., 8]
    dl = d * (2 * ((qh >> 12) & 7) + 1).astype(np.float32)
    idx = qs | (((qh[..., None] >> (3 * np.arange(4))) & 7) << 8)
    neg = (qh & 0x8000) != 0
    return _iq1(dl[..., None, None], B.GRID_IQ1S[idx], neg[..., None, None])


def _deq_iq1_m(blk, n_rows, nb):  # dequantize_row_iq1_m: 3-bit scales per 16, d spread over the scale words
    qs = blk[..., 0:32].reshape(n_rows, nb, 8, 4).astype(np.int32)
    qh = blk[..., 32:48].reshape(n_rows, nb, 8, 2).astype(np.int32)
    sc = np.ascontiguousarray(blk[..., 48:56]).view(np.uint16).astype(np.int32)  # [.., 4]
    d = B.iq1m_d(sc)[..., None]
    s3 = (sc[..., :, None] >> (3 * np.arange(4))) & 7  # [.., 4, 4]: 16-element groups 4w + k
    dl = d * (2 * s3.reshape(n_rows, nb, 16) + 1).astype(np.float32)  # [.., 16]
    h = np.stack([qh, qh >> 4], axis=-1).reshape(n_rows, nb, 8, 4)  # grid l ← nibble l % 2 of qh[l // 2]
    idx = qs | ((h & 7) << 8)
    grid = B.GRID_IQ1S[idx].reshape(n_rows, nb, 16, 2, 8)
    neg = ((h & 8) != 0).reshape(n_rows, nb, 16, 2)
    return _iq1(dl[..., None, None], grid, neg[..., None])


_NEW = {
    Q.Q5_1: _deq_q5_1,
    Q.Q2_K: _deq_q2_k,
    Q.Q3_K: _deq_q3_k,
    Q.MXFP4: _deq_mxfp4,
    Q.IQ2_XXS: _deq_iq2_xxs,
    Q.IQ2_XS: _deq_iq2_xs,
    Q.IQ2_S: _deq_iq2_s,
    Q.IQ3_XXS: _deq_iq3_xxs,
    Q.IQ3_S: _deq_iq3_s,
    Q.IQ1_S: _deq_iq1_s,
    Q.IQ1_M: _deq_iq1_m,
}


def quantize_act_q8(x: np.ndarray, block: int = 32) -> np.ndarray:
    """The int8-activation path's view of rows x [T, K] (K a multiple of `block`), as float64: each block of
    `block` elements (32: Q8_0's rule; 256: Q8_K's, for the super-block weight types) quantised as d = max|x| /
    127, q = rint(x * (1 / d)), all in float32, then q * d exactly. Twin of kernels/cpu/qdot.quantize_acts."""
    x = np.asarray(x, np.float32)
    T, K = x.shape
    xb = x.reshape(T, K // block, block)
    d = (np.abs(xb).max(-1) / np.float32(127.0)).astype(np.float32)
    inv = np.zeros_like(d)
    np.divide(np.float32(1.0), d, out=inv, where=d > 0)
    q = np.rint(xb * inv[..., None]).astype(np.float32)
    return (q.astype(np.float64) * d[..., None].astype(np.float64)).reshape(T, K)


def matmul_ref(w: np.ndarray, x: np.ndarray, act: int | None = None) -> np.ndarray:
    """out[t, n] = sum_k w[n, k] * x[t, k], accumulated in float64, returned as float32. w [N, K], x [T, K].
    act: the activations as the int8 path quantises them, in blocks of `act` (quantize_act_q8)."""
    w64 = np.asarray(w, np.float64)
    x64 = quantize_act_q8(x, act) if act else np.asarray(x, np.float64)
    return (x64 @ w64.T).astype(np.float32)


def random_raw(qtype: int, n_rows: int, n_cols: int, rng: np.random.Generator, scale: float = 0.1) -> np.ndarray:
    """Random raw GGUF data for an [n_rows, n_cols] matrix, shaped as GGUFReader returns it: random quant
    bytes with sane f16 scales (uniform in [-scale, scale]); float types hold standard normal values."""
    qt = Q(int(qtype))
    if qt == Q.F32:
        return rng.standard_normal((n_rows, n_cols), dtype=np.float32)
    if qt == Q.F16:
        return rng.standard_normal((n_rows, n_cols), dtype=np.float32).astype(np.float16)
    if qt == Q.BF16:
        bits = rng.standard_normal((n_rows, n_cols), dtype=np.float32).view(np.uint32) >> 16
        return bits.astype(np.uint16).view(np.uint8).reshape(n_rows, 2 * n_cols)
    bs, ts = BLOCK[qt]
    nb = n_cols // bs
    raw = rng.integers(0, 256, (n_rows, nb, ts), dtype=np.uint8)
    for off in F16_SCALES[qt]:
        d = rng.uniform(-scale, scale, (n_rows, nb)).astype(np.float16)
        raw[..., off : off + 2] = d.view(np.uint8).reshape(n_rows, nb, 2)
    if qt == Q.MXFP4:  # shared exponent e: scale 2^(e - 128), kept near 1/16
        raw[..., 0] = rng.integers(120, 126, (n_rows, nb), dtype=np.uint8)
    if qt == Q.IQ1_M:  # the f16 d lives in the top nibbles of the 4 scale words (bytes 48..55)
        d = rng.uniform(-scale, scale, (n_rows, nb)).astype(np.float16).view(np.uint16)
        w = np.ascontiguousarray(raw[..., 48:56]).view(np.uint16)  # [n_rows, nb, 4]
        for k in range(4):
            w[..., k] = (w[..., k] & 0x0FFF) | (((d >> (4 * k)) & 0xF) << 12)
        raw[..., 48:56] = w.view(np.uint8)
    return raw.reshape(n_rows, nb * ts)
