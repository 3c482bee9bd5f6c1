"""Numba kernels of a Gated DeltaNet (linear attention) layer over a window of T rows: causal depthwise conv1d
with history, per-head L2 norm, the gates, the gated delta rule recurrence, and the gated RMSNorm.

Decode math of HF transformers' Qwen3-Next reference (`torch_causal_conv1d_update`, `l2norm`,
`torch_recurrent_gated_delta_rule`, `Qwen3NextRMSNormGated`). Row invariance: row t only reads rows <= t and
the state before the window, every reduction runs in a fixed order, threads split heads (never a reduction).
Twins: guild.kernels.ref (same names).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

# error_model="numpy" throughout: a zero divisor (NaN/inf weights) gives inf/NaN, which the model reports at its
# logits, instead of a ZeroDivisionError from inside a kernel


@njit(cache=True, error_model="numpy")
def conv1d_silu(x, hist, wt, out):
    """Causal depthwise conv over the window, then SiLU.

    x [T, C]: the window's conv inputs; hist [K-1, C]: the K-1 inputs before the window (zeros at the start);
    wt [K, C]: the kernel transposed (tap-major, so the inner loop runs stride-1 over channels); out [T, C].
    out[t, c] = silu(sum_k wt[k, c] * src[t + k - (K-1), c]), src = hist before row 0; taps summed k = 0..K-1.
    """
    T, C = x.shape
    K = wt.shape[0]
    for t in range(T):
        o = out[t]
        for c in range(C):
            o[c] = 0.0
        for k in range(K):
            i = t + k - (K - 1)
            src = x[i] if i >= 0 else hist[K - 1 + i]
            w = wt[k]
            for c in range(C):
                o[c] += w[c] * src[c]
        for c in range(C):
            v = o[c]
            o[c] = v / (np.float32(1.0) + np.exp(-v))


@njit(cache=True, error_model="numpy")
def l2norm_heads(x, eps):
    """In place: x[t, h] *= 1 / sqrt(sum(x[t, h]^2) + eps) (float64 sum, sequential). x [T, H, d]."""
    T, H, d = x.shape
    for t in range(T):
        for h in range(H):
            s = 0.0
            for i in range(d):
                v = np.float64(x[t, h, i])
                s += v * v
            inv = np.float32(1.0 / math.sqrt(s + eps))
            for i in range(d):
                x[t, h, i] = x[t, h, i] * inv


@njit(cache=True, error_model="numpy")
def gdn_gates(alpha, b, dt_bias, a, g, beta):
    """g = a * softplus(alpha + dt_bias) (log decay, a = -exp(A_log) as stored), beta = sigmoid(b).
    alpha, b, g, beta [T, Hv]; dt_bias, a [Hv]. softplus(x) = x above 20, as torch's."""
    T, H = alpha.shape
    for t in range(T):
        for h in range(H):
            u = alpha[t, h] + dt_bias[h]
            sp = u if u > np.float32(20.0) else np.float32(math.log1p(math.exp(np.float64(u))))
            g[t, h] = a[h] * sp
            beta[t, h] = np.float32(1.0) / (np.float32(1.0) + np.exp(-b[t, h]))


# Below this many state elements x rows a window's recurrence runs on one thread: starting a parallel region
# costs more than the work (python -m guild.bench hybrid times both). Both run the same per-head code.
GDN_PARALLEL_MIN = 1 << 20


def gdn_recurrence(q, k, v, g, beta, kmap, scale, pool, src, dst, out):
    """Gated delta rule over T rows, state S [dk, dv] per value head, kept in `pool` [n_buf, Hv, dk, dv].

    Row 0 reads pool[src]; row t writes pool[dst[t]] and row t+1 reads it back. dst all equal (!= src): the
    state is updated in place and only the last survives (replay); dst distinct: a snapshot per row.
    q, k [T, Hk, dk] (L2-normalised), v [T, Hv, dv], g, beta [T, Hv]; kmap[h] = key head of value head h;
    out [T, Hv, dv], or 0 rows to skip the output (replaying kept rows at commit). Per row and head:
        S = exp(g) S;  delta = beta (v - S^T k);  S += k delta^T;  o = S^T (scale q)
    The S arithmetic is the same with or without output, so replayed states equal the window's bitwise.
    """
    T, Hv, dv = v.shape
    if Hv * q.shape[2] * dv * T >= GDN_PARALLEL_MIN:
        _gdn_parallel(q, k, v, g, beta, kmap, scale, pool, src, dst, out)
    else:
        _gdn_serial(q, k, v, g, beta, kmap, scale, pool, src, dst, out)


