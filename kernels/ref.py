"""Plain-NumPy twins of every kernel: the oracle the fast kernels are tested against.

Written for clarity, in float64 where it matters; no Numba here.
"""

from __future__ import annotations

import numpy as np

from .ref_quant import dequantize, matmul_ref, quantize_act_q8  # noqa: F401  (quantized-matrix twins)


def rmsnorm(x, w, eps):
    x = np.asarray(x, np.float64)
    return (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w).astype(np.float32)


def rope(x, positions, cos, sin, n_rot, neox):
    """Returns a rotated copy of x [T, H, hd]."""
    x = np.array(x, np.float64)
    half = n_rot // 2
    c = cos[positions][:, None, :].astype(np.float64)
    s = sin[positions][:, None, :].astype(np.float64)
    if neox:
        a, b = x[..., :half].copy(), x[..., half:n_rot].copy()
        x[..., :half], x[..., half:n_rot] = a * c - b * s, a * s + b * c
    else:
        a, b = x[..., 0:n_rot:2].copy(), x[..., 1:n_rot:2].copy()
        x[..., 0:n_rot:2], x[..., 1:n_rot:2] = a * c - b * s, a * s + b * c
    return x.astype(np.float32)


def attention(q, k, v, pos0, scale):
    """Causal GQA attention. q [T, H, hd]; k, v [ctx_used, Hkv, hd] (all positions up to pos0+T-1)."""
    T, H, hd = q.shape
    group = H // k.shape[1]
    out = np.zeros((T, H, hd), np.float64)
    for t in range(T):
        L = pos0 + t + 1
        for h in range(H):
            g = h // group
            s = (k[:L, g, :].astype(np.float64) @ q[t, h].astype(np.float64)) * scale
            p = np.exp(s - s.max())
            p /= p.sum()
            out[t, h] = p @ v[:L, g, :].astype(np.float64)
    return out.astype(np.float32)


