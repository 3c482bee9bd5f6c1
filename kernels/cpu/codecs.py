"""One codec per quant type, in one table (data): how `pack` lays a type's blocks out for the kernels and how
the kernels decode them. kernels/cpu/gen_quant.py turns each entry into its GEMV kernel and get_rows
(kernels/cpu/quant_gen.py, generated and committed); kernels/cpu/quant.py packs and dispatches by the table.

Packed layout ("feature tiles"): every field of a block becomes an array [tiles, blocks, *dims, NT]: the 64
features of a tile are innermost, so the kernels' inner loops run stride-1 over features. Fields keep ggml's
bits (a byte range of the block, viewed as `ctype`), or hold scales decoded once at load (a function).

Decoding. A block is `units` of `unit` elements (the T >= 3 path dequantises one unit into a scratch); a unit is
`steps` steps, and step j yields len(elems) weights, in that order: the canonical order of the fma chains.
`pos` gives each weight's natural offset in its unit (the activations are permuted to match). The strings are
Python/Numba expressions: {j} the step index, {i} a suffix for per-step names, `g, b, n` tile, block and
feature, `sd`/`sm` per-block scale scratch [16, NT] filled by `scales`. `exact` (get_rows) is the ggml
`dequantize_row_*` arithmetic where the kernels fuse it differently (an fma where ggml rounds twice).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType as Q

from ..blocks import BLOCK, iq4xs_scales, k_scale_min


@dataclass(frozen=True)
class Codec:
    qtype: Q
    fields: tuple  # (name, ctype, dims, source): source = (first byte, end byte) or a function of the blocks
    units: tuple  # (loop variable, count), or () for one unit per block
    steps: tuple  # (loop variable, count)
    pos: tuple  # natural offset in the unit of each weight of a step
    elems: tuple  # kernel decode of each weight of a step
    exact: tuple = ()  # get_rows decode, when it differs from elems
    per_n: tuple = ()  # lines in the feature loop before the step loads
    loads: tuple = ()  # lines per step in the feature loop
    per_step: tuple = ()  # lines per step outside the feature loop
    scales: tuple = ()  # (scratch, count, expr of scale c): per block, before the units
    t1: int = 2  # steps per iteration of the fused T = 1 loop
    t2: int = 2  # steps per iteration of the fused T = 2 loop
    fused: bool = True  # False: always dequantise a unit into the scratch (float types)
    padded: bool = False  # float types: K zero-padded to a multiple of 32, blocks of 32 elements
    direct: bool = False  # F32: the packed block is already the float32 unit, consumed in place

    @property
    def name(self) -> str:
        return self.qtype.name.lower()

    @property
    def block(self) -> int:
        return 32 if self.padded else BLOCK[self.qtype][0]

    @property
    def unit(self) -> int:
        return self.block // (self.units[1] if self.units else 1)


CTYPES = {"u8": np.uint8, "i8": np.int8, "u16": np.uint16, "u32": np.uint32, "f32": np.float32}


def _d(lo: int) -> tuple:
    """An f16 scale field at byte `lo`, kept as raw bits."""
    return ("u16", (), (lo, lo + 2))


def _ksc(blk):
    return k_scale_min(blk[..., 4:16])[0]


def _kmn(blk):
    return k_scale_min(blk[..., 4:16])[1]


def _iq4xs_sc(blk):
    return iq4xs_scales(np.ascontiguousarray(blk[..., 2:4]).view(np.uint16)[..., 0], blk[..., 4:8])


_NIB = ("{j}", "{j} + 16")  # byte j of a 32-element unit: low nibble → element j, high → j + 16
_K_SCALES = (
    ("sd", 8, "h2f(d[g, b, n]) * i2f(sc[g, b, c, n])"),
    ("sm", 8, "-(h2f(dmin[g, b, n]) * i2f(mn[g, b, c, n]))"),
)

CODECS = (
    Codec(
        Q.F32,
        (("w", "f32", (32,), (0, 128)),),
        (),
        ("u", 32),
        ("{j}",),
        ("w[g, b, {j}, n]",),
        fused=False,
        padded=True,
        direct=True,
    ),
    Codec(
        Q.F16,
        (("w", "u16", (32,), (0, 64)),),
        (),
        ("u", 32),
        ("{j}",),
        ("h2f(w[g, b, {j}, n])",),
        fused=False,
        padded=True,
    ),
    Codec(
        Q.BF16,
        (("w", "u16", (32,), (0, 64)),),
        (),
        ("u", 32),
        ("{j}",),
        ("bf2f(w[g, b, {j}, n])",),
        fused=False,
        padded=True,
    ),
    # block_q8_0 {d; qs[32]} (dequantize_row_q8_0)
    Codec(
        Q.Q8_0,
        (("qs", "i8", (32,), (2, 34)), ("d",) + _d(0)),
        (),
        ("u", 32),
        ("{j}",),
        ("i2f(qs[g, b, {j}, n]) * dd",),
        per_n=("dd = h2f(d[g, b, n])",),
        t1=8,
        t2=4,
    ),
    # block_q4_0 {d; qs[16]} (dequantize_row_q4_0)
    Codec(
        Q.Q4_0,
        (("qs", "u8", (16,), (2, 18)), ("d",) + _d(0)),
        (),
        ("j", 16),
        _NIB,
        ("dd * i2f((q{i} & 15) - 8)", "dd * i2f((q{i} >> 4) - 8)"),
        per_n=("dd = h2f(d[g, b, n])",),
        loads=("q{i} = qs[g, b, {j}, n]",),
        t1=4,
    ),
    # block_q4_1 {d; m; qs[16]} (dequantize_row_q4_1: x*d + m, rounded twice)
    Codec(
        Q.Q4_1,
        (("qs", "u8", (16,), (4, 20)), ("d",) + _d(0), ("m",) + _d(2)),
        (),
        ("j", 16),
        _NIB,
        ("fma32(i2f(q{i} & 15), dd, mm)", "fma32(i2f(q{i} >> 4), dd, mm)"),
        exact=("dd * i2f(q{i} & 15) + mm", "dd * i2f(q{i} >> 4) + mm"),
        per_n=("dd = h2f(d[g, b, n])", "mm = h2f(m[g, b, n])"),
        loads=("q{i} = qs[g, b, {j}, n]",),
        t1=4,
    ),
    # block_q5_0 {d; qh[4]; qs[16]} (dequantize_row_q5_0): bit j of qh → 5th bit of element j
    Codec(
        Q.Q5_0,
        (("qs", "u8", (16,), (6, 22)), ("qh", "u32", (), (2, 6)), ("d",) + _d(0)),
        (),
        ("j", 16),
        _NIB,
        ("dd * q5f(q{i}, 0, h, {j}, 1, 16)", "dd * q5f(q{i}, 4, h, {j} + 16, 1, 16)"),
        per_n=("dd = h2f(d[g, b, n])", "h = qh[g, b, n]"),
        loads=("q{i} = qs[g, b, {j}, n]",),
        t1=4,
    ),
    # block_q4_K {d; dmin; scales[12]; qs[128]} (dequantize_row_q4_K, get_scale_min_k4): unit = 64 elements,
    # byte j of pair i: low nibble → element 64i + j (sub-block 2i), high → 64i + 32 + j (sub-block 2i + 1)
    Codec(
        Q.Q4_K,
        (
            ("qs", "u8", (4, 32), (16, 144)),
            ("d",) + _d(0),
            ("dmin",) + _d(2),
            ("sc", "u8", (8,), _ksc),
            ("mn", "u8", (8,), _kmn),
        ),
        ("i", 4),
        ("j", 32),
        ("{j}", "32 + {j}"),
        ("fma32(i2f(q{i} & 15), dl, ml)", "fma32(i2f(q{i} >> 4), dh, mh)"),
        exact=("dl * i2f(q{i} & 15) + ml", "dh * i2f(q{i} >> 4) + mh"),
        per_n=("dl = sd[2 * i, n]", "ml = sm[2 * i, n]", "dh = sd[2 * i + 1, n]", "mh = sm[2 * i + 1, n]"),
        loads=("q{i} = qs[g, b, i, {j}, n]",),
        scales=_K_SCALES,
    ),
    # block_q5_K {d; dmin; scales[12]; qh[32]; qs[128]} (dequantize_row_q5_K): bit s of qh[j] → 5th bit of
    # element 32s + j
    Codec(
        Q.Q5_K,
        (
            ("qs", "u8", (4, 32), (48, 176)),
            ("qh", "u8", (32,), (16, 48)),
            ("d",) + _d(0),
            ("dmin",) + _d(2),
            ("sc", "u8", (8,), _ksc),
            ("mn", "u8", (8,), _kmn),
        ),
        ("i", 4),
        ("j", 32),
        ("{j}", "32 + {j}"),
        ("fma32(q5f(q{i}, 0, h{i}, 2 * i, 1, 0), dl, ml)", "fma32(q5f(q{i}, 4, h{i}, 2 * i + 1, 1, 0), dh, mh)"),
        exact=("dl * q5f(q{i}, 0, h{i}, 2 * i, 1, 0) + ml", "dh * q5f(q{i}, 4, h{i}, 2 * i + 1, 1, 0) + mh"),
        per_n=("dl = sd[2 * i, n]", "ml = sm[2 * i, n]", "dh = sd[2 * i + 1, n]", "mh = sm[2 * i + 1, n]"),
        loads=("q{i} = qs[g, b, i, {j}, n]", "h{i} = qh[g, b, {j}, n]"),
        scales=_K_SCALES,
    ),
    # block_q6_K {ql[128]; qh[64]; scales[16]; d} (dequantize_row_q6_K): unit = half hf (128 elements); step l
    # yields elements l, l + 32, l + 64, l + 96 from ql[l], ql[l + 32] (low, then high nibbles) and qh[l]
    Codec(
        Q.Q6_K,
        (
            ("ql", "u8", (2, 64), (0, 128)),
            ("qh", "u8", (2, 32), (128, 192)),
            ("sc", "i8", (16,), (192, 208)),
            ("d",) + _d(208),
        ),
        ("hf", 2),
        ("ll", 32),
        ("{j}", "32 + {j}", "64 + {j}", "96 + {j}"),
        (
            "sd[s{i}, n] * q5f(q{i}, 0, h{i}, 0, 3, 32)",
            "sd[s{i} + 2, n] * q5f(r{i}, 0, h{i}, 2, 3, 32)",
            "sd[s{i} + 4, n] * q5f(q{i}, 4, h{i}, 4, 3, 32)",
            "sd[s{i} + 6, n] * q5f(r{i}, 4, h{i}, 6, 3, 32)",
        ),
        loads=("q{i} = ql[g, b, hf, {j}, n]", "r{i} = ql[g, b, hf, {j} + 32, n]", "h{i} = qh[g, b, hf, {j}, n]"),
        per_step=("s{i} = hf * 8 + ({j}) // 16",),
        scales=(("sd", 16, "h2f(d[g, b, n]) * i2f(sc[g, b, c, n])"),),
        t1=1,
        t2=1,
    ),
    # block_iq4_nl {d; qs[16]} (dequantize_row_iq4_nl): kvalues_iq4nl[nibble] * d
    Codec(
        Q.IQ4_NL,
        (("qs", "u8", (16,), (2, 18)), ("d",) + _d(0)),
        (),
        ("j", 16),
        _NIB,
        ("dd * kvf(q{i} & 15)", "dd * kvf(q{i} >> 4)"),
        per_n=("dd = h2f(d[g, b, n])",),
        loads=("q{i} = qs[g, b, {j}, n]",),
        t1=4,
    ),
    # block_iq4_xs {d; scales_h; scales_l[4]; qs[128]} (dequantize_row_iq4_xs): unit = sub-block s (32)
    Codec(
        Q.IQ4_XS,
        (("qs", "u8", (8, 16), (8, 136)), ("sc", "i8", (8,), _iq4xs_sc), ("d",) + _d(0)),
        ("s", 8),
        ("j", 16),
        _NIB,
        ("dl * kvf(q{i} & 15)", "dl * kvf(q{i} >> 4)"),
        per_n=("dl = sd[s, n]",),
        loads=("q{i} = qs[g, b, s, {j}, n]",),
        scales=(("sd", 8, "h2f(d[g, b, n]) * i2f(sc[g, b, c, n])"),),
    ),
)

# ---------------------------------------------------------------------------------------------------------
# types beyond the first twelve (layouts: ggml-common.h block_*, arithmetic: ggml-quants.c dequantize_row_*)
_HALVES = ("{j}", "32 + {j}", "64 + {j}", "96 + {j}")  # Q2_K/Q3_K: byte l of a half → 4 elements, shifts 0..6
_OCT = tuple(f"8 * {{j}} + {m}" for m in range(8))  # IQ grids: step l → 8 consecutive elements


def _blk8(lo: int, hi: int, first: int, last: int, dtype=np.uint8):
    """Bytes [first, last) of each 8-byte group of the block bytes [lo, hi), viewed as dtype."""

    def f(blk):
        g = blk[..., lo:hi].reshape(blk.shape[:2] + (-1, 8))
        return np.ascontiguousarray(g[..., first:last]).view(dtype)[..., 0] if dtype != np.uint8 else g[..., first:last]

    return f


# Q3_K scale c from the 12 packed bytes, decoded per block in the kernel (kernels/blocks.py q3k_scales)
_Q3K_SCALE = (
    "h2f(d[g, b, n]) * i2f((((sc[g, b, c % 8, n] >> (4 * (c // 8))) & 15)"
    " | (((sc[g, b, 8 + c % 4, n] >> (2 * (c // 4))) & 3) << 4)) - 32)"
)


def _iq2_scale(mul: str, word: str) -> str:
    """db = d * (0.5 + 4-bit scale) * mul (dequantize_row_iq2_xxs / iq2_xs / iq2_s / iq3_xxs)."""
    return f"h2f(d[g, b, n]) * (np.float32(0.5) + i2f({word})) * np.float32({mul})"


_IQ2_16 = _iq2_scale("0.25", "(sc[g, b, c // 2, n] >> (4 * (c % 2))) & 15")  # two scales per 32 elements
_IQ1M_D = (
    "h2f(np.uint16((sc[g, b, 0, n] >> 12) | ((sc[g, b, 1, n] >> 8) & 0xF0) | ((sc[g, b, 2, n] >> 4) & 0xF00)"
    " | (sc[g, b, 3, n] & 0xF000)))"
)


def _grid8(scale: str) -> tuple:
    """8 weights from the grid entry ge{i} (8 bytes, one gather per step) and the sign byte k{i}."""
    return tuple(f"{scale} * i2f((ge{{i}} >> {8 * m}) & 255) * sgnf(k{{i}}, {m})" for m in range(8))


def _grid44() -> tuple:  # IQ3: two 4-byte grid entries (ge, gr) per 8 elements
    return tuple(
        f"sd[s, n] * i2f(({'ge' if m < 4 else 'gr'}{{i}} >> {8 * (m % 4)}) & 255) * sgnf(k{{i}}, {m})" for m in range(8)
    )


def _iq1(scale: str, delta: str) -> tuple:
    """dl * (grid + delta) from the int8 grid row q{i} (byte gathers: measured faster here than one 8-byte
    gather and shifts for these -1/0/+1 grids)."""
    return tuple(f"{scale} * (i2f(GRID_IQ1S[q{{i}}, {m}]) + {delta})" for m in range(8))


CODECS += (
    # block_q5_1 {d; m; qh[4]; qs[16]} (dequantize_row_q5_1: x*d + m)
    Codec(
        Q.Q5_1,
        (("qs", "u8", (16,), (8, 24)), ("qh", "u32", (), (4, 8)), ("d",) + _d(0), ("m",) + _d(2)),
        (),
        ("j", 16),
        _NIB,
        ("fma32(q5f(q{i}, 0, h, {j}, 1, 0), dd, mm)", "fma32(q5f(q{i}, 4, h, {j} + 16, 1, 0), dd, mm)"),
        exact=("q5f(q{i}, 0, h, {j}, 1, 0) * dd + mm", "q5f(q{i}, 4, h, {j} + 16, 1, 0) * dd + mm"),
        per_n=("dd = h2f(d[g, b, n])", "mm = h2f(m[g, b, n])", "h = qh[g, b, n]"),
        loads=("q{i} = qs[g, b, {j}, n]",),
        t1=4,
    ),
    # block_q2_K {scales[16]; qs[64]; d; dmin} (dequantize_row_q2_K): half hf, byte l, shift 2s → element
    # 128hf + 32s + l of sub-block 8hf + 2s + l // 16 (4-bit scale, 4-bit min)
    Codec(
        Q.Q2_K,
        (("sc", "u8", (16,), (0, 16)), ("qs", "u8", (2, 32), (16, 80)), ("d",) + _d(80), ("dmin",) + _d(82)),
        ("hf", 2),
        ("ll", 32),
        _HALVES,
        tuple(
            f"fma32(i2f((q{{i}} >> {2 * s}) & 3), sd[s{{i}} + {2 * s}, n], sm[s{{i}} + {2 * s}, n])" for s in range(4)
        ),
        exact=tuple(
            f"sd[s{{i}} + {2 * s}, n] * i2f((q{{i}} >> {2 * s}) & 3) + sm[s{{i}} + {2 * s}, n]" for s in range(4)
        ),
        loads=("q{i} = qs[g, b, hf, {j}, n]",),
        per_step=("s{i} = hf * 8 + ({j}) // 16",),
        scales=(
            ("sd", 16, "h2f(d[g, b, n]) * i2f(sc[g, b, c, n] & 15)"),
            ("sm", 16, "-(h2f(dmin[g, b, n]) * i2f(sc[g, b, c, n] >> 4))"),
        ),
        t1=1,
        t2=1,
    ),
    # block_q3_K {hmask[32]; qs[64]; scales[12]; d} (dequantize_row_q3_K): as Q2_K, minus 4 unless bit 4hf + s
    # of hmask[l] is set; 6-bit signed scales
    Codec(
        Q.Q3_K,
        (
            ("hm", "u8", (32,), (0, 32)),
            ("qs", "u8", (2, 32), (32, 96)),
            ("sc", "u8", (12,), (96, 108)),
            ("d",) + _d(108),
        ),
        ("hf", 2),
        ("ll", 32),
        _HALVES,
        tuple(
            f"sd[s{{i}} + {2 * s}, n] * i2f(((q{{i}} >> {2 * s}) & 3) + 4 * ((h{{i}} >> (4 * hf + {s})) & 1) - 4)"
            for s in range(4)
        ),
        loads=("q{i} = qs[g, b, hf, {j}, n]", "h{i} = hm[g, b, {j}, n]"),
        per_step=("s{i} = hf * 8 + ({j}) // 16",),
        scales=(("sd", 16, _Q3K_SCALE),),
        t1=1,
        t2=1,
    ),
    # block_mxfp4 {e; qs[16]} (dequantize_row_mxfp4: kvalues_mxfp4[nibble] * e8m0_half(e))
    Codec(
        Q.MXFP4,
        (("qs", "u8", (16,), (1, 17)), ("e", "u8", (), (0, 1))),
        (),
        ("j", 16),
        _NIB,
        ("mxf(q{i} & 15) * dd", "mxf(q{i} >> 4) * dd"),
        per_n=("dd = e8m0h(e[g, b, n])",),
        loads=("q{i} = qs[g, b, {j}, n]",),
        t1=4,
    ),
    # block_iq2_xxs {d; qs[32] u16}: per 32 elements 4 grid bytes, then a u32 of 4 x 7 sign bits + 4-bit scale
    Codec(
        Q.IQ2_XXS,
        (("gi", "u8", (8, 4), _blk8(2, 66, 0, 4)), ("sg", "u32", (8,), _blk8(2, 66, 4, 8, np.uint32)), ("d",) + _d(0)),
        ("s", 8),
        ("l", 4),
        _OCT,
        _grid8("sd[s, n]"),
        loads=("ge{i} = IQ2XXS_GRID[gi[g, b, s, {j}, n]]", "k{i} = KSIGNS[(sg[g, b, s, n] >> (7 * ({j}))) & 127]"),
        scales=(("sd", 8, _iq2_scale("0.25", "sg[g, b, c, n] >> 28")),),
        t1=1,
        t2=1,
    ),
    # block_iq2_xs {d; qs[32] u16 (9-bit grid index | 7-bit sign index); scales[8]}
    Codec(
        Q.IQ2_XS,
        (("qs", "u16", (8, 4), (2, 66)), ("sc", "u8", (8,), (66, 74)), ("d",) + _d(0)),
        ("s", 8),
        ("l", 4),
        _OCT,
        _grid8("sd[2 * s + ({j}) // 2, n]"),
        loads=("q{i} = qs[g, b, s, {j}, n]", "ge{i} = IQ2XS_GRID[q{i} & 511]", "k{i} = KSIGNS[q{i} >> 9]"),
        scales=(("sd", 16, _IQ2_16),),
        t1=1,
        t2=1,
    ),
    # block_iq2_s {d; qs[32] grid bytes; signs[32]; qh[8] (2 high index bits per 8 elements); scales[8]}
    Codec(
        Q.IQ2_S,
        (
            ("qs", "u8", (8, 4), (2, 34)),
            ("sn", "u8", (8, 4), (34, 66)),
            ("qh", "u8", (8,), (66, 74)),
            ("sc", "u8", (8,), (74, 82)),
            ("d",) + _d(0),
        ),
        ("s", 8),
        ("l", 4),
        _OCT,
        _grid8("sd[2 * s + ({j}) // 2, n]"),
        loads=(
            "ge{i} = IQ2S_GRID[qs[g, b, s, {j}, n] | ((qh[g, b, s, n] << (8 - 2 * ({j}))) & 0x300)]",
            "k{i} = sn[g, b, s, {j}, n]",
        ),
        scales=(("sd", 16, _IQ2_16),),
        t1=1,
        t2=1,
    ),
    # block_iq3_xxs {d; qs[64] grid bytes; 8 u32 (4 x 7 sign bits + 4-bit scale)}: 2 grid entries per 8
    Codec(
        Q.IQ3_XXS,
        (("qs", "u8", (8, 8), (2, 66)), ("ss", "u32", (8,), (66, 98)), ("d",) + _d(0)),
        ("s", 8),
        ("l", 4),
        _OCT,
        _grid44(),
        loads=(
            "ge{i} = IQ3XXS_GRID[qs[g, b, s, 2 * ({j}), n]]",
            "gr{i} = IQ3XXS_GRID[qs[g, b, s, 2 * ({j}) + 1, n]]",
            "k{i} = KSIGNS[(ss[g, b, s, n] >> (7 * ({j}))) & 127]",
        ),
        scales=(("sd", 8, _iq2_scale("0.5", "ss[g, b, c, n] >> 28")),),
        t1=1,
        t2=1,
    ),
    # block_iq3_s {d; qs[64]; qh[8] (9th index bit of each grid entry); signs[32]; scales[4]}: odd scales
    Codec(
        Q.IQ3_S,
        (
            ("qs", "u8", (8, 8), (2, 66)),
            ("qh", "u8", (8,), (66, 74)),
            ("sn", "u8", (8, 4), (74, 106)),
            ("sc", "u8", (4,), (106, 110)),
            ("d",) + _d(0),
        ),
        ("s", 8),
        ("l", 4),
        _OCT,
        _grid44(),
        loads=(
            "ge{i} = IQ3S_GRID[qs[g, b, s, 2 * ({j}), n] | ((qh[g, b, s, n] << (8 - 2 * ({j}))) & 256)]",
            "gr{i} = IQ3S_GRID[qs[g, b, s, 2 * ({j}) + 1, n] | ((qh[g, b, s, n] << (7 - 2 * ({j}))) & 256)]",
            "k{i} = sn[g, b, s, {j}, n]",
        ),
        scales=(("sd", 8, "h2f(d[g, b, n]) * i2f(1 + 2 * ((sc[g, b, c // 2, n] >> (4 * (c % 2))) & 15))"),),
        t1=1,
        t2=1,
    ),
    # block_iq1_s {d; qs[32]; qh[8] u16 (3 index bits per 8, 3-bit scale, delta sign)}: dl * (grid + delta)
    Codec(
        Q.IQ1_S,
        (("qs", "u8", (8, 4), (2, 34)), ("qh", "u16", (8,), (34, 50)), ("d",) + _d(0)),
        ("s", 8),
        ("l", 4),
        _OCT,
        _iq1("sd[s, n]", "sm[s, n]"),
        loads=("q{i} = qs[g, b, s, {j}, n] | (((qh[g, b, s, n] >> (3 * ({j}))) & 7) << 8)",),
        scales=(
            ("sd", 8, "h2f(d[g, b, n]) * i2f(2 * ((qh[g, b, c, n] >> 12) & 7) + 1)"),
            ("sm", 8, "-DELTA if qh[g, b, c, n] & 0x8000 else DELTA"),
        ),
        t1=1,
        t2=1,
    ),
    # block_iq1_m {qs[32]; qh[16] (3 index bits + delta sign per 8); scales[8] (3-bit scales per 16, and d)}
    Codec(
        Q.IQ1_M,
        (("qs", "u8", (8, 4), (0, 32)), ("qh", "u8", (8, 2), (32, 48)), ("sc", "u16", (4,), (48, 56))),
        ("s", 8),
        ("l", 4),
        _OCT,
        _iq1("sd[2 * s + ({j}) // 2, n]", "(-DELTA if h{i} & 8 else DELTA)"),
        loads=(
            "h{i} = qh[g, b, s, ({j}) // 2, n] >> (4 * (({j}) % 2))",
            "q{i} = qs[g, b, s, {j}, n] | ((h{i} & 7) << 8)",
        ),
        scales=(("sd", 16, _IQ1M_D + " * i2f(2 * ((sc[g, b, c // 4, n] >> (3 * (c % 4))) & 7) + 1)"),),
        t1=1,
        t2=1,
    ),
)


BY_QTYPE = {int(c.qtype): c for c in CODECS}


def canonical_order(c: Codec) -> np.ndarray:
    """Natural offset in its block of each weight, in the kernels' chain order (one block)."""
    out = []
    for u in range(c.units[1] if c.units else 1):
        for j in range(c.steps[1]):
            out += [u * c.unit + eval(p.format(j=j)) for p in c.pos]
    return np.array(out, np.int64)
