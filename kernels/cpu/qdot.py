"""The int8-activation path ("i8" numerics): integer dot products for every quant type it covers, one kernel per
type, batch-invariant.

Activations. Each row is quantised with one scale per 32 elements for the 32-element-block weight types and
per 256 for the super-block types (ggml's Q8_0 and Q8_K: d = max|x| / 127, q = rint(x * (1 / d)) in float32),
with each 32-block's Σq and the sums of its two halves (the 16-element sub-blocks of Q2_K, Q3_K, Q6_K).

Weights ("quad tiles"). Features in tiles of NT = 64, each tile in 4 groups of GL = 16 (a vector's lanes);
per 32-element block, the four bytes of consecutive k of one feature are adjacent, so one 64-byte load holds 16
features × 4 k: the operand of a 4-byte integer dot (`simd.dot4`: vpdpbusd on AVX-512 VNNI, vpmaddubsw +
vpmaddwd on AVX2). Every field is group-major ([tile, group, block, ..., lane]): a pass over one group's blocks
reads memory in order, which the hardware prefetchers stream at the memory's bandwidth (groups interleaved
within each block would make a pass read one cache line in four). Every type is repacked at load into nibble
quads (byte i of quad q: low nibble = element 4q + i, high nibble = element 16 + 4q + i) or 2-bit
quads, plus bit planes for the bits above (one 32-bit word per feature and block, laid out so that a shift and
a mask give the bits of one quad), integer sub-block scales as bytes, and the f16 scales of the block or
super-block; the grid types keep their grid indices, sign bits and scales (kernels below). The packed bytes per
weight stay those of the GGUF type within 3 % (Q3_K, IQ3_S, IQ1_M +3.6 %; IQ3_XXS +8 %, IQ2_XS +11 %, IQ2_XXS +12 %).

Arithmetic per output feature n of row t (x̂ the row's quantised block, dx its scale, s = Σx̂, s_A and s_B the
sums of its halves, a = Σ u·x̂ over the block's unsigned quants u, a_A, a_B over each half). The 32-element
types, per block b:
  Q4_0: y = fma(a − 8s, d·dx, y)             Q5_0: y = fma(a − 16s, d·dx, y)
  Q4_1, Q5_1: y = fma(a, d·dx, y); y = fma(m, dx·s, y)
  Q8_0: y = fma(Σ q·x̂, d·dx, y)
  IQ4_NL: y = fma(Σ v·x̂, d·dx, y)   MXFP4: y = fma(Σ v·x̂, 2^(e−128)·dx, y)
The super-block types sum integers i (and min terms m) over the 8 blocks of a super-block, then per super-block
(D, M its f16 scale and min scale, dx the super-block's activation scale): y = fma(Σ i, D·dx·c, y), and
y = fma(−Σ m, M·dx, y) for Q4_K, Q5_K, Q2_K; per block:
  Q4_K, Q5_K: i = sc·a, m = mn·s     Q2_K: i = sc_A·a_A + sc_B·a_B, m = mn_A·s_A + mn_B·s_B
  Q6_K: i = sc_A·(a_A − 32 s_A) + sc_B·(a_B − 32 s_B)      Q3_K: i = sc_A·(a_A − 4 s_A) + sc_B·(a_B − 4 s_B)
  IQ4_XS: i = (ls − 32)·Σ v·x̂   (v: the signed level a nibble indexes, looked up 64 bytes at a time with vpshufb)
  IQ2_XXS, IQ3_XXS, IQ3_S: i = sc·(a_A + a_B)   IQ2_XS, IQ2_S: i = sc_A·a_A + sc_B·a_B
  (a: Σ |g|·(±x̂), the grid's magnitudes g read by index, the sign bits applied to x̂; sc = 2s + 1 and c = 1/8
  for ggml's (0.5 + s)·0.25, 1/4 for IQ3_XXS's (0.5 + s)·0.5; IQ3_S: sc = 1 + 2s, c = 1; a single row of
  IQ2_XXS or IQ3_XXS sums each feature's block with its elements in lanes, where a row's grid entries load
  into place instead of being gathered lane by lane for 16 features: the same integers, 1.2–1.6× faster)
  IQ1_S: i = sc·(8 Σ g·x̂ + σ s), c = 1/8   (g ∈ {−1, 0, 1}, ggml's delta ±1/8 = σ/8)
  IQ1_M: i = Σ_halves sc_h·(8 Σ g·x̂ + Σ_l σ_l s_l), c = 1/8   (σ_l, s_l per group of 8)
(integer sums exact in int32, each converted to f32 once; each product of f32 scales rounded once). The float
chain is fixed per (row, feature), whichever path computes it and however many rows or threads there are:
every output row is bitwise the same alone, in a window, in a batch or in a prefill chunk (Thinking Machines,
"Defeating Nondeterminism in LLM Inference", 2025: a fixed reduction order per output element).
Twin: kernels/ref_quant.py `quantize_act_q8`, `matmul_ref(act=...)`.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as Q
from numba import carray, njit

from ..blocks import (
    BLOCK,
    GRID_IQ1S,
    GRID_IQ2S,
    GRID_IQ2XS,
    GRID_IQ2XXS,
    GRID_IQ3S,
    GRID_IQ3XXS,
    IQ1S_DELTA,
    KSIGNS_IQ2XS,
    KVALUES_IQ4NL,
    KVALUES_MXFP4,
    act_block,
    e8m0_half,
    iq1m_d,
    k_scale_min,
    q3k_scales,
)
from .drivers import NT
from .intrinsics import _pf32, _pi32
from .simd import (
    AVX2,
    VNNI512,
    abs_f,
    add_i,
    bc_i32,
    bits_i,
    cvt,
    dot4ss,
    dot8,
    dot32s,
    dpbusd,
    e8m0_f,
    fma_f,
    gather_u32,
    grid_rows2,
    hi4,
    hmax_f,
    hsum2,
    hsum_i,
    inline_here,
    lane,
    ld_f32,
    ld_h2f,
    ld_i32,
    ld_s8,
    ld_u8,
    ld_u16,
    lo4,
    lookup16,
    max_f,
    mul_f,
    mul_i,
    neg_bytes,
    neg_i,
    or_i,
    rint_i,
    splat_f,
    splat_i,
    st_f32,
    st_i8,
    st_i32,
    sub_i,
    xor80,
    zero_f,
    zero_i,
)

QB = 32  # activation block (elements)
GL = 16  # features per group: the lanes of one vector
NJ = NT // GL  # groups per tile
SB = 8  # activation blocks per K-quant super-block (256 elements)
ACT_EXTRA = 20  # bytes per row and block besides the quants: scale, Σq, scale·Σq, the two half sums
# kernel kinds
Q4_0, Q4_1, Q8_0, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, Q2_K, Q3_K, IQ4_NL, IQ4_XS, MXFP4 = range(13)
IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M = range(13, 20)  # grid types: values read from a table by index


# ---------------------------------------------------------------------------------------------------------
# the table: one record per type (kernel kind, packed fields); field shapes by role, each after [nt tiles, NJ
# groups] (nb blocks, GL lanes):
#   q4: nibble quads [nb, 4, GL, 4] u8      q8: byte quads [nb, 8, GL, 4] u8 (q + 128)
#   w:  bit-plane word [nb, GL] u32         w2: two words (block halves) [nb, 2, GL] u32
#   b2: two bytes [nb, 2, GL]   b: a byte [nb, GL]   h: f16 per block [nb, GL]
#   hs: f16 per 256 [nb/8, GL]   g4, g8: grid indices' low bytes per 8 or per 4 elements [nb, 4 | 8, GL]
#   (the grid types: IQ2_XS's 9th index bit, IQ2_S's 9th and 10th, IQ3_S's 9th in a byte `gh` per block; the
#   signs, one bit per element, in a bit-plane word; IQ2_XS/IQ2_S's two 4-bit scales s in one byte, else 2s + 1)
class I8Type:
    __slots__ = ("qtype", "kind", "fields")

    def __init__(self, qtype, kind: int, fields: tuple):
        self.qtype, self.kind, self.fields = int(qtype), kind, fields


_U8, _I8, _U16, _U32 = np.uint8, np.int8, np.uint16, np.uint32
I8_TYPES = {t.qtype: t for t in (
    I8Type(Q.Q4_0, Q4_0, (("qs", "q4", _U8), ("d", "h", _U16))),
    I8Type(Q.Q4_1, Q4_1, (("qs", "q4", _U8), ("d", "h", _U16), ("m", "h", _U16))),
    I8Type(Q.Q8_0, Q8_0, (("qs", "q8", _U8), ("d", "h", _U16))),
    I8Type(Q.Q5_0, Q5_0, (("qs", "q4", _U8), ("qh", "w", _U32), ("d", "h", _U16))),
    I8Type(Q.Q5_1, Q5_1, (("qs", "q4", _U8), ("qh", "w", _U32), ("d", "h", _U16), ("m", "h", _U16))),
    I8Type(Q.Q4_K, Q4_K, (("qs", "q4", _U8), ("sm", "b2", _U8), ("d", "hs", _U16), ("dmin", "hs", _U16))),
    I8Type(Q.Q5_K, Q5_K, (("qs", "q4", _U8), ("qh", "w", _U32), ("sm", "b2", _U8), ("d", "hs", _U16),
                          ("dmin", "hs", _U16))),
    I8Type(Q.Q6_K, Q6_K, (("qs", "q4", _U8), ("qh", "w2", _U32), ("sc", "b2", _I8), ("d", "hs", _U16))),
    I8Type(Q.Q2_K, Q2_K, (("q2", "w2", _U32), ("sm", "b2", _U8), ("d", "hs", _U16), ("dmin", "hs", _U16))),
    I8Type(Q.Q3_K, Q3_K, (("q2", "w2", _U32), ("qh", "w", _U32), ("sc", "b2", _I8), ("d", "hs", _U16))),
    I8Type(Q.IQ4_NL, IQ4_NL, (("qs", "q4", _U8), ("d", "h", _U16))),
    I8Type(Q.IQ4_XS, IQ4_XS, (("qs", "q4", _U8), ("ls", "b", _I8), ("d", "hs", _U16))),
    I8Type(Q.MXFP4, MXFP4, (("qs", "q4", _U8), ("e", "b", _U8))),
    I8Type(Q.IQ2_XXS, IQ2_XXS, (("gi", "g4", _U8), ("sg", "w", _U32), ("sc", "b", _U8), ("d", "hs", _U16))),
    I8Type(Q.IQ2_XS, IQ2_XS, (("gi", "g4", _U8), ("sg", "w", _U32), ("sc", "b", _U8), ("d", "hs", _U16),
                              ("gh", "b", _U8))),
    I8Type(Q.IQ2_S, IQ2_S, (("gi", "g4", _U8), ("sg", "w", _U32), ("sc", "b", _U8), ("d", "hs", _U16),
                            ("gh", "b", _U8))),
    I8Type(Q.IQ3_XXS, IQ3_XXS, (("gi", "g8", _U8), ("sg", "w", _U32), ("sc", "b", _U8), ("d", "hs", _U16))),
    I8Type(Q.IQ3_S, IQ3_S, (("gi", "g8", _U8), ("sg", "w", _U32), ("sc", "b", _U8), ("d", "hs", _U16),
                            ("gh", "b", _U8))),
    I8Type(Q.IQ1_S, IQ1_S, (("gi", "g4", _U8), ("qh", "h", _U16), ("d", "hs", _U16))),  # qh: the GGUF's u16
    # IQ1_M: qh the GGUF's two bytes (per 8: 3 index bits, the delta's sign), sc the two 3-bit scales in a byte
    I8Type(Q.IQ1_M, IQ1_M, (("gi", "g4", _U8), ("qh", "b2", _U8), ("sc", "b", _U8), ("d", "hs", _U16))),
)}
# grid types: the table of magnitudes (bytes per entry), the float factor of the integer scale before d
_GRIDS = {Q.IQ2_XXS: (GRID_IQ2XXS, 0.125), Q.IQ2_XS: (GRID_IQ2XS, 0.125), Q.IQ2_S: (GRID_IQ2S, 0.125),
          Q.IQ3_XXS: (GRID_IQ3XXS, 0.25), Q.IQ3_S: (GRID_IQ3S, 1.0)}


def _shape(role: str, nt: int, nb: int) -> tuple:
    rest = {"q4": (nb, 4, GL, 4), "q8": (nb, 8, GL, 4), "w": (nb, GL), "w2": (nb, 2, GL), "b2": (nb, 2, GL),
            "b": (nb, GL), "h": (nb, GL), "hs": (nb // SB, GL), "g4": (nb, 4, GL), "g8": (nb, 8, GL)}[role]
    return (nt, NJ) + rest


def layout(qtype: int, n_rows: int, n_cols: int) -> tuple:
    """(dtype, shape) of each packed array."""
    nt, nb = -(-int(n_rows) // NT), -(-int(n_cols) // QB)
    return tuple((np.dtype(dt), _shape(role, nt, nb)) for _, role, dt in I8_TYPES[int(qtype)].fields)


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


def pack(qtype: int, blk: np.ndarray, n_rows: int) -> tuple:
    """Packed arrays from the raw blocks [N, nb, block bytes] of a matrix, written chunk by chunk."""
    q = int(qtype)
    rec = I8_TYPES[q]
    N = int(n_rows)
    nbn = blk.shape[1]
    K = nbn * BLOCK[Q(q)][0]
    outs = [np.zeros(shape, dt) for dt, shape in layout(q, N, K)]
    for r0 in range(0, N, _CHUNK):
        b = blk[r0 : r0 + _CHUNK]
        if q == Q.Q8_0:  # the GGUF bytes as they are, q + 128 (vpdpbusd multiplies an unsigned byte)
            f = {"qs": b[..., 2:34].reshape(b.shape[0], nbn, 8, 4) ^ np.uint8(0x80), "d": _f16bits(b[..., 0:2])}
        else:
            f = _encode(q, _planes(q, b))
        for (name, role, _), dst in zip(rec.fields, outs, strict=True):
            _tile_into(dst, f[name], r0 // NT, role)
    return tuple(outs)


# ---------------------------------------------------------------------------------------------------------
# get_rows: the packed fields back to ggml's dequantize_row_* values, bit for bit (float32, ggml's order)
def _row_fields(rec: I8Type, arrays: tuple, rows: np.ndarray) -> dict:
    g, j, n = rows // NT, rows % NT // GL, rows % GL
    out = {}
    for (name, role, _), a in zip(rec.fields, arrays, strict=True):
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


def get_rows(kind: int, qtype: int, arrays: tuple, rows: np.ndarray, out: np.ndarray) -> None:
    """out[r] = W[rows[r]] as float32, bit-exact with gguf.quants.dequantize."""
    if rows.size == 0:
        return
    q = Q(int(qtype))
    f = _row_fields(I8_TYPES[int(q)], arrays, rows)
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


# ---------------------------------------------------------------------------------------------------------
# activations: [T, K] float32 → one buffer holding q [T, Kp] i8, scale [T, nb] f32, Σq [T, nb] i32,
# scale·Σq [T, nb] f32 and the half sums [T, nb, 2] i32 (Kp = nb · 32, zero padded)
def act_bytes(T: int, n_cols: int) -> int:
    nb = -(-n_cols // QB)
    return T * nb * (QB + ACT_EXTRA)


def act_group(qtype: int) -> int:
    """Activation blocks of 32 that share one scale for a weight type: 8 for the 256-element super-block types
    (ggml's Q8_K activations), else 1 (Q8_0's)."""
    return act_block(qtype) // QB


@njit(cache=True)
def quantize_acts(x, buf, sg):
    """Quantise the rows of x [T, K] into buf (layout above), one scale per `sg` blocks of 32 (1 or 8, K a
    multiple of 32·sg; every block of the group records the group's scale); the twin is ref.quantize_act_q8.
    Whole blocks of 32 in two 16-lane vectors where the row is stride-1 and K a multiple of 32, else element by
    element."""
    T, K = x.shape
    nb = -(-K // QB)
    Kp = nb * QB
    xq = buf[: T * Kp].view(np.int8).reshape(T, Kp)
    o = T * Kp
    xd = buf[o : o + 4 * T * nb].view(np.float32).reshape(T, nb)
    sx = buf[o + 4 * T * nb : o + 8 * T * nb].view(np.int32).reshape(T, nb)
    xs = buf[o + 8 * T * nb : o + 12 * T * nb].view(np.float32).reshape(T, nb)
    sh = buf[o + 12 * T * nb : o + 20 * T * nb].view(np.int32).reshape(T, nb, 2)
    vec = K % QB == 0 and x.strides[1] == 4
    pq = buf.ctypes.data
    for t in range(T):
        px0 = x.ctypes.data + t * x.strides[0]
        for b0 in range(0, nb, sg):
            b1 = min(b0 + sg, nb)
            amax = np.float32(0.0)
            for b in range(b0, b1):
                k0 = b * QB
                if vec:
                    amax = max(amax, hmax_f(max_f(abs_f(ld_f32(px0 + 4 * k0)), abs_f(ld_f32(px0 + 4 * k0 + 64)))))
                else:
                    for k in range(k0, min(k0 + QB, K)):
                        amax = max(amax, abs(x[t, k]))
            d = amax / np.float32(127.0)
            inv = np.float32(1.0) / d if d > np.float32(0.0) else np.float32(0.0)
            for b in range(b0, b1):
                k0 = b * QB
                if vec:
                    q0 = rint_i(mul_f(ld_f32(px0 + 4 * k0), splat_f(inv)))
                    q1 = rint_i(mul_f(ld_f32(px0 + 4 * k0 + 64), splat_f(inv)))
                    st_i8(pq + t * Kp + k0, q0)
                    st_i8(pq + t * Kp + k0 + 16, q1)
                    s0 = hsum_i(q0)
                    s1 = hsum_i(q1)
                else:
                    s0 = 0
                    s1 = 0
                    for k in range(k0, k0 + QB):
                        v = np.int32(np.rint(x[t, k] * inv)) if k < K else np.int32(0)
                        xq[t, k] = v
                        if k < k0 + 16:
                            s0 += v
                        else:
                            s1 += v
                xd[t, b] = d
                sx[t, b] = s0 + s1
                xs[t, b] = d * np.float32(s0 + s1)
                sh[t, b, 0] = s0
                sh[t, b, 1] = s1


@njit(cache=True)
def quantize_groups(x, offs, buf, sg):
    """quantize_acts of each row group x[offs[g]:offs[g+1]] into its own region of buf, group after group (the
    region of group g starts at act_bytes(offs[g], K))."""
    K = x.shape[1]
    per_row = -(-K // QB) * (QB + ACT_EXTRA)
    for g in range(offs.shape[0] - 1):
        a, b = offs[g], offs[g + 1]
        quantize_acts(x[a:b], buf[a * per_row : b * per_row], sg)


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
    """acc + sc·Σ u·x̂ over a Q4_K block (its 6-bit scale sc from p1): _nibbles' products with the scale applied
    as the i16 sums widen (simd.dot32s), the same integer."""
    inline_here()
    oq = _unit(g, j, nb, b) * 4 * GL * 4
    w0 = ld_i32(p0 + oq)
    w1 = ld_i32(p0 + oq + GL * 4)
    w2 = ld_i32(p0 + oq + 2 * GL * 4)
    w3 = ld_i32(p0 + oq + 3 * GL * 4)
    return dot32s(acc, ld_u8(p1 + _b2off(g, nb, b, 0, j)),
                  lo4(w0), bc_i32(xa), hi4(w0), bc_i32(xa + 16), lo4(w1), bc_i32(xa + 4), hi4(w1), bc_i32(xa + 20),
                  lo4(w2), bc_i32(xa + 8), hi4(w2), bc_i32(xa + 24), lo4(w3), bc_i32(xa + 12), hi4(w3),
                  bc_i32(xa + 28))


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
        return _q4k(p0, p1, g, nb, b, j, xa, acc), add_i(macc, mul_i(mn, splat_i(sx)))
    if kind == Q5_K:
        a = _nibbles(kind, p0, p1, g, nb, b, j, xa)
        sc = ld_u8(p2 + _b2off(g, nb, b, 0, j))
        mn = ld_u8(p2 + _b2off(g, nb, b, 1, j))
        return add_i(acc, mul_i(sc, a)), add_i(macc, mul_i(mn, splat_i(sx)))
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
        acc = add_i(acc, add_i(mul_i(bits_i(vA, 0, 15, 0), aA), mul_i(bits_i(vB, 0, 15, 0), aB)))
        return acc, add_i(macc, add_i(mul_i(bits_i(vA, 4, 15, 0), splat_i(sA)),
                                       mul_i(bits_i(vB, 4, 15, 0), splat_i(sB))))
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
    if kind >= IQ2_XXS:  # ggml's (0.5 + s)·c factors: 1/8 (IQ2_*, IQ1_*), 1/4 (IQ3_XXS), 1 (IQ3_S)
        f = 0.25 if kind == IQ3_XXS else (1.0 if kind == IQ3_S else 0.125)
        d = mul_f(d, splat_f(np.float32(f)))
    y = fma_f(cvt(acc), d, y)
    if kind == Q4_K or kind == Q2_K or kind == Q5_K:
        pm = p4 if kind == Q5_K else p3
        y = fma_f(cvt(neg_i(macc)), mul_f(ld_h2f(pm + _hsoff(g, nb, b, j)), dx), y)
    return y


@njit(cache=True, inline="always")
def _put(pout, out, t, N, n0, y):
    """out[t, n0:n0 + GL] = y, clipped at N."""
    if n0 + GL <= N:
        st_f32(pout + 4 * (t * N + n0), y)
    elif n0 < N:
        for i in range(N - n0):
            out[t, n0 + i] = lane(y, i)


def _entry(kind: int, name: str):
    """Tiles g0..g1 of out [T, N], 16 features at a time: rows two at a time (one weight load and decode for
    both), then a last one alone, the blocks in memory order. Two accumulators a pass fit AVX2's registers,
    and three inlined block bodies keep the compile short.
    The C entry point of one kind (signature intrinsics._KSIG: p0..p5, nt, nb, the activation buffer, T, Kp,
    g0, g1, out, N), `kind` a closure constant. A kernel calling an inlined driver compiled several times
    slower: Numba copies an inlined body block by block, each copy with the whole scope (quadratic)."""

    # Python constants: Numba drops the branches of the other kinds before typing them
    sup = Q4_K <= kind <= Q3_K or kind == IQ4_XS or kind >= IQ2_XXS  # 256-element super-blocks (ggml's Q8_K)
    grid = IQ2_XXS <= kind <= IQ3_S  # grid types, whose magnitudes a tile of 3+ rows decodes once
    t1 = kind == IQ2_XXS or kind == IQ3_XXS  # grid types whose single row takes _grid_t1

    def kernel(p0, p1, p2, p3, p4, p5, nt, nb, pxp, T, Kp, g0, g1, pout, N):
        o = pxp + T * Kp
        xd = carray(_pf32(o), (T, nb))
        sx = carray(_pi32(o + 4 * T * nb), (T, nb))
        xs = carray(_pf32(o + 8 * T * nb), (T, nb))
        sh = carray(_pi32(o + 12 * T * nb), (T, nb, 2))
        out = carray(_pf32(pout), (T, N))
        if sup:
            dec = grid and T >= GRID_TILE_ROWS
            # the grid types' magnitudes decoded once per group of 16 features for all rows (the gathers are most
            # of a grid block's cost)
            scratch = np.empty(nb * _DEC if dec else 0, np.uint8)
            pd = scratch.ctypes.data
            rows_t1 = t1 and T == 1
            rs = np.empty(GL if rows_t1 else 0, np.int32)  # the 16 rows' integer sums of a super-block (_grid_t1)
            prs = rs.ctypes.data
            for g in range(g0, g1):
                for j in range(NJ):
                    n0 = g * NT + GL * j
                    if n0 >= N:
                        break
                    if grid and dec:
                        _grid_decode(kind, p0, p4, g, nb, j, pd)
                        _super_rows(kind, p0, p1, p2, p3, p4, nb, pxp, T, Kp, g, j, n0, xd, sx, sh, pout, out, N,
                                    pd, True)
                    elif rows_t1:  # one row: elements in lanes, 16 rows one after another
                        _grid_t1(kind, p0, p1, p2, p3, p4, nb, pxp, g, j, n0, xd, pout, out, N, prs)
                    elif T > 1:
                        _super_rows(kind, p0, p1, p2, p3, p4, nb, pxp, T, Kp, g, j, n0, xd, sx, sh, pout, out, N,
                                    pd, False)
                    elif j % 2 == 0:  # one row: two groups of features a pass instead of two rows
                        k = j + 1 if n0 + GL < N else j
                        _super_groups(kind, p0, p1, p2, p3, p4, nb, pxp, g, j, k, n0, xd, sx, sh, pout, out, N)
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
                        y = _blk(kind, p0, p1, p2, p3, g, nb, b, j, xa, xd[t, b], sx[t, b], xs[t, b], y)
                        z = _blk(kind, p0, p1, p2, p3, g, nb, b, j, xa + Kp, xd[u, b], sx[u, b], xs[u, b], z)
                    _put(pout, out, t, N, n0, y)
                    _put(pout, out, u, N, n0, z)
                if T % 2 == 1:  # the last row alone
                    t = T - 1
                    y = zero_f()
                    for b in range(nb):
                        y = _blk(kind, p0, p1, p2, p3, g, nb, b, j, pxp + t * Kp + b * QB, xd[t, b], sx[t, b],
                                 xs[t, b], y)
                    _put(pout, out, t, N, n0, y)

    kernel.__name__ = kernel.__qualname__ = name
    return kernel


@njit(cache=True, inline="always")
def _super_rows(kind, p0, p1, p2, p3, p4, nb, pxp, T, Kp, g, j, n0, xd, sx, sh, pout, out, N, pd, dec):
    """Every row of group j of tile g for a super-block kind: per super-block, each row's integer sums over
    its 8 blocks, then one float step (_sfin); `dec`: the grid magnitudes come from pd (_grid_decode). Rows
    two at a time; an odd last row is paired with itself (one loop body: a lone-row loop compiled markedly
    slower). A single row (T = 1) takes _super_groups instead."""
    for t in range(0, T, 2):
        u = min(t + 1, T - 1)
        y = z = zero_f()
        for s in range(0, nb, SB):
            a1 = m1 = a2 = m2 = zero_i()
            for b in range(s, s + SB):
                xa = pxp + t * Kp + b * QB
                xu = pxp + u * Kp + b * QB
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


@njit(cache=True, inline="always")
def _grid_t1(kind, p0, p1, p2, p3, p4, nb, pxp, g, j, n0, xd, pout, out, N, prs):
    """Row 0 alone (T = 1) for group j of a grid type with its index bytes alone in p0 (IQ2_XXS, IQ3_XXS): each
    of the 16 features' blocks with its elements in lanes (grid_rows2: a row's entries load into place, where
    the features-in-lanes form gathers 16 rows' entries lane by lane), their integer sums gathered per
    super-block into the 16 lanes, then _sfin: the same integers and float steps, so bitwise _super_rows."""
    base = _grid(kind)
    ngr = 4 if kind == IQ2_XXS else 8
    y = zero_f()
    for s in range(0, nb, SB):
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


@njit(cache=True, inline="always")
def _super_groups(kind, p0, p1, p2, p3, p4, nb, pxp, g, j, k, n0, xd, sx, sh, pout, out, N):
    """Row 0 alone (T = 1, decode) for groups j and k of tile g: the row-pair body of _super_rows with the
    second accumulator on the next 16 features, so no pass computes a row twice. Each feature's chain is
    _super_rows' (same blocks, same order): bitwise the same outputs."""
    y = z = zero_f()
    for s in range(0, nb, SB):
        a1 = m1 = a2 = m2 = zero_i()
        for b in range(s, s + SB):
            xa = pxp + b * QB
            a1, m1 = _iblk(kind, p0, p1, p2, p3, p4, g, nb, b, j, xa, sx[0, b], sh[0, b, 0], sh[0, b, 1], a1, m1)
            a2, m2 = _iblk(kind, p0, p1, p2, p3, p4, g, nb, b, k, xa, sx[0, b], sh[0, b, 0], sh[0, b, 1], a2, m2)
        y = _sfin(kind, p1, p2, p3, p4, g, nb, s, j, a1, m1, xd[0, s], y)
        z = _sfin(kind, p1, p2, p3, p4, g, nb, s, k, a2, m2, xd[0, s], z)
    _put(pout, out, 0, N, n0, y)
    if k != j:
        _put(pout, out, 0, N, n0 + GL, z)


# the C entry points by kind, and by name (_k_q4_0, ...: each kind's symbols and cache files)
KERNELS = {t.kind: _entry(t.kind, "_k_" + Q(t.qtype).name.lower()) for t in I8_TYPES.values()}
globals().update({f.__name__: f for f in KERNELS.values()})
