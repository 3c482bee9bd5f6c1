"""Packing for the int8 path (NumPy): a type's GGUF blocks → its packed fields (kernels/cpu/qdot/types.py roles),
and get_rows, the packed fields back to ggml's dequantised values bit for bit. `pack_numpy` packs the types that
packers.py has no kernel for, and is the kernels' twin for the rest."""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as Q

from ...blocks import (
    GRID_IQ1S,
    IQ1S_DELTA,
    KSIGNS_IQ2XS,
    KVALUES_IQ4NL,
    KVALUES_MXFP4,
    e8m0_half,
    iq1m_d,
    k_scale_min,
    q3k_scales,
)
from ...quant_types import QUANT_TYPES
from ..drivers import NT
from .types import _GRIDS, GL, NJ, SB, layout


# ---------------------------------------------------------------------------------------------------------
# packing: native blocks → planes (unsigned quants u [n, nb, 32] and scale fields per block / super-block)
# → the roles above. NumPy, in chunks of rows, so the loader's peak memory stays near the file's size.
def _f16bits(b: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(b).view(np.uint16)[..., 0]


def _nib32(qs16: np.ndarray) -> np.ndarray:
    """16 bytes per 32-element block (element j: low nibble of byte j, j + 16: high nibble) → u [.., 32]."""
    return np.concatenate([qs16 & 15, qs16 >> 4], axis=-1)


def _bits32(word: np.ndarray) -> np.ndarray:
    """u32 [..] → its 32 bits [.., 32] (bit j → element j)."""
    return ((word[..., None] >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8)


def _planes(qt: int, blk: np.ndarray) -> dict:
    """Native blocks [n, nbn, bytes] → 'u' (unsigned quants [n, nb, 32]) and the fields other than the quants."""
    n = blk.shape[0]
    if qt in (Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1):
        qs_at, hi = {Q.Q4_0: (2, None), Q.Q4_1: (4, None), Q.Q5_0: (6, 2), Q.Q5_1: (8, 4)}[Q(qt)]
        u = _nib32(blk[..., qs_at : qs_at + 16])
        p = {"d": _f16bits(blk[..., 0:2])}
        if qt in (Q.Q4_1, Q.Q5_1):
            p["m"] = _f16bits(blk[..., 2:4])
        if hi is not None:
            u = u | (_bits32(np.ascontiguousarray(blk[..., hi : hi + 4]).view(np.uint32)[..., 0]) << 4)
        p["u"] = u
        return p
    nsb = blk.shape[1]
    if qt in (Q.Q4_K, Q.Q5_K):
        sc, mn = k_scale_min(blk[..., 4:16])  # [n, nsb, 8]
        qs = blk[..., 16:144] if qt == Q.Q4_K else blk[..., 48:176]
        qs = qs.reshape(n, nsb, 4, 32)
        u = np.stack([qs & 15, qs >> 4], axis=3).reshape(n, nsb, 8, 32)  # sub-block 2i: low nibbles of chunk i
        if qt == Q.Q5_K:
            qh = blk[..., 16:48]  # bit s of qh[j] → element 32 s + j
            u = u | ((((qh[:, :, None, :] >> np.arange(8, dtype=np.uint8)[None, None, :, None]) & 1)) << 4)
        return {"u": u.reshape(n, nsb * 8, 32), "sm": np.stack([sc, mn], axis=-1).reshape(n, nsb * 8, 2),
                "d": _f16bits(blk[..., 0:2]), "dmin": _f16bits(blk[..., 2:4])}
    if qt == Q.Q6_K:
        ql = blk[..., 0:128].reshape(n, nsb, 2, 64)
        qh = blk[..., 128:192].reshape(n, nsb, 2, 32)
        q4 = np.concatenate([ql & 15, ql >> 4], axis=-1).reshape(n, nsb, 2, 4, 32)
        h2 = (qh[:, :, :, None, :] >> (2 * np.arange(4, dtype=np.uint8))[None, None, None, :, None]) & 3
        u = (q4 | (h2 << 4)).reshape(n, nsb * 8, 32)
        sc = blk[..., 192:208].view(np.int8).reshape(n, nsb * 8, 2)
        return {"u": u, "sc": sc, "d": _f16bits(blk[..., 208:210])}
    if qt == Q.Q2_K:
        qs = blk[..., 16:80].reshape(n, nsb, 2, 1, 32)
        u = ((qs >> (2 * np.arange(4, dtype=np.uint8))[:, None]) & 3).reshape(n, nsb * 8, 32)
        return {"u": u, "sm": blk[..., 0:16].reshape(n, nsb * 8, 2), "d": _f16bits(blk[..., 80:82]),
                "dmin": _f16bits(blk[..., 82:84])}
    if qt == Q.Q3_K:
        hm = blk[..., 0:32]
        qs = blk[..., 32:96].reshape(n, nsb, 2, 1, 32)
        lo = ((qs >> (2 * np.arange(4, dtype=np.uint8))[:, None]) & 3).reshape(n, nsb, 8, 32)
        hb = (hm[:, :, None, :] >> np.arange(8, dtype=np.uint8)[:, None]) & 1  # bit 4h + s → sub-block
        u = (lo | (hb << 2)).reshape(n, nsb * 8, 32)
        return {"u": u, "sc": q3k_scales(blk[..., 96:108]).reshape(n, nsb * 8, 2), "d": _f16bits(blk[..., 108:110])}
    if qt in (Q.IQ4_NL, Q.MXFP4):  # the nibbles are indices into the type's levels
        at = 2 if qt == Q.IQ4_NL else 1
        p = {"u": _nib32(blk[..., at : at + 16])}
        if qt == Q.IQ4_NL:
            p["d"] = _f16bits(blk[..., 0:2])
        else:
            p["e"] = blk[..., 0]
        return p
    if qt == Q.IQ4_XS:
        u = _nib32(blk[..., 8:136].reshape(n, nsb, 8, 16))
        lo = (blk[..., 4:8, None] >> np.array([0, 4], np.uint8)) & 15  # [n, nsb, 4, 2]: sub-block 2i + h
        hi = (np.ascontiguousarray(blk[..., 2:4]).view(np.uint16) >> (2 * np.arange(8, dtype=np.uint16))) & 3
        ls = (lo.reshape(n, nsb, 8) | (hi.astype(np.uint8) << 4)).astype(np.int8) - np.int8(32)
        return {"u": u.reshape(n, nsb * 8, 32), "ls": ls.reshape(n, nsb * 8), "d": _f16bits(blk[..., 0:2])}
    if qt in _GRIDS:
        return _grid_planes(qt, blk)
    if qt == Q.IQ1_S:  # per 32: four index low bytes and the GGUF's u16 (3 index bits per 8, scale, delta sign)
        n, nsb = blk.shape[:2]
        return {"gi": blk[..., 2:34].reshape(n, nsb * 8, 4), "qh": _f16bits(blk[..., 34:50].reshape(n, nsb * 8, 2)),
                "d": _f16bits(blk[..., 0:2])}
    if qt == Q.IQ1_M:
        n, nsb = blk.shape[:2]
        sw = np.ascontiguousarray(blk[..., 48:56]).view(np.uint16)  # [n, nsb, 4]: 3-bit scales, d's nibbles
        s3 = (sw[..., :, None] >> (3 * np.arange(4, dtype=np.uint16))) & 7  # [n, nsb, 4, 4]: per 16
        sc = (s3[..., 0::2] | (s3[..., 1::2] << 3)).astype(np.uint8)  # [n, nsb, 4, 2]: the two halves of a 32
        return {"gi": blk[..., 0:32].reshape(n, nsb * 8, 4), "qh": blk[..., 32:48].reshape(n, nsb * 8, 2),
                "sc": sc.reshape(n, nsb * 8), "d": np.ascontiguousarray(iq1m_d(sw).astype(np.float16)).view(np.uint16)}
    raise NotImplementedError(Q(qt).name)


def _grid_planes(qt: int, blk: np.ndarray) -> dict:
    """The grid types' fields per 32-element block: grid indices (per 8 or 4 elements; low bytes, the bits above
    in one byte), the 32 sign bits as one bit-plane word, the integer scales (2s + 1 for ggml's 0.5 + s; IQ3_S's
    1 + 2s; IQ2_XS/IQ2_S: the GGUF byte of two 4-bit s) and d."""
    n, nsb = blk.shape[:2]
    u32 = np.uint32
    if qt == Q.IQ2_XXS:
        q = blk[..., 2:66].reshape(n, nsb, 8, 8)
        gi = q[..., 0:4].astype(np.uint16)
        aux = np.ascontiguousarray(q[..., 4:8]).view(u32)[..., 0]
        sgn = KSIGNS_IQ2XS[(aux[..., None] >> (7 * np.arange(4, dtype=u32))) & 127]
        sc = (2 * (aux >> 28) + 1).astype(np.uint8)
    elif qt in (Q.IQ2_XS, Q.IQ2_S):
        if qt == Q.IQ2_XS:
            qs = np.ascontiguousarray(blk[..., 2:66]).view(np.uint16).reshape(n, nsb, 8, 4)
            gi, sgn, at = qs & 511, KSIGNS_IQ2XS[qs >> 9], 66
        else:
            qh = blk[..., 66:74].astype(np.uint16)[..., None]
            gi = blk[..., 2:34].reshape(n, nsb, 8, 4) | ((qh << (8 - 2 * np.arange(4, dtype=np.uint16))) & 0x300)
            sgn, at = blk[..., 34:66].reshape(n, nsb, 8, 4), 74
        sc = blk[..., at : at + 8]  # per 16 elements: s_A in the low nibble, s_B in the high
    elif qt == Q.IQ3_XXS:
        gi = blk[..., 2:66].reshape(n, nsb, 8, 8).astype(np.uint16)
        aux = np.ascontiguousarray(blk[..., 66:98]).view(u32)  # [n, nsb, 8]
        sgn = KSIGNS_IQ2XS[(aux[..., None] >> (7 * np.arange(4, dtype=u32))) & 127]
        sc = (2 * (aux >> 28) + 1).astype(np.uint8)
    else:  # IQ3_S
        qh = blk[..., 66:74].astype(np.uint16)[..., None]
        gi = blk[..., 2:66].reshape(n, nsb, 8, 8) | ((qh << (8 - np.arange(8, dtype=np.uint16))) & 256)
        sgn = blk[..., 74:106].reshape(n, nsb, 8, 4)
        s4 = blk[..., 106:110]
        sc = (1 + 2 * np.stack([s4 & 15, s4 >> 4], axis=-1)).astype(np.uint8).reshape(n, nsb, 8)
    bits = ((sgn[..., None] >> np.arange(8, dtype=np.uint8)) & 1).reshape(n, nsb * 8, 32)
    gi = gi.reshape(n, nsb * 8, -1).astype(np.uint16)
    p = {"gi": (gi & 255).astype(np.uint8), "sg": _word1(bits), "sc": sc.reshape(n, nsb * 8).astype(np.uint8),
         "d": _f16bits(blk[..., 0:2])}
    if qt != Q.IQ2_XXS and qt != Q.IQ3_XXS:  # the bits above 8 of group l at bit l (IQ2_S: bits 2l, 2l + 1)
        w = 2 if qt == Q.IQ2_S else 1
        p["gh"] = ((gi >> 8).astype(np.uint16) << (w * np.arange(gi.shape[-1], dtype=np.uint16))).sum(
            axis=-1, dtype=np.uint16).astype(np.uint8)
    return p


# [quad, byte] → the bit of an element in a 1-bit plane word, and the low bit of its field in a 2-bit one
_SH_Q = (8 * np.arange(4)[None, :] + np.arange(4)[:, None]).astype(np.uint32)
_SH_2 = (8 * np.arange(4)[None, :] + 2 * np.arange(4)[:, None]).astype(np.uint32)


def _quads4(u: np.ndarray) -> np.ndarray:
    lo = u & 15
    return (lo[..., 0:16] | (lo[..., 16:32] << 4)).reshape(u.shape[:-1] + (4, 4))


def _word1(hb: np.ndarray) -> np.ndarray:
    """Bits hb [.., 32] → one u32: byte i, bit q = element 4q + i; bit 4 + q = element 16 + 4q + i."""
    a = hb[..., 0:16].reshape(hb.shape[:-1] + (4, 4)).astype(np.uint32) << _SH_Q
    b = hb[..., 16:32].reshape(hb.shape[:-1] + (4, 4)).astype(np.uint32) << (_SH_Q + np.uint32(4))
    return (a.sum(axis=(-2, -1), dtype=np.uint32) + b.sum(axis=(-2, -1), dtype=np.uint32)).astype(np.uint32)


def _words2(v: np.ndarray) -> np.ndarray:
    """2-bit values v [.., 32] → u32 [.., 2]: word h, byte i, bits 2q..2q+1 = element 16h + 4q + i."""
    w = v.reshape(v.shape[:-1] + (2, 4, 4)).astype(np.uint32) << _SH_2
    return w.sum(axis=(-2, -1), dtype=np.uint32).astype(np.uint32)


def _encode(qt: int, p: dict) -> dict:
    """Planes → the packed fields of the type, per row [n, ...] (the feature axis first)."""
    if "u" not in p:  # the grid types' planes are their fields
        return p
    u = p["u"]
    out = {k: v for k, v in p.items() if k != "u"}
    if qt == Q.Q6_K:
        out["qs"], out["qh"] = _quads4(u), _words2(u >> 4)
    elif qt in (Q.Q2_K, Q.Q3_K):
        out["q2"] = _words2(u & 3)
        if qt == Q.Q3_K:
            out["qh"] = _word1(u >> 2)
    else:
        out["qs"] = _quads4(u)
        if qt in (Q.Q5_0, Q.Q5_1, Q.Q5_K):
            out["qh"] = _word1(u >> 4)
    return out


def _tile_into(dst: np.ndarray, a: np.ndarray, g0: int, role: str) -> None:
    """Write per-row a [n, nb, *rest] (n <= the tiles' rows) into dst[g0:...] with the feature axis moved to
    its place (second to last for quads, last otherwise); padding features stay zero."""
    n = a.shape[0]
    ntc = -(-n // NT)
    pad = np.zeros((ntc * NT,) + a.shape[1:], a.dtype)
    pad[:n] = a
    t = pad.reshape((ntc, NJ, GL) + a.shape[1:])
    t = np.moveaxis(t, 2, -2 if role in ("q4", "q8") else -1)  # b2, g4, g8: [.., 2 | 4 | 8, GL]
    dst[g0 : g0 + ntc] = t


_CHUNK = 1024  # rows packed at a time (a multiple of NT)


def pack_numpy(qtype: int, blk: np.ndarray, n_rows: int) -> tuple:
    """Packed arrays from the raw blocks [N, nb, block bytes] of a matrix, written chunk by chunk."""
    q = int(qtype)
    fields = QUANT_TYPES[Q(q)].i8
    N = int(n_rows)
    nbn = blk.shape[1]
    K = nbn * QUANT_TYPES[Q(q)].block
    outs = [np.zeros(shape, dt) for dt, shape in layout(q, N, K)]
    for r0 in range(0, N, _CHUNK):
        b = blk[r0 : r0 + _CHUNK]
        if q == Q.Q8_0:  # the GGUF bytes as they are, q + 128 (vpdpbusd multiplies an unsigned byte)
            f = {"qs": b[..., 2:34].reshape(b.shape[0], nbn, 8, 4) ^ np.uint8(0x80), "d": _f16bits(b[..., 0:2])}
        else:
            f = _encode(q, _planes(q, b))
        for (name, role, _), dst in zip(fields, outs, strict=True):
            _tile_into(dst, f[name], r0 // NT, role)
    return tuple(outs)


# ---------------------------------------------------------------------------------------------------------
# get_rows: the packed fields back to ggml's dequantize_row_* values, bit for bit (float32, ggml's order)
def _row_fields(fields: tuple, arrays: tuple, rows: np.ndarray) -> dict:
    g, j, n = rows // NT, rows % NT // GL, rows % GL
    out = {}
    for (name, role, _), a in zip(fields, arrays, strict=True):
        if role in ("q4", "q8"):
            out[name] = a[g, j, :, :, n, :]  # [R, nb, nq, 4]
        elif role in ("w", "b", "h", "hs"):
            out[name] = a[g, j, :, n]  # [R, nb]
        else:
            out[name] = a[g, j, :, :, n]  # [R, nb, 2 | 4 | 8]
    return out


def _unquad4(qs: np.ndarray) -> np.ndarray:
    b = qs.reshape(qs.shape[:-2] + (16,))
    return np.concatenate([b & 15, b >> 4], axis=-1)


def _unword1(w: np.ndarray) -> np.ndarray:
    bits = (w[..., None, None] >> _SH_Q) & 1  # [.., q, i]
    hi = (w[..., None, None] >> (_SH_Q + np.uint32(4))) & 1
    return np.concatenate([bits.reshape(w.shape + (16,)), hi.reshape(w.shape + (16,))], axis=-1).astype(np.uint8)


def _unwords2(w: np.ndarray) -> np.ndarray:
    v = (w[..., None, None] >> _SH_2) & 3  # [.., 2, q, i]
    return v.reshape(w.shape[:-1] + (32,)).astype(np.uint8)


def _h2f(bits: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(bits).view(np.float16).astype(np.float32)


def get_rows(qtype: int, arrays: tuple, rows: np.ndarray, out: np.ndarray) -> None:
    """out[r] = W[rows[r]] as float32, bit-exact with gguf.quants.dequantize."""
    if rows.size == 0:
        return
    q = Q(int(qtype))
    f = _row_fields(QUANT_TYPES[q].i8, arrays, rows)
    f32 = np.float32
    R, K = out.shape
    if q == Q.Q8_0:
        v = (f["qs"].reshape(R, -1, 32) ^ np.uint8(0x80)).view(np.int8).astype(f32)
        y = v * _h2f(f["d"])[..., None]
    elif q == Q.IQ1_S:  # ggml: d * (2 s + 1) * (grid[j] ± IQ1S_DELTA)
        qh = f["qh"].astype(np.int64)
        gi = f["gi"].astype(np.int64) | (((qh[..., None] >> (3 * np.arange(4))) & 7) << 8)
        dl = np.repeat(_h2f(f["d"]), SB, axis=1) * (2 * ((qh >> 12) & 7) + 1).astype(f32)
        delta = np.where((qh & 0x8000) != 0, f32(-IQ1S_DELTA), f32(IQ1S_DELTA))
        y = dl[..., None] * (GRID_IQ1S[gi].reshape(R, -1, 32).astype(f32) + delta[..., None])
    elif q == Q.IQ1_M:  # ggml: d * (2 s + 1) per 16 * (grid[j] ± IQ1M_DELTA per 8)
        qh = f["qh"].astype(np.int64)  # [R, nb, 2]
        h = np.stack([qh, qh >> 4], axis=-1).reshape(R, -1, 4)  # group l ← nibble l % 2 of byte l // 2
        gi = f["gi"].astype(np.int64) | ((h & 7) << 8)
        sc = f["sc"].astype(np.int64)
        s16 = np.stack([sc & 7, sc >> 3], axis=-1)  # [R, nb, 2]
        dl = np.repeat(_h2f(f["d"]), SB, axis=1)[..., None] * (2 * s16 + 1).astype(f32)  # [R, nb, 2]
        delta = np.where((h & 8) != 0, f32(-IQ1S_DELTA), f32(IQ1S_DELTA)).reshape(R, -1, 2, 2)
        g = GRID_IQ1S[gi].reshape(R, -1, 2, 2, 8).astype(f32)
        y = dl[..., None, None] * (g + delta[..., None])
    elif q in _GRIDS:
        grid, _ = _GRIDS[q]
        gi = f["gi"].astype(np.int64)
        if "gh" in f:
            w = 2 if q == Q.IQ2_S else 1
            gi |= ((f["gh"][..., None].astype(np.int64) >> (w * np.arange(gi.shape[-1]))) & (2**w - 1)) << 8
        mag = grid[gi].reshape(R, -1, 32).astype(f32)  # [R, nb, 32]
        sign = np.where(_unword1(f["sg"]) == 1, f32(-1), f32(1))
        d = np.repeat(_h2f(f["d"]), SB, axis=1)[..., None]  # [R, nb, 1]
        sc = f["sc"]
        if q == Q.IQ3_S:
            db = d * sc.astype(f32)[..., None]
        elif q in (Q.IQ2_XS, Q.IQ2_S):  # ggml's d * (0.5 + s) * 0.25 per 16 elements
            s2 = np.stack([sc & 15, sc >> 4], axis=-1).astype(f32)[..., None]  # [R, nb, 2, 1]
            db = np.repeat(d[..., None] * (f32(0.5) + s2) * f32(0.25), 16, axis=-1).reshape(R, -1, 32)
        else:  # d * (0.5 + s) * 0.25 (IQ2_XXS) or * 0.5 (IQ3_XXS), s = (sc − 1) / 2
            s1 = ((sc.astype(f32) - f32(1)) * f32(0.5))[..., None]
            db = d * (f32(0.5) + s1) * (f32(0.5) if q == Q.IQ3_XXS else f32(0.25))
        y = db * mag * sign
    elif q in (Q.IQ4_NL, Q.IQ4_XS, Q.MXFP4):
        v = (KVALUES_MXFP4 if q == Q.MXFP4 else KVALUES_IQ4NL)[_unquad4(f["qs"])].astype(f32)
        if q == Q.IQ4_NL:
            d = _h2f(f["d"])
        elif q == Q.IQ4_XS:
            d = np.repeat(_h2f(f["d"]), SB, axis=1) * f["ls"].astype(f32)
        else:
            d = e8m0_half(f["e"])
        y = d[..., None] * v
    elif q in (Q.Q6_K, Q.Q2_K, Q.Q3_K):
        if q == Q.Q6_K:
            u = (_unquad4(f["qs"]) | (_unwords2(f["qh"]) << 4)).astype(np.int32) - 32
            sc, mn = f["sc"].astype(f32), None
        elif q == Q.Q2_K:
            u = _unwords2(f["q2"]).astype(np.int32)
            sc, mn = (f["sm"] & 15).astype(f32), (f["sm"] >> 4).astype(f32)
        else:
            u = (_unwords2(f["q2"]) | (_unword1(f["qh"]) << 2)).astype(np.int32) - 4
            sc, mn = f["sc"].astype(f32), None
        d = np.repeat(_h2f(f["d"]), SB, axis=1)[..., None]  # [R, nb, 1]
        y = (d * sc)[..., None] * u.reshape(R, -1, 2, 16).astype(f32)
        if mn is not None:
            y = y - (np.repeat(_h2f(f["dmin"]), SB, axis=1)[..., None] * mn)[..., None]
    else:
        u = _unquad4(f["qs"]).astype(np.int32)
        if "qh" in f:
            u = u | (_unword1(f["qh"]).astype(np.int32) << 4)
        if q in (Q.Q4_K, Q.Q5_K):
            d = np.repeat(_h2f(f["d"]), SB, axis=1)
            dm = np.repeat(_h2f(f["dmin"]), SB, axis=1)
            sm = f["sm"].astype(f32)
            y = (d * sm[..., 0])[..., None] * u.astype(f32) - (dm * sm[..., 1])[..., None]
        elif q in (Q.Q4_1, Q.Q5_1):
            y = _h2f(f["d"])[..., None] * u.astype(f32) + _h2f(f["m"])[..., None]
        else:
            y = _h2f(f["d"])[..., None] * (u - (8 if q == Q.Q4_0 else 16)).astype(f32)
    out[...] = y.reshape(R, -1)[:, :K]
