"""Packing for the int8 path at load, compiled: a part of a matrix (rows of GGUF blocks) → its packed fields
(kernels/cpu/qdot/types.py roles), written in place into the preallocated arrays, one pass over the bytes.

Each kernel runs without the GIL (the repack cache's writer packs matrices on a thread pool) and counts the
blocks' f16 scales (kernels/quant_types.py F16_SCALES) whose exponent bits are all ones, as the load's finite
scan would, so a file is read once. Twin: pack.py `pack_numpy` (the same bytes; tests/kernels/test_qdot.py).
Types without a kernel here (the grid types, IQ1_S, IQ1_M) pack with the twin."""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as Q
from numba import njit

from ...quant_types import F16_SCALES, QUANT_TYPES
from ..drivers import NT
from .types import GL

_F16_EXP = 0x7C00


@njit(inline="always")
def _at(b, r, o):  # a byte as int64: uint8 with int64 arithmetic would widen to float64 in Numba
    return np.int64(b[r, o])


@njit(inline="always")
def _u16(b, r, o):
    return _at(b, r, o) | (_at(b, r, o + 1) << 8)


@njit(inline="always")
def _u32(b, r, o):
    return _u16(b, r, o) | (_u16(b, r, o + 2) << 16)


# The bit planes (pack.py _word1, _words2): element e = 4q + i of a 32-element block sits in byte i of a plane
# word, at bit q (+ 4 for e >= 16) of a 1-bit plane, bits 2q, 2q + 1 of a 2-bit one; so byte i of the u32 of
# source bytes 4q..4q+3 lands in byte i, and a plane is 4 to 8 shifts and masks of words, never a loop over bits.
@njit(inline="always")
def _plane1(b, r, o, s):
    """Bit s of the 32 bytes at o → a 1-bit plane word."""
    w = 0
    for q in range(4):
        w |= ((_u32(b, r, o + 4 * q) >> s) & 0x01010101) << q
        w |= ((_u32(b, r, o + 16 + 4 * q) >> s) & 0x01010101) << (q + 4)
    return w


@njit(inline="always")
def _plane2(b, r, o, s):
    """Bits s, s + 1 of the 16 bytes at o → a 2-bit plane word (one half of a block)."""
    w = 0
    for q in range(4):
        w |= ((_u32(b, r, o + 4 * q) >> s) & 0x03030303) << (2 * q)
    return w


@njit(inline="always")
def _bits1(h):
    """A u32 whose bit e is element e's (Q5_0, Q5_1) → a 1-bit plane word: each nibble's bits spread to bit 0 of
    four bytes by one multiply (no two shifted copies of a bit meet)."""
    w = 0
    for q in range(4):
        w |= ((((h >> (4 * q)) & 15) * 0x00204081) & 0x01010101) << q
        w |= ((((h >> (16 + 4 * q)) & 15) * 0x00204081) & 0x01010101) << (q + 4)
    return w


@njit(inline="always")
def _bad(b, r, o, chk):
    """How many of the block's f16 scales (at o + chk) are inf or NaN."""
    n = 0
    for c in chk:
        if _u16(b, r, o + c) & _F16_EXP == _F16_EXP:
            n += 1
    return n


@njit(nogil=True, cache=True)
def _pack_b32(b, r0, chk, at_qs, at_d, at_m, at_qh, at_e, qs, qh, d, m, e):
    """32-element blocks of 16 nibble bytes (Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4): the bytes are the quads as
    they are; a field at offset -1 is absent (its array a placeholder)."""
    n, rb = b.shape
    nb = qs.shape[2]
    bs = rb // nb
    bad = 0
    for rr in range(n):
        r = r0 + rr
        t, j, lane = r // NT, (r % NT) // GL, r % GL
        for k in range(nb):
            o = k * bs
            for q in range(4):
                qs[t, j, k, q, lane] = _u32(b, rr, o + at_qs + 4 * q)
            if at_d >= 0:
                d[t, j, k, lane] = _u16(b, rr, o + at_d)
            if at_m >= 0:
                m[t, j, k, lane] = _u16(b, rr, o + at_m)
            if at_e >= 0:
                e[t, j, k, lane] = _at(b, rr, o + at_e)
            if at_qh >= 0:
                qh[t, j, k, lane] = _bits1(_u32(b, rr, o + at_qh))
            bad += _bad(b, rr, o, chk)
    return bad


@njit(nogil=True, cache=True)
def _pack_q8_0(b, r0, chk, qs, d):
    n, rb = b.shape
    nb = qs.shape[2]
    bs = rb // nb
    bad = 0
    for rr in range(n):
        r = r0 + rr
        t, j, lane = r // NT, (r % NT) // GL, r % GL
        for k in range(nb):
            o = k * bs
            for q in range(8):  # q + 128: vpdpbusd multiplies an unsigned byte
                qs[t, j, k, q, lane] = _u32(b, rr, o + 2 + 4 * q) ^ 0x80808080
            d[t, j, k, lane] = _u16(b, rr, o)
            bad += _bad(b, rr, o, chk)
    return bad


