"""The int8 path's geometry: tiles of NT features in groups of GL lanes, blocks of QB activations; the shapes of
the packed fields by role (each type's fields are the `i8` of its record, kernels/quant_types.py), and the
kernel kinds: a type's GGML number, a closure constant of its entry point (kernels/cpu/qdot/kernels.py)."""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as Q

from ...blocks import GRID_IQ2S, GRID_IQ2XS, GRID_IQ2XXS, GRID_IQ3S, GRID_IQ3XXS
from ...quant_types import QUANT_TYPES
from ..drivers import NT

QB = 32  # activation block (elements)
GL = 16  # features per group: the lanes of one vector
NJ = NT // GL  # groups per tile
SB = 8  # activation blocks per K-quant super-block (256 elements)
ACT_EXTRA = 20  # bytes per row and block besides the quants: scale, Σq, scale·Σq, the two half sums
# kernel kinds: the GGML type numbers, as plain ints for Numba
Q4_0, Q4_1, Q8_0, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, Q2_K, Q3_K, IQ4_NL, IQ4_XS, MXFP4 = (int(q) for q in (
    Q.Q4_0, Q.Q4_1, Q.Q8_0, Q.Q5_0, Q.Q5_1, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.Q2_K, Q.Q3_K, Q.IQ4_NL, Q.IQ4_XS, Q.MXFP4))
# grid types: values read from a table by index
IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M = (int(q) for q in (
    Q.IQ2_XXS, Q.IQ2_XS, Q.IQ2_S, Q.IQ3_XXS, Q.IQ3_S, Q.IQ1_S, Q.IQ1_M))

# grid types: the table of magnitudes (bytes per entry), the float factor of the integer scale before d
_GRIDS = {Q.IQ2_XXS: (GRID_IQ2XXS, 0.125), Q.IQ2_XS: (GRID_IQ2XS, 0.125), Q.IQ2_S: (GRID_IQ2S, 0.125),
          Q.IQ3_XXS: (GRID_IQ3XXS, 0.25), Q.IQ3_S: (GRID_IQ3S, 1.0)}


# field shapes by role, each after [nt tiles, NJ groups] (nb blocks, GL lanes):
#   q4: nibble quads [nb, 4, GL, 4] u8      q8: byte quads [nb, 8, GL, 4] u8 (q + 128)
#   w:  bit-plane word [nb, GL] u32         w2: two words (block halves) [nb, 2, GL] u32
#   b2: two bytes [nb, 2, GL]   b: a byte [nb, GL]   h: f16 per block [nb, GL]
#   hs: f16 per 256 [nb/8, GL]   g4, g8: grid indices' low bytes per 8 or per 4 elements [nb, 4 | 8, GL]
#   (the grid types: IQ2_XS's 9th index bit, IQ2_S's 9th and 10th, IQ3_S's 9th in a byte `gh` per block; the
#   signs, one bit per element, in a bit-plane word; IQ2_XS/IQ2_S's two 4-bit scales s in one byte, else 2s + 1)
def _shape(role: str, nt: int, nb: int) -> tuple:
    rest = {"q4": (nb, 4, GL, 4), "q8": (nb, 8, GL, 4), "w": (nb, GL), "w2": (nb, 2, GL), "b2": (nb, 2, GL),
            "b": (nb, GL), "h": (nb, GL), "hs": (nb // SB, GL), "g4": (nb, 4, GL), "g8": (nb, 8, GL)}[role]
    return (nt, NJ) + rest


def layout(qtype: int, n_rows: int, n_cols: int) -> tuple:
    """(dtype, shape) of each packed array."""
    nt, nb = -(-int(n_rows) // NT), -(-int(n_cols) // QB)
    return tuple((np.dtype(dt), _shape(role, nt, nb)) for _, role, dt in QUANT_TYPES[Q(int(qtype))].i8)
