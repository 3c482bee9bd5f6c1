"""Numba kernels for the non-matmul parts of a transformer window: RMSNorm, RoPE, GQA attention, SwiGLU, routing.

All keep the row-invariance contract (docs/contracts.md "Row invariance"): work is split over rows/heads/
features, never inside one reduction, and every reduction runs in a fixed order that does not depend on T or
the thread count.
Twins: guild.kernels.ref (same names).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange


@njit(cache=True, parallel=True, error_model="numpy")
def rmsnorm(x, w, eps, out):
    """out[t] = x[t] / sqrt(mean(x[t]^2) + eps) * w. x, out: [T, D] float32; w: [D]."""
    T, D = x.shape
    for t in prange(T):
        s = 0.0  # float64 accumulator, sequential order
        for i in range(D):
            v = np.float64(x[t, i])
            s += v * v
        scale = np.float32(1.0 / math.sqrt(s / D + eps))
        for i in range(D):
            out[t, i] = (x[t, i] * scale) * w[i]


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
def exp_shifted(x, m, y, e2):
    """y[j] = exp(x[j] - m) for x[j] <= m, in float32 (Cephes expf: exp(r) polynomial times 2^n), j < y.size.

    Written as stride-1 loops without library calls so that it vectorises; the result of each element does
    not depend on its neighbours or on the length. e2: int32 scratch of the same length (the 2^n bits).
    """
    for j in range(y.size):
        v = max(x[j] - m, np.float32(-87.0))
        n = np.floor(v * np.float32(1.44269504) + np.float32(0.5))
        r = v - n * np.float32(0.693359375) - n * np.float32(-2.12194440e-4)
        p = np.float32(1.9875691500e-4) * r + np.float32(1.3981999507e-3)
        p = p * r + np.float32(8.3334519073e-3)
        p = p * r + np.float32(4.1665795894e-2)
        p = p * r + np.float32(1.6666665459e-1)
        p = p * r + np.float32(5.0000001201e-1)
        y[j] = p * (r * r) + r + np.float32(1.0)
        e2[j] = (np.int32(n) + np.int32(127)) << np.int32(23)
    f = e2.view(np.float32)
    for j in range(y.size):
        y[j] *= f[j]


@njit(cache=True)
def sum_fixed(y):
    """Sum in a fixed 16-lane order (lane j % 16, then lanes 0..15): vectorisable and independent of where
    the array lives; the same length always gives the same bits."""
    acc = np.zeros(16, np.float32)
    n16 = y.size // 16 * 16
    for b in range(0, n16, 16):
        for k in range(16):
            acc[k] += y[b + k]
    for j in range(n16, y.size):
        acc[j - n16] += y[j]
    tot = np.float32(0.0)
    for k in range(16):
        tot += acc[k]
    return tot


@njit(cache=True, parallel=True, error_model="numpy")
def attention(q, kt, vc, pos0, scale, out, scores):
    """Causal GQA attention of a window over the KV cache.

    q: [T, H, hd] (rows at positions pos0..pos0+T-1); kt: [Hkv, hd, ctx] (keys transposed, so the score loop
    runs stride-1 over positions); vc: [Hkv, ctx, hd]; out: [T, H, hd]; scores: [T*H, >= pos0+T] scratch.
    Row t reads positions 0..pos0+t; every score, sum and output element is computed in a fixed order.
    """
    T, H, hd = q.shape
    Hkv = kt.shape[0]
    group = H // Hkv
    for th in prange(T * H):
        t = th // H
        h = th - t * H
        g = h // group
        L = pos0 + t + 1
        sc = scores[th, :L]
        e2 = np.empty(L, np.int32)
        for j in range(L):
            sc[j] = 0.0
        for i in range(hd):  # s[j] += q[i] * k[j, i], vectorised over j
            qi = q[t, h, i] * scale
            kr = kt[g, i]
            for j in range(L):
                sc[j] += qi * kr[j]
        m = sc[0]
        for j in range(1, L):
            m = max(m, sc[j])
        exp_shifted(sc, m, sc, e2)
        inv = np.float32(1.0) / sum_fixed(sc)
        o = out[t, h]
        for i in range(hd):
            o[i] = 0.0
        for j in range(L):  # out[i] += p[j] * v[j, i], vectorised over i
            p = sc[j] * inv
            vr = vc[g, j]
            for i in range(hd):
                o[i] += p * vr[i]


@njit(cache=True, fastmath=True, error_model="numpy")  # numpy: a zero divisor gives inf/NaN, never raises
def swiglu(gu, out):
    """out = silu(gate) * up with gate = gu[:, :F], up = gu[:, F:] (fused gate|up matmul output [R, 2F])."""
    R, F = out.shape
    for r in range(R):
        for i in range(F):
            a = gu[r, i]
            out[r, i] = a / (np.float32(1.0) + np.exp(-a)) * gu[r, F + i]


@njit(cache=True)
def combine_experts(y, w, out):
    """out[t] = sum_r w[t, r] * y[t, r], summed in the row's own top-k rank order. y [T, k, D]; w [T, k]."""
    T, k, D = y.shape
    for t in range(T):
        for i in range(D):
            out[t, i] = w[t, 0] * y[t, 0, i]
        for r in range(1, k):
            for i in range(D):
                out[t, i] += w[t, r] * y[t, r, i]


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
