"""A decode step's layer in two compiled calls: the attention half (RMSNorm, the fused q|k|v product, QK-norm,
RoPE, the KV cache's row written in its stored type, attention, the output projection added to the residual) and
a dense layer's FFN half (moe.moe_half is a MoE layer's).

Each step is the kernel the composed path (the model's block over HostBackend ops) calls, in the same order on
the same values, so the row is bitwise what that path gives it; only the Python between the ~12 calls goes (a
decode step runs this once a layer, and the worker threads wait while the main thread runs Python). Plain glue,
not itself parallel, over the compiled parallel launchers; Numba links what a function calls into its code, so a
cold start pays ~3-4 s for these two halves on top of the kernels they call (docs/running.md).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .ops import rmsnorm, rmsnorm_heads, rope, swiglu
from .ops.gqa import attend_row
from .ops.kv import put_key_row, put_value_row
from .quant import linear_rows


@njit(cache=True)
def attention_half(x, nw, eps, qa, qd, qs, qc, H, Hkv, hd, qn, kn, positions, cos, sin, n_rot, neox, kt, vc, pos0,
                   scale, mark, scores, oa, od, os, oc, nth):
    """x [1, D] += wo · attention(rope(qk_norm(q|k|v · rmsnorm(x, nw)))) at position pos0, the row's key and value
    written into kt, vc (a layer's stored operands, KVCache.kv_layer). (qa, qd, qs, qc) and (oa, od, os, oc):
    the q|k|v and output matrices' LinearTable arrays; qn, kn: the QK-norm weights (empty: none); mark: the
    attention kernel attention_kv would take (ops.gqa.MARKS[row_mode(...)]: compiled per kernel, only the one taken
    is compiled in); scores: scratch [>= H, >= pos0 + 1]."""
    D = x.shape[1]
    h = np.empty((1, D), np.float32)
    rmsnorm(x, nw, eps, h)
    qkv = np.empty((1, qc[-1]), np.float32)
    linear_rows(h, qa, qd, qs, qc, qkv, nth)
    q = np.empty((1, H, hd), np.float32)
    k = np.empty((1, Hkv, hd), np.float32)
    v = np.empty((1, Hkv, hd), np.float32)
    for i in range(H * hd):  # element by element: a slice assignment compiles a shape-error path
        q[0, i // hd, i % hd] = qkv[0, i]
    for i in range(Hkv * hd):
        k[0, i // hd, i % hd] = qkv[0, H * hd + i]
        v[0, i // hd, i % hd] = qkv[0, (H + Hkv) * hd + i]
    if qn.shape[0]:
        rmsnorm_heads(q, qn, eps)
        rmsnorm_heads(k, kn, eps)
    rope(q, positions, cos, sin, n_rot, neox)
    rope(k, positions, cos, sin, n_rot, neox)
    put_key_row(kt, k[0], pos0)
    put_value_row(vc, v[0], pos0)
    att = np.empty((1, H, hd), np.float32)
    attend_row(mark, q, kt, vc, pos0, scale, att, scores)
    y = np.empty((1, D), np.float32)
    linear_rows(att.reshape(1, H * hd), oa, od, os, oc, y, nth)
    for i in range(D):  # the composed path's accumulate: x += a temporary
        x[0, i] += y[0, i]


@njit(cache=True)
def ffn_half(x, norm, eps, ga, gd, gs, gc, da, dd, ds, dc, nth):
    """x [1, D] += down · swiglu(gate|up · rmsnorm(x, norm)): a dense layer's FFN half for one decode row, as the
    composed ops do it. (ga, gd, gs, gc), (da, dd, ds, dc): the gate|up and down matrices' LinearTable arrays."""
    D = x.shape[1]
    h = np.empty((1, D), np.float32)
    rmsnorm(x, norm, eps, h)
    gu = np.empty((1, gc[-1]), np.float32)
    linear_rows(h, ga, gd, gs, gc, gu, nth)
    act = np.empty((1, gc[-1] // 2), np.float32)
    swiglu(gu, act)
    y = np.empty((1, D), np.float32)
    linear_rows(act, da, dd, ds, dc, y, nth)
    for i in range(D):
        x[0, i] += y[0, i]
