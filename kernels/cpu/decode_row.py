"""A decode step's layer in two compiled calls: the attention half (RMSNorm, the fused q|k|v product, QK-norm,
RoPE, the KV cache's row written in its stored type, attention, the output projection added to the residual) and
a dense layer's FFN half (moe.moe_half is a MoE layer's); and every layer of the step in one call (moe_layers,
dense_layers over tables stacked by layer, guild/models/decode_step.py).

Each step is the kernel the composed path (the model's block over HostBackend ops) calls, in the same order on
the same values, so the row is bitwise what that path gives it; only the Python between the calls goes (the
worker threads wait while the main thread runs Python). Plain glue, not itself parallel, over the compiled
parallel launchers. Numba emits again the machine code of everything a top-level function calls, so the halves
are inlined (Numba IR) into the whole-step loops: compiled as callees too, they cost a cold start ~6 s more
(docs/running.md).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .moe import moe_half
from .ops import rmsnorm, rmsnorm_heads, rope, swiglu
from .ops.gqa import attend_row
from .ops.kv import layer_operand, put_key_row, put_value_row
from .quant import linear_rows


@njit(cache=True, inline="always")
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


@njit(cache=True, inline="always")
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


# A whole decode step's layers in one call: the Python between two layers' halves (~0.1 ms a layer in a step that
# streams its weights through the caches, ~10-20x its cost in a hot loop) goes too. A is attention_half's per-layer
# operands stacked by layer (guild.models.decode_step); keep[li] >= 0: the slot of feats [n, D] that takes the
# layer's output row (the rows an MTP head fuses).
@njit(cache=True, inline="always")
def _attention_layer(x, li, A, eps, nth):
    an, qa, qd, qs, qc, H, Hkv, hd, qn, kn, positions, cos, sin, n_rot, neox, K, V, pos0, scale, mark, scores, oa, \
        od, os, oc = A
    attention_half(x, an[li], eps, qa[li], qd[li], qs[li], qc[li], H, Hkv, hd, qn[li], kn[li], positions, cos, sin,
                   n_rot, neox, layer_operand(K, li), layer_operand(V, li), pos0, scale, mark, scores, oa[li], od[li],
                   os[li], oc[li], nth)


@njit(cache=True, inline="always")
def _keep(x, li, keep, feats):
    if keep[li] >= 0:
        for i in range(x.shape[1]):
            feats[keep[li], i] = x[0, i]


@njit(cache=True)
def moe_layers(x, eps, A, fnorm, ra, rdims, perm, k, renorm, gu_addr, gu_dims, dn_addr, dn_dims, sg_gu, sg_dn, F2,
               keep, feats, nth):
    """Every MoE layer of a decode row x [1, D] in place: attention_half then moe.moe_half, layer after layer,
    the router and experts tables stacked by layer (ra [L, 7], gu_addr [L, E, 7], ...)."""
    for li in range(fnorm.shape[0]):
        _attention_layer(x, li, A, eps, nth)
        moe_half(x, fnorm[li], eps, ra[li], rdims[li], perm[li], k, renorm, gu_addr[li], gu_dims[li], dn_addr[li],
                 dn_dims[li], sg_gu[li], sg_dn[li], F2, nth)
        _keep(x, li, keep, feats)


@njit(cache=True)
def dense_layers(x, eps, A, fnorm, ga, gd, gs, gc, da, dd, ds, dc, keep, feats, nth):
    """Every dense layer of a decode row x [1, D] in place: attention_half then ffn_half, layer after layer, the
    FFN's LinearTable arrays stacked by layer."""
    for li in range(fnorm.shape[0]):
        _attention_layer(x, li, A, eps, nth)
        ffn_half(x, fnorm[li], eps, ga[li], gd[li], gs[li], gc[li], da[li], dd[li], ds[li], dc[li], nth)
        _keep(x, li, keep, feats)