@njit(cache=True, parallel=True, error_model="numpy")
def _gdn_parallel(q, k, v, g, beta, kmap, scale, pool, src, dst, out):
    for h in prange(v.shape[1]):  # heads are independent: threads never split a reduction
        _gdn_head(h, q, k, v, g, beta, kmap, scale, pool, src, dst, out)


@njit(cache=True, error_model="numpy")
def _gdn_serial(q, k, v, g, beta, kmap, scale, pool, src, dst, out):
    for h in range(v.shape[1]):
        _gdn_head(h, q, k, v, g, beta, kmap, scale, pool, src, dst, out)


@njit(cache=True, error_model="numpy")
def _gdn_head(h, q, k, v, g, beta, kmap, scale, pool, src, dst, out):
    """All T rows of value head h (its S stays in cache across the rows)."""
    T = q.shape[0]
    dk = q.shape[2]
    dv = v.shape[2]
    want_out = out.shape[0] > 0
    kh = kmap[h]
    kv_mem = np.empty(dv, np.float32)
    qs = np.empty(dk, np.float32)
    for t in range(T):
        S0 = pool[src, h] if t == 0 else pool[dst[t - 1], h]
        S = pool[dst[t], h]
        eg = np.exp(g[t, h])
        bt = beta[t, h]
        kk = k[t, kh]
        for j in range(dv):
            kv_mem[j] = 0.0
        for i in range(dk):  # decay, and kv_mem[j] = sum_i S[i, j] k[i] (i ascending)
            ki = kk[i]
            s0 = S0[i]
            s = S[i]
            for j in range(dv):
                e = s0[j] * eg
                s[j] = e
                kv_mem[j] += e * ki
        vt = v[t, h]
        for j in range(dv):
            kv_mem[j] = (vt[j] - kv_mem[j]) * bt  # now delta
        if want_out:
            o = out[t, h]
            for i in range(dk):
                qs[i] = q[t, kh, i] * scale
            for j in range(dv):
                o[j] = 0.0
            for i in range(dk):  # S += k delta^T, and o[j] = sum_i S[i, j] q[i] (i ascending)
                ki = kk[i]
                qi = qs[i]
                s = S[i]
                for j in range(dv):
                    e = s[j] + ki * kv_mem[j]
                    s[j] = e
                    o[j] += e * qi
        else:
            for i in range(dk):
                ki = kk[i]
                s = S[i]
                for j in range(dv):
                    s[j] = s[j] + ki * kv_mem[j]


@njit(cache=True, error_model="numpy")
def gated_rmsnorm(x, z, w, eps, out):
    """out[t, h] = rmsnorm(x[t, h]) * w * silu(z[t, h]) per head (norm before gate). x, z, out [T, H, d]; w [d]."""
    T, H, d = x.shape
    for t in range(T):
        for h in range(H):
            s = 0.0
            for i in range(d):
                v = np.float64(x[t, h, i])
                s += v * v
            scale = np.float32(1.0 / math.sqrt(s / d + eps))
            for i in range(d):
                zi = z[t, h, i]
                out[t, h, i] = ((x[t, h, i] * scale) * w[i]) * (zi / (np.float32(1.0) + np.exp(-zi)))


@njit(cache=True, error_model="numpy")
def sigmoid_mul(x, gate, out):
    """out = x * sigmoid(gate), gate broadcast over x's columns when it has one column. x, out [R, D]."""
    R, D = x.shape
    G = gate.shape[1]
    for r in range(R):
        for i in range(D):
            gv = gate[r, i if G > 1 else 0]
            out[r, i] = x[r, i] * (np.float32(1.0) / (np.float32(1.0) + np.exp(-gv)))
