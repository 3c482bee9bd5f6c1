"""Numba kernels for the non-matmul parts of a transformer window: RMSNorm, RoPE, GQA attention, SwiGLU, routing.

All keep the row-invariance contract (DESIGN.md): work is split over rows/heads/features, never inside one
reduction, and every reduction runs in a fixed order that does not depend on T or the thread count.
Twins: guild.kernels.ref (same names).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange


@njit(cache=True, parallel=True)
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


@njit(cache=True)
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


@njit(cache=True, parallel=True, fastmath=True)
def attention(q, kc, vc, pos0, scale, out, scores):
    """Causal GQA attention of a window over the KV cache.

    q: [T, H, hd] (rows at positions pos0..pos0+T-1); kc, vc: [Hkv, ctx, hd] with rows up to pos0+T-1 written;
    out: [T, H, hd]; scores: [T*H, ctx] scratch. Row t reads positions 0..pos0+t in order.
    """
    T, H, hd = q.shape
    Hkv = kc.shape[0]
    group = H // Hkv
    for th in prange(T * H):
        t = th // H
        h = th - t * H
        g = h // group
        L = pos0 + t + 1
        sc = scores[th]
        m = -np.inf
        for j in range(L):
            s = np.float32(0.0)
            for i in range(hd):
                s += q[t, h, i] * kc[g, j, i]
            s *= scale
            sc[j] = s
            if s > m:
                m = s
        tot = np.float32(0.0)
        for j in range(L):
            e = np.exp(sc[j] - m)
            sc[j] = e
            tot += e
        inv = np.float32(1.0) / tot
        for i in range(hd):
            out[t, h, i] = 0.0
        for j in range(L):
            p = sc[j] * inv
            for i in range(hd):
                out[t, h, i] += p * vc[g, j, i]


@njit(cache=True, fastmath=True)
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


@njit(cache=True)
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
                if p[e] >= 0 and (best < 0 or p[e] > p[best]):
                    best = e
            ids[t, r] = best
            weights[t, r] = p[best]
            tot += p[best]
            p[best] = -1.0
        if renorm:
            for r in range(k):
                weights[t, r] = weights[t, r] / tot
