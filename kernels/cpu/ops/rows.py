"""Row-wise kernels of a transformer window: RMSNorm, RoPE, SwiGLU, the router's softmax top-k, a vectorisable
expf and a fixed-order sum. Each row's arithmetic is independent of the other rows and of the thread count."""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from ..intrinsics import floorf, fma32, pow2f
from ..simd import add_f, lane, ld_f32, zero_f


@njit(cache=True, inline="always", error_model="numpy")
def _rmsnorm_row(x, w, eps, out, t):
    D = x.shape[1]
    s = 0.0  # float64 accumulator, sequential order
    for i in range(D):
        v = np.float64(x[t, i])
        s += v * v
    scale = np.float32(1.0 / math.sqrt(s / D + eps))
    for i in range(D):
        out[t, i] = (x[t, i] * scale) * w[i]


@njit(cache=True, error_model="numpy")
def rmsnorm(x, w, eps, out):
    """out[t] = x[t] / sqrt(mean(x[t]^2) + eps) * w. x, out: [T, D] float32; w: [D]. One thread: a window's
    few rows cost less than waking the others (rmsnorm_parallel, the same bits, for prefill chunks)."""
    for t in range(x.shape[0]):
        _rmsnorm_row(x, w, eps, out, t)


@njit(cache=True, parallel=True, error_model="numpy")
def rmsnorm_parallel(x, w, eps, out):
    """rmsnorm with the rows spread over the threads."""
    for t in prange(x.shape[0]):
        _rmsnorm_row(x, w, eps, out, t)


@njit(cache=True, error_model="numpy")
def rmsnorm_heads(x, w, eps):
    """In-place RMSNorm of every head vector: x [T, H, hd], w [hd] (Qwen3 QK-norm)."""
    T, H, hd = x.shape
    for t in range(T):
        for h in range(H):
            s = 0.0
            for i in range(hd):
                v = np.float64(x[t, h, i])
                s += v * v
            scale = np.float32(1.0 / math.sqrt(s / hd + eps))
            for i in range(hd):
                x[t, h, i] = (x[t, h, i] * scale) * w[i]


@njit(cache=True)
def rope(x, positions, cos, sin, n_rot, neox):
    """In-place rotary embedding. x: [T, H, hd]; cos/sin: [ctx, n_rot/2] tables; positions: [T] int64.

    neox=False rotates adjacent pairs (2i, 2i+1) — llama in GGUF, whose converter permuted Q/K for it;
    neox=True rotates halves (i, i + n_rot/2) — qwen3, qwen3moe.
    """
    T, H, hd = x.shape
    half = n_rot // 2
    for t in range(T):
        p = positions[t]
        for h in range(H):
            for i in range(half):
                c = cos[p, i]
                s = sin[p, i]
                if neox:
                    a = x[t, h, i]
                    b = x[t, h, i + half]
                    x[t, h, i] = a * c - b * s
                    x[t, h, i + half] = a * s + b * c
                else:
                    a = x[t, h, 2 * i]
                    b = x[t, h, 2 * i + 1]
                    x[t, h, 2 * i] = a * c - b * s
                    x[t, h, 2 * i + 1] = a * s + b * c


@njit(cache=True)
def sum_fixed(y):
    """Sum in a fixed 16-lane order (lane j % 16, then lanes 0..15): vectorisable and independent of where
    the array lives; the same length always gives the same bits."""
    n16 = y.size // 16 * 16
    if y.strides[0] == 4:  # the 16 lanes in one vector register (LLVM keeps an array's lanes in memory)
        v = zero_f()
        for b in range(0, n16, 16):
            v = add_f(v, ld_f32(y.ctypes.data + 4 * b))
        tot = np.float32(0.0)
        for k in range(16):
            a = lane(v, k)
            if n16 + k < y.size:
                a += y[n16 + k]
            tot += a
        return tot
    acc = np.zeros(16, np.float32)
    for b in range(0, n16, 16):
        for k in range(16):
            acc[k] += y[b + k]
    for j in range(n16, y.size):
        acc[j - n16] += y[j]
    tot = np.float32(0.0)
    for k in range(16):
        tot += acc[k]
    return tot


@njit(cache=True, inline="always")
def expf(x):
    """exp(x) in float32 for any x (clamped to [-87, 88]): Cephes expf (exp(r) polynomial times 2^n, with fmas),
    written without library calls so that loops over it vectorise; each result depends on x alone."""
    v = min(max(x, np.float32(-87.0)), np.float32(88.0))
    n = floorf(fma32(v, np.float32(1.44269504), np.float32(0.5)))
    r = fma32(n, np.float32(2.12194440e-4), fma32(n, np.float32(-0.693359375), v))
    p = fma32(np.float32(1.9875691500e-4), r, np.float32(1.3981999507e-3))
    p = fma32(p, r, np.float32(8.3334519073e-3))
    p = fma32(p, r, np.float32(4.1665795894e-2))
    p = fma32(p, r, np.float32(1.6666665459e-1))
    p = fma32(p, r, np.float32(5.0000001201e-1))
    y = fma32(p, r * r, r) + np.float32(1.0)
    # 2^n in two factors: n reaches 127 only at the clamp (88 * log2 e = 126.96 rounds to 127)
    h = floorf(n * np.float32(0.5))
    return y * pow2f(h) * pow2f(n - h)


@njit(cache=True, error_model="numpy")  # numpy: a zero divisor gives inf/NaN, never raises
def swiglu(gu, out):
    """out = silu(gate) * up with gate = gu[:, :F], up = gu[:, F:] (fused gate|up matmul output [R, 2F])."""
    R, F = out.shape
    for r in range(R):
        g = gu[r]
        o = out[r]
        for i in range(F):
            a = g[i]
            o[i] = a / (np.float32(1.0) + expf(-a)) * g[F + i]


@njit(cache=True, error_model="numpy")
def softmax_topk(logits, k, renorm, ids, weights):
    """Router: softmax over experts → top-k (ties to the lower id) → optional renormalise.
    logits [T, E] → ids, weights [T, k]."""
    T, E = logits.shape
    p = np.empty(E, np.float32)
    for t in range(T):
        m = logits[t, 0]
        for e in range(1, E):
            if logits[t, e] > m:
                m = logits[t, e]
        s = np.float32(0.0)
        for e in range(E):
            p[e] = np.exp(logits[t, e] - m)
            s += p[e]
        for e in range(E):
            p[e] = p[e] / s
        tot = np.float32(0.0)
        for r in range(k):
            best = -1
            for e in range(E):
                # taken experts are -1; a NaN probability is never larger, so an all-NaN row takes the lowest
                # free ids (the NaN then reaches the logits, where the model reports it) instead of id -1
                if p[e] != -1.0 and (best < 0 or p[e] > p[best]):
                    best = e
            ids[t, r] = best
            weights[t, r] = p[best]
            tot += p[best]
            p[best] = -1.0
        if renorm:
            for r in range(k):
                weights[t, r] = weights[t, r] / tot
