"""GGUF block contents shared by the fast kernels and their NumPy twins: the non-linear grids and the packed-scale
unpackers (ggml-common.h block_* structs, ggml-quants.c helpers). Each type's block facts (elements and bytes per
block, f16 scale offsets) are in its record, kernels/quant_types.py.

Pure data and NumPy; nothing here depends on a backend, so kernels/cpu, kernels/cuda and kernels/ref_quant
all import from it (the kernels never import their test twins).
"""

from __future__ import annotations

import numpy as np

from . import grids as _grids

QK = 32  # elements per block of the simple quants (QK4_0, QK8_0, QK4_NL)
QK_K = 256  # elements per super-block of the K-quants and IQ4_XS

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
