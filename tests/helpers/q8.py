"""The int8 quantisers' outputs as plain arrays, and inputs with exact rounding ties, for the tests that hold them
to gguf-py (tests/kernels/) and to ggml itself (tests/oracles/test_ggml_quantizers.py)."""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf.quants import quantize

from guild.kernels.cpu import ops
from guild.kernels.cpu.qdot.activations import act_bytes, quantize_acts


def rows(seed: int, n: int = 64, k: int = 256) -> np.ndarray:
    """n rows of k float32 values, each row at its own scale (0.01 .. 30), one block of 32 all zero."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((n, k)) * rng.uniform(0.01, 30, (n, 1))).astype(np.float32)
    x[3, :32] = 0.0
    return x


def ties(n: int = 4, k: int = 256) -> np.ndarray:
    """Rows whose every 32-block has max |x| = 127 (scale 1, multiplier 1: x * (1 / d) is x exactly) and whose odd
    elements are half-integers: every one an exact rounding tie."""
    x = np.zeros((n, k), np.float32)
    x[:, ::2] = 127.0
    x[:, 1::2] = np.tile(np.array([0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 126.5, -3.5], np.float32), k // 16)
    return x


def gguf_q8_0(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """gguf-py's Q8_0 of rows x: (quants [n, k] int8, scales [n, k/32] float16)."""
    b = quantize(np.ascontiguousarray(x, np.float32), Q.Q8_0).reshape(-1, 34)
    n = x.shape[0]
    return b[:, 2:].view(np.int8).reshape(n, -1), b[:, :2].copy().view(np.float16).reshape(n, -1)


def kv_q8_0(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """guild's q8_0 KV quantiser (kernels/cpu/ops/kv.py) of rows x: (quants int8, scales as stored, float16)."""
    qs, d = np.empty(x.shape, np.int8), np.empty((x.shape[0], x.shape[1] // 32), np.float32)
    ops.kv_quantize_q8_0(np.ascontiguousarray(x, np.float32), qs, d)
    return qs, d.astype(np.float16)


def act_q8(x: np.ndarray, sg: int) -> tuple[np.ndarray, np.ndarray]:
    """guild's activation quantiser (kernels/cpu/qdot/activations.py) of rows x, one scale per sg blocks of 32:
    (quants [n, k] int8, float32 scales [n, k/32]: each block records its group's)."""
    x = np.ascontiguousarray(x, np.float32)
    n, k = x.shape
    buf = np.zeros(act_bytes(n, k), np.uint8)
    quantize_acts(x, buf, sg)
    return buf[: n * k].view(np.int8).reshape(n, k).copy(), buf[n * k : n * k + 4 * n * k // 32].view(
        np.float32
    ).reshape(n, -1)


def half_away(y: np.ndarray) -> np.ndarray:
    """Round half away from zero (C's roundf)."""
    return np.sign(y) * np.floor(np.abs(y) + 0.5)


def exact_ties(x: np.ndarray, d32: np.ndarray) -> np.ndarray:
    """Where x * (1 / d) (float32, d per block of 32) is exactly a half-integer."""
    inv = np.zeros_like(d32)
    np.divide(np.float32(1.0), d32, out=inv, where=d32 > 0)
    y = x * np.repeat(inv, 32, axis=1)
    return y - np.floor(y) == 0.5
