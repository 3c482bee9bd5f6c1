"""The int8 path's geometry and its table of types: tiles of NT features in groups of GL lanes, blocks of QB
activations, and per type the kernel kind and the packed fields (roles and dtypes) that `layout` sizes."""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as Q

from ...blocks import GRID_IQ2S, GRID_IQ2XS, GRID_IQ2XXS, GRID_IQ3S, GRID_IQ3XXS
from ..drivers import NT

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
