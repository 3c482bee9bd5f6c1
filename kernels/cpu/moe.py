"""Mixture-of-experts SwiGLU FFN over a window of T rows (CPU experts).

Route every row (softmax → top-k → optional renormalise), take the union of the selected experts, read each
expert's weights once and apply them to all the rows that chose it, then sum each row's experts in its own
top-k rank order (row invariance: a row's result does not depend on which other rows share the window).
Twin: guild.kernels.ref.moe_ffn.
"""

from __future__ import annotations

import numpy as np

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
    flat = ids.ravel()  # (row, rank) pairs, row-major
    order = np.argsort(flat, kind="stable")  # grouped by expert, rows ascending within a group
    starts = np.flatnonzero(np.r_[True, flat[order[1:]] != flat[order[:-1]]])
    offs = np.append(starts, order.size)  # group g: pairs order[offs[g]:offs[g+1]]
    eids = flat[order[starts]]
    rows, ranks = order // k, order % k
    # every expert of the window in one parallel region per matrix kind: gate|up, then down
    gu = np.empty((order.size, experts_gu[0].n_rows), np.float32)
    experts_matmul(experts_gu, eids, offs, h[rows], gu)
    act = np.empty((order.size, gu.shape[1] // 2), np.float32)
    ops.swiglu(gu, act)
    ye = np.empty((order.size, D), np.float32)
    experts_matmul(experts_down, eids, offs, act, ye)
    y = np.empty((T, k, D), np.float32)  # each (row, rank) expert output
    y[rows, ranks] = ye
    ops.combine_experts(y, w, out)
    return int(eids.size)