@njit(nogil=True, cache=True)
def _pack_q45k(b, r0, chk, five, qs, qh, sm, d, dmin):
    """Q4_K, Q5_K (five): chunk c's low nibbles are sub-block 2c, its high nibbles 2c + 1; bit s of qh[e] is
    element e's fifth bit in sub-block s; the 6-bit scales and mins as get_scale_min_k4 unpacks them."""
    n, rb = b.shape
    nsb = d.shape[2]
    bs = rb // nsb
    at = 48 if five else 16
    bad = 0
    for rr in range(n):
        r = r0 + rr
        t, j, lane = r // NT, (r % NT) // GL, r % GL
        for sb in range(nsb):
            o = sb * bs
            d[t, j, sb, lane] = _u16(b, rr, o)
            dmin[t, j, sb, lane] = _u16(b, rr, o + 2)
            for s in range(4):
                sm[t, j, 8 * sb + s, 0, lane] = _at(b, rr, o + 4 + s) & 63
                sm[t, j, 8 * sb + s, 1, lane] = _at(b, rr, o + 8 + s) & 63
                sm[t, j, 8 * sb + 4 + s, 0, lane] = (_at(b, rr, o + 12 + s) & 15) | ((_at(b, rr, o + 4 + s) >> 6) << 4)
                sm[t, j, 8 * sb + 4 + s, 1, lane] = (_at(b, rr, o + 12 + s) >> 4) | ((_at(b, rr, o + 8 + s) >> 6) << 4)
            for c in range(4):
                for q in range(4):
                    lo, hi = _u32(b, rr, o + at + 32 * c + 4 * q), _u32(b, rr, o + at + 32 * c + 16 + 4 * q)
                    qs[t, j, 8 * sb + 2 * c, q, lane] = (lo & 0x0F0F0F0F) | ((hi & 0x0F0F0F0F) << 4)
                    qs[t, j, 8 * sb + 2 * c + 1, q, lane] = ((lo >> 4) & 0x0F0F0F0F) | (hi & 0xF0F0F0F0)
            if five:
                for s in range(8):
                    qh[t, j, 8 * sb + s, lane] = _plane1(b, rr, o + 16, s)
            bad += _bad(b, rr, o, chk)
    return bad


@njit(nogil=True, cache=True)
def _pack_q6k(b, r0, chk, qs, qh, sc, d):
    """Q6_K: sub-block s = 4h + k takes nibble k // 2 of ql[64 h + 32 (k % 2) + e] and bits 2k..2k+1 of
    qh[32 h + e]; its two int8 scales are bytes 2s, 2s + 1 of the scales."""
    n, rb = b.shape
    nsb = d.shape[2]
    bs = rb // nsb
    bad = 0
    for rr in range(n):
        r = r0 + rr
        t, j, lane = r // NT, (r % NT) // GL, r % GL
        for sb in range(nsb):
            o = sb * bs
            for s in range(8):
                h, k = s >> 2, s & 3
                lo_at, sh = o + 64 * h + 32 * (k & 1), 4 * (k >> 1)
                for q in range(4):
                    lo, hi = _u32(b, rr, lo_at + 4 * q) >> sh, _u32(b, rr, lo_at + 16 + 4 * q) >> sh
                    qs[t, j, 8 * sb + s, q, lane] = (lo & 0x0F0F0F0F) | ((hi & 0x0F0F0F0F) << 4)
                for half in range(2):
                    qh[t, j, 8 * sb + s, half, lane] = _plane2(b, rr, o + 128 + 32 * h + 16 * half, 2 * k)
                sc[t, j, 8 * sb + s, 0, lane] = _at(b, rr, o + 192 + 2 * s)
                sc[t, j, 8 * sb + s, 1, lane] = _at(b, rr, o + 193 + 2 * s)
            d[t, j, sb, lane] = _u16(b, rr, o + 208)
            bad += _bad(b, rr, o, chk)
    return bad