def kv_quantize_q8_0(x):
    """Rows x [..., hd] → (int8 quants [..., hd], f16 scales [..., hd/32]): Q8_0's rule (d = max|x| / 127,
    q = rint(x * (1 / d)) in float32), the scale stored as f16. Twin of kernels/cpu/ops.kv_quantize_q8_0."""
    x = np.asarray(x, np.float32)
    xb = x.reshape(*x.shape[:-1], x.shape[-1] // 32, 32)
    d = (np.abs(xb).max(-1) / np.float32(127.0)).astype(np.float32)
    inv = np.zeros_like(d)
    np.divide(np.float32(1.0), d, out=inv, where=d > 0)
    q = np.rint(xb * inv[..., None]).astype(np.int8).reshape(x.shape)
    return q, d.astype(np.float16)


def _untile(a):
    """Key tiles [Hkv, n, hd, T] -> [Hkv, hd, n * T]."""
    return a.transpose(0, 2, 1, 3).reshape(a.shape[0], a.shape[2], -1)


def kv_values(stored, transposed: bool):
    """A cache layer's stored keys (transposed: tiles [Hkv, ctx/T, hd, T] of T positions, kernels/cpu/ops.KV_TILE)
    or values ([Hkv, ctx, hd]) as float64 [ctx, Hkv, hd]: float32, f16 bits (uint16) or a q8_0 (quants, scale
    bits) pair (kernels/cpu/ops/kv.py)."""
    if transposed:  # tiles -> [Hkv, hd, ctx] (scales: [Hkv, hd/32, ctx])
        stored = tuple(map(_untile, stored)) if isinstance(stored, tuple) else _untile(stored)
    if isinstance(stored, tuple):
        qs, bits = stored
        d = bits.view(np.float16).astype(np.float64)
        if transposed:  # scales [Hkv, hd/32, ctx]: one per 32 dimensions of each position
            x = qs.astype(np.float64) * np.repeat(d, 32, axis=1)
        else:
            x = qs.astype(np.float64) * np.repeat(d, 32, axis=2)
    else:
        x = (stored.view(np.float16) if stored.dtype == np.uint16 else stored).astype(np.float64)
    return x.transpose(2, 0, 1) if transposed else x.transpose(1, 0, 2)


def attention_kv(q, k, v, pos0, scale):
    """Twin of kernels/cpu/ops.attention_kv: attention over the stored keys and values, dequantised exactly."""
    return attention(q, kv_values(k, True), kv_values(v, False), pos0, scale)


def silu_mul(g, u):
    g = np.asarray(g, np.float64)
    return (g / (1.0 + np.exp(-g)) * u).astype(np.float32)


def softmax_topk(logits, k, renorm):
    """Router twin: softmax → top-k (ties to the lower id) → optional renormalise. Returns (ids, weights)."""
    x = np.asarray(logits, np.float64)
    p = np.exp(x - x.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    ids = np.argsort(-p, axis=-1, kind="stable")[:, :k]
    w = np.take_along_axis(p, ids, -1)
    if renorm:
        w = w / w.sum(-1, keepdims=True)
    return ids, w.astype(np.float32)


def moe_ffn(h, router, gate, up, down, k, renorm, acts=None):
    """Mixture-of-experts SwiGLU FFN. h [T, D]; router [E, D]; gate/up [E, F, D]; down [E, D, F] (float).
    acts: (gate|up's, down's) activation blocks, the experts' inputs quantised as the int8 path does
    (quantize_act_q8); the router's never are."""
    ids, w = softmax_topk(h.astype(np.float64) @ router.T.astype(np.float64), k, renorm)
    out = np.zeros(h.shape, np.float64)
    for t in range(h.shape[0]):
        x = quantize_act_q8(h[t : t + 1], acts[0])[0] if acts else h[t]
        for r in range(k):
            e = ids[t, r]
            a = silu_mul(gate[e] @ x, up[e] @ x)
            if acts:
                a = quantize_act_q8(a[None], acts[1])[0]
            out[t] += w[t, r] * (down[e].astype(np.float64) @ np.asarray(a, np.float64))
    return out.astype(np.float32)


def swiglu(gu):
    F = gu.shape[1] // 2
    return silu_mul(gu[:, :F], gu[:, F:])


def combine_experts(y, w):
    return np.einsum("tk,tkd->td", w.astype(np.float64), y.astype(np.float64)).astype(np.float32)


def exp_shifted(x, m):
    return np.exp(np.asarray(x, np.float64) - m).astype(np.float32)


# =========================================================================================================
# Gated DeltaNet (qwen3next / qwen35moe) twins of guild.kernels.cpu.deltanet, float64 inside.
# =========================================================================================================
def conv1d_silu(x, hist, wt):
    """x [T, C] window inputs, hist [K-1, C] inputs before the window, wt [K, C] → silu(causal conv) [T, C]."""
    K = wt.shape[0]
    src = np.concatenate([np.asarray(hist, np.float64), np.asarray(x, np.float64)])  # [K-1+T, C]
    T = x.shape[0]
    y = np.stack([(src[t : t + K] * wt).sum(0) for t in range(T)]) if T else np.zeros((0, x.shape[1]))
    return (y / (1.0 + np.exp(-y))).astype(np.float32)


def l2norm_heads(x, eps):
    x = np.asarray(x, np.float64)
    return (x / np.sqrt((x * x).sum(-1, keepdims=True) + eps)).astype(np.float32)


def gdn_gates(alpha, b, dt_bias, a):
    u = np.asarray(alpha, np.float64) + dt_bias
    sp = np.where(u > 20.0, u, np.log1p(np.exp(np.minimum(u, 20.0))))
    g = a * sp
    beta = 1.0 / (1.0 + np.exp(-np.asarray(b, np.float64)))
    return g.astype(np.float32), beta.astype(np.float32)


def gdn_recurrence(q, k, v, g, beta, kmap, scale, S):
    """torch_recurrent_gated_delta_rule: returns (out [T, Hv, dv], final S [Hv, dk, dv]) from S [Hv, dk, dv]."""
    S = np.array(S, np.float64)
    q = np.asarray(q, np.float64)[:, kmap] * scale  # [T, Hv, dk]
    k = np.asarray(k, np.float64)[:, kmap]
    v = np.asarray(v, np.float64)
    out = np.zeros(v.shape)
    for t in range(q.shape[0]):
        S = S * np.exp(np.float64(g[t]))[:, None, None]
        kv_mem = np.einsum("hij,hi->hj", S, k[t])
        delta = (v[t] - kv_mem) * np.float64(beta[t])[:, None]
        S = S + k[t][:, :, None] * delta[:, None, :]
        out[t] = np.einsum("hij,hi->hj", S, q[t])
    return out.astype(np.float32), S


def gated_rmsnorm(x, z, w, eps):
    x, z = np.asarray(x, np.float64), np.asarray(z, np.float64)
    y = x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w
    return (y * z / (1.0 + np.exp(-z))).astype(np.float32)


def sigmoid_mul(x, gate):
    return (np.asarray(x, np.float64) / (1.0 + np.exp(-np.asarray(gate, np.float64)))).astype(np.float32)
