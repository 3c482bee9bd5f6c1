"""Mixture-of-experts SwiGLU FFN over a window of T rows (CPU experts).

Route every row (softmax → top-k → optional renormalise), take the union of the selected experts, read each
expert's weights once and apply them to all the rows that chose it, then sum each row's experts in its own
top-k rank order (row invariance: a row's result does not depend on which other rows share the window).
Twin: guild.kernels.ref.moe_ffn.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from . import ops
from .quant import PackedMatrix, experts_matmul, matmul


def moe_ffn(
    h: np.ndarray,
    router: PackedMatrix,
    experts_gu: list[PackedMatrix],
    experts_down: list[PackedMatrix],
    k: int,
    renorm: bool,
    out: np.ndarray,
) -> int:
    """out [T, D] = MoE(h [T, D]). experts_gu[e]: fused [gate; up] [2F, D]; experts_down[e]: [D, F].
    Returns the number of distinct experts the window used."""
    T = h.shape[0]
    logits = np.empty((T, router.n_rows), np.float32)  # [T, E]
    matmul(router, h, logits)
    ids = np.empty((T, k), np.int64)
    w = np.empty((T, k), np.float32)
    ops.softmax_topk(logits, k, renorm, ids, w)
    return experts_ffn(h, ids, w, experts_gu, experts_down, out)


def experts_ffn(
    h: np.ndarray,
    ids: np.ndarray,
    w: np.ndarray,
    experts_gu: list[PackedMatrix],
    experts_down: list[PackedMatrix],
    out: np.ndarray,
) -> int:
    """The expert half of moe_ffn for rows already routed (ids, w [T, k], e.g. by the GPU router): out [T, D].
    Returns the number of distinct experts the window used."""
    T, D = h.shape
    k = ids.shape[1]
    order = np.empty(T * k, np.int64)
    offs = np.empty(len(experts_gu) + 1, np.int64)
    eids = np.empty(len(experts_gu), np.int64)
    x = np.empty((T * k, D), np.float32)
    n = route_groups(np.ascontiguousarray(ids, np.int64), h, order, offs, eids, x)
    offs, eids = offs[: n + 1], eids[:n]
    gu = np.empty((order.size, experts_gu[0].n_rows), np.float32)
    act = np.empty((order.size, gu.shape[1] // 2), np.float32)
    ye = np.empty((order.size, D), np.float32)
    # every expert of the window in one parallel region per matrix kind: gate|up, then down; experts served by an
    # expert cache (guild.engine.experts) run in batches of groups resident at once, read from its slots
    resident = getattr(experts_gu, "resident", None)
    batches = [(0, n, None, None)] if resident is None else resident.batches(eids, np.diff(offs))
    for g0, g1, addr_gu, addr_down in batches:
        s0, s1 = offs[g0], offs[g1]
        o = offs[g0 : g1 + 1] - s0
        experts_matmul(experts_gu, eids[g0:g1], o, x[s0:s1], gu[s0:s1], addr_gu)
        ops.swiglu(gu[s0:s1], act[s0:s1])
        experts_matmul(experts_down, eids[g0:g1], o, act[s0:s1], ye[s0:s1], addr_down)
    combine_groups(ye, order, w, out)
    return n


@njit(cache=True)
def route_groups(ids, h, order, offs, eids, x):
    """Group the (row, rank) pairs of ids [T, k] by expert: ascending expert id, pairs in row-major order within
    a group (a stable counting sort). Fills order (pair index t*k + r per slot), offs/eids (group g: slots
    offs[g]:offs[g+1] of expert eids[g]) and x (the pairs' rows of h, slot by slot); returns the group count."""
    T, k = ids.shape
    E = eids.shape[0]
    cnt = np.zeros(E, np.int64)
    for t in range(T):
        for r in range(k):
            e = ids[t, r]
            if e < 0 or e >= E:
                raise ValueError("route_groups: expert id out of range")
            cnt[e] += 1
    n = 0
    start = np.empty(E, np.int64)
    pos = 0
    for e in range(E):
        start[e] = pos
        if cnt[e]:
            offs[n] = pos
            eids[n] = e
            n += 1
        pos += cnt[e]
    offs[n] = pos
    for t in range(T):
        for r in range(k):
            e = ids[t, r]
            j = start[e]
            start[e] = j + 1
            order[j] = t * k + r
            for i in range(h.shape[1]):  # not x[j] = h[t]: a slice assignment compiles a shape-error path (~2 s)
                x[j, i] = h[t, i]
    return n


@njit(cache=True)
def combine_groups(ye, order, w, out):
    """out[t] = sum_r w[t, r] * (row t's rank-r expert output), summed in the row's own rank order, from the
    grouped outputs ye (slot j holds pair order[j]). Twin: ref.combine_experts."""
    T, k = w.shape
    D = out.shape[1]
    slot = np.empty(T * k, np.int64)
    for j in range(order.shape[0]):
        slot[order[j]] = j
    for t in range(T):
        y0 = ye[slot[t * k]]
        for i in range(D):
            out[t, i] = w[t, 0] * y0[i]
        for r in range(1, k):
            yr = ye[slot[t * k + r]]
            for i in range(D):
                out[t, i] += w[t, r] * yr[i]
