"""The fp32 path's codecs: how `pack` lays a type's blocks out for the kernels and how the kernels decode them.
Each type's codec is the `f32` of its record (kernels/quant_types.py); kernels/cpu/gen_quant.py turns each into
its GEMV kernel and get_rows (kernels/cpu/quant_gen.py, generated and committed). This module holds the codec
class and the pieces the codecs share (byte ranges, decoded scales, decode expressions).

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

from ..blocks import iq4xs_scales, k_scale_min


@dataclass(frozen=True)
class Codec:
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


CTYPES = {"u8": np.uint8, "i8": np.int8, "u16": np.uint16, "u32": np.uint32, "f32": np.float32}


def f16_at(lo: int) -> tuple:
    """An f16 scale field at byte `lo`, kept as raw bits."""
    return ("u16", (), (lo, lo + 2))


def k_sc(blk):
    return k_scale_min(blk[..., 4:16])[0]


def k_mn(blk):
    return k_scale_min(blk[..., 4:16])[1]


def iq4xs_sc(blk):
    return iq4xs_scales(np.ascontiguousarray(blk[..., 2:4]).view(np.uint16)[..., 0], blk[..., 4:8])


NIB = ("{j}", "{j} + 16")  # byte j of a 32-element unit: low nibble → element j, high → j + 16
K_SCALES = (
    ("sd", 8, "h2f(d[g, b, n]) * i2f(sc[g, b, c, n])"),
    ("sm", 8, "-(h2f(dmin[g, b, n]) * i2f(mn[g, b, c, n]))"),
)


HALVES = ("{j}", "32 + {j}", "64 + {j}", "96 + {j}")  # Q2_K/Q3_K: byte l of a half → 4 elements, shifts 0..6
OCT = tuple(f"8 * {{j}} + {m}" for m in range(8))  # IQ grids: step l → 8 consecutive elements


def blk8(lo: int, hi: int, first: int, last: int, dtype=np.uint8):
    """Bytes [first, last) of each 8-byte group of the block bytes [lo, hi), viewed as dtype."""

    def f(blk):
        g = blk[..., lo:hi].reshape(blk.shape[:2] + (-1, 8))
        return np.ascontiguousarray(g[..., first:last]).view(dtype)[..., 0] if dtype != np.uint8 else g[..., first:last]

    return f


# Q3_K scale c from the 12 packed bytes, decoded per block in the kernel (kernels/blocks.py q3k_scales)
Q3K_SCALE = (
    "h2f(d[g, b, n]) * i2f((((sc[g, b, c % 8, n] >> (4 * (c // 8))) & 15)"
    " | (((sc[g, b, 8 + c % 4, n] >> (2 * (c // 4))) & 3) << 4)) - 32)"
)


def iq2_scale(mul: str, word: str) -> str:
    """db = d * (0.5 + 4-bit scale) * mul (dequantize_row_iq2_xxs / iq2_xs / iq2_s / iq3_xxs)."""
    return f"h2f(d[g, b, n]) * (np.float32(0.5) + i2f({word})) * np.float32({mul})"


IQ2_16 = iq2_scale("0.25", "(sc[g, b, c // 2, n] >> (4 * (c % 2))) & 15")  # two scales per 32 elements
IQ1M_D = (
    "h2f(np.uint16((sc[g, b, 0, n] >> 12) | ((sc[g, b, 1, n] >> 8) & 0xF0) | ((sc[g, b, 2, n] >> 4) & 0xF00)"
    " | (sc[g, b, 3, n] & 0xF000)))"
)


def grid8(scale: str) -> tuple:
    """8 weights from the grid entry ge{i} (8 bytes, one gather per step) and the sign byte k{i}."""
    return tuple(f"{scale} * i2f((ge{{i}} >> {8 * m}) & 255) * sgnf(k{{i}}, {m})" for m in range(8))


def grid44() -> tuple:  # IQ3: two 4-byte grid entries (ge, gr) per 8 elements
    return tuple(
        f"sd[s, n] * i2f(({'ge' if m < 4 else 'gr'}{{i}} >> {8 * (m % 4)}) & 255) * sgnf(k{{i}}, {m})" for m in range(8)
    )


def iq1(scale: str, delta: str) -> tuple:
    """dl * (grid + delta) from the int8 grid row q{i} (byte gathers: measured faster here than one 8-byte
    gather and shifts for these -1/0/+1 grids)."""
    return tuple(f"{scale} * (i2f(GRID_IQ1S[q{{i}}, {m}]) + {delta})" for m in range(8))


def canonical_order(c: Codec, unit: int) -> np.ndarray:
    """Natural offset in its block of each weight, in the kernels' chain order (one block of units of `unit`)."""
    out = []
    for u in range(c.units[1] if c.units else 1):
        for j in range(c.steps[1]):
            out += [u * unit + eval(p.format(j=j)) for p in c.pos]
    return np.array(out, np.int64)