@njit(nogil=True, cache=True)
def _pack_q23k(b, r0, chk, three, q2, qh, sm, d, dmin):
    """Q2_K, Q3_K (three): sub-block s = 4h + k takes bits 2k..2k+1 of qs[32 h + e]. Q2_K's scale/min bytes
    2s, 2s + 1 as they are; Q3_K's high bit s of hm[e] and its 6-bit scales as dequantize_row_q3_K unpacks them."""
    n, rb = b.shape
    nsb = d.shape[2]
    bs = rb // nsb
    at = 32 if three else 16
    bad = 0
    for rr in range(n):
        r = r0 + rr
        t, j, lane = r // NT, (r % NT) // GL, r % GL
        for sb in range(nsb):
            o = sb * bs
            for s in range(8):
                h, k = s >> 2, s & 3
                for half in range(2):
                    q2[t, j, 8 * sb + s, half, lane] = _plane2(b, rr, o + at + 32 * h + 16 * half, 2 * k)
                if three:
                    qh[t, j, 8 * sb + s, lane] = _plane1(b, rr, o, s)
            if three:
                for c in range(16):
                    lo = (_at(b, rr, o + 96 + c) & 15) if c < 8 else (_at(b, rr, o + 88 + c) >> 4)
                    hi = (_at(b, rr, o + 104 + c % 4) >> (2 * (c // 4))) & 3
                    sm[t, j, 8 * sb + c // 2, c % 2, lane] = (lo | (hi << 4)) - 32
                d[t, j, sb, lane] = _u16(b, rr, o + 108)
            else:
                for c in range(16):
                    sm[t, j, 8 * sb + c // 2, c % 2, lane] = _at(b, rr, o + c)
                d[t, j, sb, lane] = _u16(b, rr, o + 80)
                dmin[t, j, sb, lane] = _u16(b, rr, o + 82)
            bad += _bad(b, rr, o, chk)
    return bad


@njit(nogil=True, cache=True)
def _pack_iq4xs(b, r0, chk, qs, ls, d):
    """IQ4_XS: sub-block s's 16 nibble bytes as they are; its scale: nibble s % 2 of scales_l[s // 2] and bits
    2s..2s+1 of scales_h, less 32."""
    n, rb = b.shape
    nsb = d.shape[2]
    bs = rb // nsb
    bad = 0
    for rr in range(n):
        r = r0 + rr
        t, j, lane = r // NT, (r % NT) // GL, r % GL
        for sb in range(nsb):
            o = sb * bs
            d[t, j, sb, lane] = _u16(b, rr, o)
            hs = _u16(b, rr, o + 2)
            for s in range(8):
                for q in range(4):
                    qs[t, j, 8 * sb + s, q, lane] = _u32(b, rr, o + 8 + 16 * s + 4 * q)
                lo = (_at(b, rr, o + 4 + s // 2) >> (4 * (s % 2))) & 15
                ls[t, j, 8 * sb + s, lane] = (lo | (((hs >> (2 * s)) & 3) << 4)) - 32
            bad += _bad(b, rr, o, chk)
    return bad


# 32-element types of nibble bytes: (quants, d, m, qh, e) byte offsets in a block, -1 where absent
_B32 = {Q.Q4_0: (2, 0, -1, -1, -1), Q.Q4_1: (4, 0, 2, -1, -1), Q.Q5_0: (6, 0, -1, 2, -1),
        Q.Q5_1: (8, 0, 2, 4, -1), Q.IQ4_NL: (2, 0, -1, -1, -1), Q.MXFP4: (1, -1, -1, -1, 0)}
KINDS = frozenset(_B32) | {Q.Q8_0, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.Q2_K, Q.Q3_K, Q.IQ4_XS}
_CHK = {q: np.array(F16_SCALES[q], np.int64) for q in KINDS}
_NONE = {np.dtype(t): np.zeros((1, 1, 1, 1), t) for t in (np.uint8, np.uint16, np.uint32)}  # absent fields


def _quads(a: np.ndarray) -> np.ndarray:
    """A q4/q8 field [.., GL, 4] u8 as u32 [.., GL]: a quad's 4 bytes written at once (little-endian)."""
    return a.view(np.uint32).reshape(a.shape[:-1])


def pack_into(qtype: int, outs: tuple, b: np.ndarray, r0: int) -> int:
    """Rows r0.. of a matrix from its GGUF bytes b [rows, row bytes] into `outs` (qdot.layout's arrays, zeroed:
    the padding rows stay zero). Returns how many of the rows' f16 block scales are inf or NaN."""
    q = Q(int(qtype))
    f = dict(zip((name for name, _, _ in QUANT_TYPES[q].i8), outs, strict=True))
    f["qs"] = _quads(f["qs"]) if "qs" in f else None
    chk = _CHK[q]
    if q in _B32:
        at_qs, at_d, at_m, at_qh, at_e = _B32[q]
        u8, u16, u32 = _NONE[np.dtype(np.uint8)], _NONE[np.dtype(np.uint16)], _NONE[np.dtype(np.uint32)]
        return _pack_b32(b, r0, chk, at_qs, at_d, at_m, at_qh, at_e, f["qs"], f.get("qh", u32), f.get("d", u16),
                         f.get("m", u16), f.get("e", u8))
    if q == Q.Q8_0:
        return _pack_q8_0(b, r0, chk, f["qs"], f["d"])
    if q in (Q.Q4_K, Q.Q5_K):
        qh = f.get("qh", _NONE[np.dtype(np.uint32)])
        return _pack_q45k(b, r0, chk, q == Q.Q5_K, f["qs"], qh, f["sm"], f["d"], f["dmin"])
    if q == Q.Q6_K:
        return _pack_q6k(b, r0, chk, f["qs"], f["qh"], f["sc"], f["d"])
    if q in (Q.Q2_K, Q.Q3_K):
        three = q == Q.Q3_K
        qh = f["qh"] if three else _NONE[np.dtype(np.uint32)]
        sm, dmin = (f["sc"], f["d"]) if three else (f["sm"], f["dmin"])  # Q3_K: no min (dmin a stand-in)
        return _pack_q23k(b, r0, chk, three, f["q2"], qh, sm, f["d"], dmin)
    return _pack_iq4xs(b, r0, chk, f["qs"], f["ls"], f["d"])
