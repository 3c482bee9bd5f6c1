"""Plain-NumPy twins of the quantized-matrix kernels (the oracle for kernels/cpu/quant.py).

`dequantize` is written from the ggml block layouts (ggml-common.h / ggml-quants.c `dequantize_row_*`),
not by calling `gguf.quants`; the tests check that both agree bit for bit. Every product and sum is done in
float32 in the same order as ggml's reference C code, which is what makes bit-exactness possible.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as Q

# block facts live in kernels/blocks.py (shared with the fast kernels); re-exported for callers
from .blocks import BLOCK, KVALUES_IQ4NL, QK, QK_K, iq4xs_scales, k_scale_min, row_bytes  # noqa: F401


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
    else:  # pragma: no cover
        raise NotImplementedError(qt.name)
    return np.ascontiguousarray(y, dtype=np.float32).reshape(shape)


def matmul_ref(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """out[t, n] = sum_k w[n, k] * x[t, k], accumulated in float64, returned as float32. w [N, K], x [T, K]."""
    w64 = np.asarray(w, np.float64)
    x64 = np.asarray(x, np.float64)
    return (x64 @ w64.T).astype(np.float32)


# offsets of the f16 scale fields inside one block, per type (for building random test / benchmark blocks)
_F16_FIELDS = {
    Q.Q8_0: (0,),
    Q.Q4_0: (0,),
    Q.Q4_1: (0, 2),
    Q.Q5_0: (0,),
    Q.Q4_K: (0, 2),
    Q.Q5_K: (0, 2),
    Q.Q6_K: (208,),
    Q.IQ4_NL: (0,),
    Q.IQ4_XS: (0,),
}


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
    for off in _F16_FIELDS[qt]:
        d = rng.uniform(-scale, scale, (n_rows, nb)).astype(np.float16)
        raw[..., off : off + 2] = d.view(np.uint8).reshape(n_rows, nb, 2)
    return raw.reshape(n_rows, nb * ts)
