"""GGUF block facts shared by the fast kernels and their NumPy twins: elements and bytes per block, the
non-linear grids and the packed-scale unpackers (ggml-common.h block_* structs, ggml-quants.c helpers).

Pure data and NumPy; nothing here depends on a backend, so kernels/cpu, kernels/cuda and kernels/ref_quant
all import from it (the kernels never import their test twins).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType as Q

from . import grids as _grids

QK = 32  # elements per block of the simple quants (QK4_0, QK8_0, QK4_NL)
QK_K = 256  # elements per super-block of the K-quants and IQ4_XS

@dataclass(frozen=True)
class QuantType:
    """One GGUF tensor type: elements and bytes per block (sizeof(block_*) in ggml-common.h) and the byte offsets
    of its f16 scale fields in a block (d, then dmin where the type has one; none for the float types, MXFP4's
    E8M0 exponent and IQ1_M's d spread over its scale words). The validator's finite-scale scan, the random test
    blocks, the tiny-model writer, the kernel benchmark and the CUDA dispatch (kernels named `name.lower()`)
    read these records; the kernels themselves are kernels/cpu/codecs.py, kernels/cpu/qdot/ and
    kernels/cuda/quant.cu."""

    qtype: Q
    block: int
    nbytes: int
    f16: tuple[int, ...] = ()

    def __post_init__(self):
        if self.block < 1 or self.nbytes < 1 or any(not 0 <= o <= self.nbytes - 2 for o in self.f16):
            raise ValueError(f"{self.qtype.name}: bad block facts {self}")


QUANT_TYPES = {t.qtype: t for t in (
    QuantType(Q.F32, 1, 4),
    QuantType(Q.F16, 1, 2),
    QuantType(Q.BF16, 1, 2),
    QuantType(Q.Q8_0, 32, 34, (0,)),
    QuantType(Q.Q4_0, 32, 18, (0,)),
    QuantType(Q.Q4_1, 32, 20, (0, 2)),
    QuantType(Q.Q5_0, 32, 22, (0,)),
    QuantType(Q.Q4_K, 256, 144, (0, 2)),
    QuantType(Q.Q5_K, 256, 176, (0, 2)),
    QuantType(Q.Q6_K, 256, 210, (208,)),
    QuantType(Q.IQ4_NL, 32, 18, (0,)),
    QuantType(Q.IQ4_XS, 256, 136, (0,)),
    QuantType(Q.Q5_1, 32, 24, (0, 2)),
    QuantType(Q.Q2_K, 256, 84, (80, 82)),
    QuantType(Q.Q3_K, 256, 110, (108,)),
    QuantType(Q.MXFP4, 32, 17),
    QuantType(Q.IQ2_XXS, 256, 66, (0,)),
    QuantType(Q.IQ2_XS, 256, 74, (0,)),
    QuantType(Q.IQ2_S, 256, 82, (0,)),
    QuantType(Q.IQ3_XXS, 256, 98, (0,)),
    QuantType(Q.IQ3_S, 256, 110, (0,)),
    QuantType(Q.IQ1_S, 256, 50, (0,)),
    QuantType(Q.IQ1_M, 256, 56),
)}
BLOCK = {q: (t.block, t.nbytes) for q, t in QUANT_TYPES.items()}  # (elements, bytes) per block
F16_SCALES = {q: t.f16 for q, t in QUANT_TYPES.items() if t.block > 1}  # the quantised types' f16 fields

# the IQ4_NL / IQ4_XS non-linear 4-bit grid (ggml-common.h kvalues_iq4nl)
KVALUES_IQ4NL = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.int8)
# MXFP4 e2m1 values, doubled (ggml-common.h kvalues_mxfp4 / kvalues_fp4)
KVALUES_MXFP4 = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.int8)
IQ1S_DELTA = 0.125  # ggml-common.h IQ1S_DELTA (= IQ1M_DELTA)

# the IQ grids as [entries, elements] bytes (element j = byte j of ggml's little-endian table entry)
KSIGNS_IQ2XS = _grids.KSIGNS_IQ2XS  # 7-bit sign index → 8 sign bits (the 8th makes the parity even)
GRID_IQ2XXS = _grids.IQ2XXS_GRID.view(np.uint8).reshape(-1, 8)
GRID_IQ2XS = _grids.IQ2XS_GRID.view(np.uint8).reshape(-1, 8)
GRID_IQ2S = _grids.IQ2S_GRID.view(np.uint8).reshape(-1, 8)
GRID_IQ3XXS = _grids.IQ3XXS_GRID.view(np.uint8).reshape(-1, 4)
GRID_IQ3S = _grids.IQ3S_GRID.view(np.uint8).reshape(-1, 4)
GRID_IQ1S = _grids.IQ1S_GRID.view(np.int8).reshape(-1, 8)


def row_bytes(qtype: int, n_cols: int) -> int:
    bs, ts = BLOCK[Q(qtype)]
    if n_cols % bs:
        raise ValueError(f"{Q(qtype).name}: row length {n_cols} is not a multiple of {bs}")
    return n_cols // bs * ts


def act_block(qtype: int) -> int:
    """Elements per activation scale on the int8 path for weights of this type: QK_K for the super-block types
    (ggml's Q8_K vec_dot type), else QK (Q8_0's)."""
    return QK_K if BLOCK[Q(int(qtype))][0] == QK_K else QK


def k_scale_min(sc12: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K 12-byte packed 6-bit scales → (scale[..., 8], min[..., 8]) as uint8 (get_scale_min_k4)."""
    s = sc12.astype(np.uint8)
    sc = np.empty(s.shape[:-1] + (8,), np.uint8)
    mn = np.empty(s.shape[:-1] + (8,), np.uint8)
    sc[..., :4] = s[..., 0:4] & 63
    mn[..., :4] = s[..., 4:8] & 63
    sc[..., 4:] = (s[..., 8:12] & 0x0F) | ((s[..., 0:4] >> 6) << 4)
    mn[..., 4:] = (s[..., 8:12] >> 4) | ((s[..., 4:8] >> 6) << 4)
    return sc, mn


def iq4xs_scales(scales_h: np.ndarray, scales_l: np.ndarray) -> np.ndarray:
    """IQ4_XS: uint16 scales_h [...] and 4 bytes scales_l [..., 4] → signed sub-block scales int [..., 8]."""
    ib = np.arange(8)
    lo = (scales_l[..., ib // 2] >> (4 * (ib % 2))) & 0x0F
    hi = (scales_h[..., None].astype(np.int32) >> (2 * ib)) & 3
    return (lo.astype(np.int32) | (hi << 4)) - 32


def q3k_scales(sc12: np.ndarray) -> np.ndarray:
    """Q3_K 12-byte packed 6-bit scales → signed scales int8 [..., 16] (scale - 32), as dequantize_row_q3_K's
    kmask1/kmask2 shuffle: low nibbles from bytes 0..7 (low then high nibble halves), 2 high bits from 8..11."""
    s = sc12.astype(np.uint8)
    lo = np.concatenate([s[..., 0:8] & 0x0F, s[..., 0:8] >> 4], axis=-1)
    hi = np.concatenate([(s[..., 8:12] >> (2 * k)) & 3 for k in range(4)], axis=-1)
    return ((lo | (hi << 4)).astype(np.int16) - 32).astype(np.int8)


def e8m0_half(e: np.ndarray) -> np.ndarray:
    """MXFP4 shared exponent byte → 2^(e - 128) as float32 (ggml-impl.h ggml_e8m0_to_fp32_half)."""
    e = e.astype(np.uint32)
    bits = np.where(e < 2, np.uint32(0x00200000) << e, (e - np.uint32(1)) << np.uint32(23))
    return bits.astype(np.uint32).view(np.float32)


def iq1m_d(sc4: np.ndarray) -> np.ndarray:
    """IQ1_M: the f16 super-block scale spread over the top nibbles of the 4 uint16 scale words → float32."""
    s = sc4.astype(np.uint16)
    u = (s[..., 0] >> 12) | ((s[..., 1] >> 8) & 0x00F0) | ((s[..., 2] >> 4) & 0x0F00) | (s[..., 3] & 0xF000)
    return u.astype(np.uint16).view(np.float16).astype(np.float32)
