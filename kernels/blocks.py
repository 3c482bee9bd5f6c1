"""GGUF block facts shared by the fast kernels and their NumPy twins: elements and bytes per block, the
non-linear grids and the packed-scale unpackers (ggml-common.h block_* structs, ggml-quants.c helpers).

Pure data and NumPy; nothing here depends on a backend, so kernels/cpu, kernels/cuda and kernels/ref_quant
all import from it (the kernels never import their test twins).
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as Q

QK = 32  # elements per block of the simple quants (QK4_0, QK8_0, QK4_NL)
QK_K = 256  # elements per super-block of the K-quants and IQ4_XS

# (elements per block, bytes per block): sizeof(block_*) in ggml-common.h
BLOCK = {
    Q.F32: (1, 4),
    Q.F16: (1, 2),
    Q.BF16: (1, 2),
    Q.Q8_0: (32, 34),
    Q.Q4_0: (32, 18),
    Q.Q4_1: (32, 20),
    Q.Q5_0: (32, 22),
    Q.Q4_K: (256, 144),
    Q.Q5_K: (256, 176),
    Q.Q6_K: (256, 210),
    Q.IQ4_NL: (32, 18),
    Q.IQ4_XS: (256, 136),
}

# the IQ4_NL / IQ4_XS non-linear 4-bit grid (ggml-common.h kvalues_iq4nl)
KVALUES_IQ4NL = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.int8)


def row_bytes(qtype: int, n_cols: int) -> int:
    bs, ts = BLOCK[Q(qtype)]
    if n_cols % bs:
        raise ValueError(f"{Q(qtype).name}: row length {n_cols} is not a multiple of {bs}")
    return n_cols // bs * ts


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
