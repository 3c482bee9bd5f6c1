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

from .intrinsics import cycles
from .moe import moe_half
from .ops import rmsnorm, rmsnorm_heads, rope, swiglu
from .ops.gqa import attend_row
from .ops.kv import layer_operand, put_key_row, put_value_row
from .quant import linear_rows


@njit(cache=True, inline="always")
def attention_half(x, nw, eps, qa, qd, qs, qc, H, Hkv, hd, qn, kn, positions, cos, sin, n_rot, neox, kt, vc, pos0,
                   scale, mark, wmark, scores, oa, od, os, oc, nth):
    """x [T, D] += wo · attention(rope(qk_norm(q|k|v · rmsnorm(x, nw)))) at positions pos0.., the rows' keys and
    values written into kt, vc (a layer's stored operands, KVCache.kv_layer). (qa, qd, qs, qc) and (oa, od, os,
    oc): the q|k|v and output matrices' LinearTable arrays; qn, kn: the QK-norm weights (empty: none); mark, wmark:
    the attention kernels attention_kv would take for one row and for a window (ops.gqa.MARKS[row_mode(...)],
    MARKS[window_mode(...)]: compiled per kernel, only those two are compiled in); scores: scratch [>= T H,
    >= pos0 + T]."""
    T, D = x.shape
    h = np.empty((T, D), np.float32)
    rmsnorm(x, nw, eps, h)
    qkv = np.empty((T, qc[-1]), np.float32)
    linear_rows(h, qa, qd, qs, qc, qkv, nth)
    q = np.empty((T, H, hd), np.float32)
    k = np.empty((T, Hkv, hd), np.float32)
    v = np.empty((T, Hkv, hd), np.float32)
    for t in range(T):  # element by element: a slice assignment compiles a shape-error path
        for i in range(H * hd):
            q[t, i // hd, i % hd] = qkv[t, i]
        for i in range(Hkv * hd):
            k[t, i // hd, i % hd] = qkv[t, H * hd + i]
            v[t, i // hd, i % hd] = qkv[t, (H + Hkv) * hd + i]
    if qn.shape[0]:
        rmsnorm_heads(q, qn, eps)
        rmsnorm_heads(k, kn, eps)
    rope(q, positions, cos, sin, n_rot, neox)
    rope(k, positions, cos, sin, n_rot, neox)
    for t in range(T):  # every row stored before any attends (the composed path's write, then attention)
        put_key_row(kt, k[t], pos0 + t)
        put_value_row(vc, v[t], pos0 + t)
    att = np.empty((T, H, hd), np.float32)
    if T == 1:
        attend_row(mark, q, kt, vc, pos0, scale, att, scores)
    else:
        attend_row(wmark, q, kt, vc, pos0, scale, att, scores)
    y = np.empty((T, D), np.float32)
    linear_rows(att.reshape(T, H * hd), oa, od, os, oc, y, nth)
    for t in range(T):  # the composed path's accumulate: x += a temporary
        for i in range(D):
            x[t, i] += y[t, i]


@njit(cache=True, inline="always")
def ffn_half(x, norm, eps, ga, gd, gs, gc, da, dd, ds, dc, nth):
    """x [T, D] += down · swiglu(gate|up · rmsnorm(x, norm)): a dense layer's FFN half for a window's rows, as the
    composed ops do it. (ga, gd, gs, gc), (da, dd, ds, dc): the gate|up and down matrices' LinearTable arrays."""
    T, D = x.shape
    h = np.empty((T, D), np.float32)
    rmsnorm(x, norm, eps, h)
    gu = np.empty((T, gc[-1]), np.float32)
    linear_rows(h, ga, gd, gs, gc, gu, nth)
    act = np.empty((T, gc[-1] // 2), np.float32)
    swiglu(gu, act)
    y = np.empty((T, D), np.float32)
    linear_rows(act, da, dd, ds, dc, y, nth)
    for t in range(T):
        for i in range(D):
            x[t, i] += y[t, i]


# A whole window's layers in one call (a decode row, or a verification window of up to GEMV_MAX_ROWS rows): the
# Python between two layers' halves (~0.1 ms a layer in a step that streams its weights through the caches,
# ~10-20x its cost in a hot loop) goes too. A is attention_half's per-layer operands stacked by layer
# (guild.models.decode_step); keep[li] >= 0: the slot of feats [n, T, D] that takes the layer's output rows (the
# rows an MTP head fuses).
@njit(cache=True, inline="always")
def _attention_layer(x, li, A, eps, nth):
    an, qa, qd, qs, qc, H, Hkv, hd, qn, kn, positions, cos, sin, n_rot, neox, K, V, pos0, scale, mark, wmark, \
        scores, oa, od, os, oc = A
    attention_half(x, an[li], eps, qa[li], qd[li], qs[li], qc[li], H, Hkv, hd, qn[li], kn[li], positions, cos, sin,
                   n_rot, neox, layer_operand(K, li), layer_operand(V, li), pos0, scale, mark, wmark, scores, oa[li],
                   od[li], os[li], oc[li], nth)


@njit(cache=True, inline="always")
def _keep(x, li, keep, feats):
    if keep[li] >= 0:
        for t in range(x.shape[0]):
            for i in range(x.shape[1]):
                feats[keep[li], t, i] = x[t, i]


@njit(cache=True)
def moe_layers(x, eps, A, fnorm, ra, rdims, perm, k, renorm, gu_addr, gu_dims, dn_addr, dn_dims, sg_gu, sg_dn, F2,
               keep, feats, distinct, nth):
    """Every MoE layer of a window's rows x [T, D] in place: attention_half then moe.moe_half, layer after layer,
    the router and experts tables stacked by layer (ra [L, 7], gu_addr [L, E, 7], ...); distinct [L]: each
    layer's distinct experts. Returns the cycles (intrinsics.cycles) spent in the MoE halves (the clock's
    "experts", which calibration prices apart)."""
    c = 0
    for li in range(fnorm.shape[0]):
        _attention_layer(x, li, A, eps, nth)
        c0 = cycles()
        distinct[li] = moe_half(x, fnorm[li], eps, ra[li], rdims[li], perm[li], k, renorm, gu_addr[li], gu_dims[li],
                                dn_addr[li], dn_dims[li], sg_gu[li], sg_dn[li], F2, nth)
        c += cycles() - c0
        _keep(x, li, keep, feats)
    return c


@njit(cache=True)
def dense_layers(x, eps, A, fnorm, ga, gd, gs, gc, da, dd, ds, dc, keep, feats, nth):
    """Every dense layer of a window's rows x [T, D] in place: attention_half then ffn_half, layer after layer, the
    FFN's LinearTable arrays stacked by layer."""
    for li in range(fnorm.shape[0]):
        _attention_layer(x, li, A, eps, nth)
        ffn_half(x, fnorm[li], eps, ga[li], gd[li], gs[li], gc[li], da[li], dd[li], ds[li], dc[li], nth)
        _keep(x, li, keep, feats)
