"""Mixture-of-experts SwiGLU FFN over a window of T rows (CPU experts).

Route every row (softmax → top-k → optional renormalise), take the union of the selected experts, read each
expert's weights once and apply them to all the rows that chose it, then sum each row's experts in its own
top-k rank order (row invariance: a row's result does not depend on which other rows share the window).
Twin: guild.kernels.ref.moe_ffn.
"""

from __future__ import annotations

import numpy as np
from numba import get_num_threads, njit, prange

from . import ops
from .intrinsics import _call_kernel, fetch_add
from .ops import softmax_topk, swiglu
from .qdot import ACT_EXTRA, QB, quantize_acts, quantize_groups
from .quant import ExpertTable, PackedMatrix, _launch, _launch_experts, _launch_one, experts_matmul, matmul


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
    if T == 1 and h.dtype == np.float32 and h.flags.c_contiguous:
        # a decode step: router, top-k and the experts in one compiled call (the same kernels, the same bits)
        nth = get_num_threads()
        tables = row_tables(router, experts_gu, experts_down, k, nth)
        if tables is not None:
            tg, td = tables
            _moe_row(h, router.addr, router.dims, router.perm, k, renorm, tg.addr,
                     tg.dims, td.addr, td.dims, tg.sg, td.sg, tg.n_rows, out, nth)
            return k
    logits = np.empty((T, router.n_rows), np.float32)  # [T, E]
    matmul(router, h, logits)
    ids = np.empty((T, k), np.int64)
    w = np.empty((T, k), np.float32)
    ops.softmax_topk(logits, k, renorm, ids, w)
    return experts_ffn(h, ids, w, experts_gu, experts_down, out)


def expert_tables(router: PackedMatrix, experts_gu, experts_down):
    """The (gate|up, down) ExpertTables where _moe_row can run a layer: a float router, experts resident (not an
    expert cache's) and on the int8 path. Else None."""
    if router.numerics == "i8" or getattr(experts_gu, "resident", None) is not None:
        return None
    tg, td = ExpertTable.of(experts_gu), ExpertTable.of(experts_down)
    return (tg, td) if tg.ok and td.ok else None


def row_tables(router: PackedMatrix, experts_gu, experts_down, k: int, nth: int):
    """expert_tables where a decode row's k groups also split over nth threads (its experts in one region)."""
    return expert_tables(router, experts_gu, experts_down) if _owned_fits(k, nth) else None


def moe_residual_row(x: np.ndarray, norm: np.ndarray, eps: float, router: PackedMatrix, experts_gu, experts_down,
                     k: int, renorm: bool) -> bool:
    """x [1, D] += moe_ffn(rmsnorm(x, norm)) in one compiled call (moe_half), where row_tables allows; False,
    having done nothing, elsewhere."""
    nth = get_num_threads()
    tables = row_tables(router, experts_gu, experts_down, k, nth)
    if tables is None or not x.flags.c_contiguous:
        return False
    tg, td = tables
    moe_half(x, norm, eps, router.addr, router.dims, router.perm, k, renorm, tg.addr,
             tg.dims, td.addr, td.dims, tg.sg, td.sg, tg.n_rows, nth)
    return True


@njit(cache=True, inline="always")
def moe_half(x, norm, eps, ra, rdims, perm, k, renorm, gu_addr, gu_dims, dn_addr, dn_dims, sg_gu, sg_dn, F2, nth):
    """The MoE half of a window's layer over x [T, D]: rmsnorm, _moe_row, the residual add, as the composed ops do
    them. Returns the distinct experts."""
    T, D = x.shape
    h = np.empty((T, D), np.float32)
    ops.rmsnorm(x, norm, eps, h)
    out = np.empty((T, D), np.float32)
    n = _moe_row(h, ra, rdims, perm, k, renorm, gu_addr, gu_dims, dn_addr, dn_dims, sg_gu, sg_dn, F2, out, nth)
    for t in range(T):  # the composed path's x += ffn
        for i in range(D):
            x[t, i] += out[t, i]
    return n


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
    if resident is None:
        tg, td = ExpertTable.of(experts_gu), ExpertTable.of(experts_down)
        if tg.ok and td.ok and _experts_owned(tg.addr, tg.dims, td.addr, td.dims, eids, offs, x, tg.sg, td.sg, gu,
                                              act, ye, order, w, out, get_num_threads()):
            return n
    batches = [(0, n, None, None)] if resident is None else resident.batches(eids, np.diff(offs))
    for g0, g1, addr_gu, addr_down in batches:
        s0, s1 = offs[g0], offs[g1]
        o = offs[g0 : g1 + 1] - s0
        experts_matmul(experts_gu, eids[g0:g1], o, x[s0:s1], gu[s0:s1], addr_gu)
        ops.swiglu(gu[s0:s1], act[s0:s1])
        experts_matmul(experts_down, eids[g0:g1], o, act[s0:s1], ye[s0:s1], addr_down)
    combine_groups(ye, order, w, out)
    return n


@njit(parallel=True, cache=True)
def _experts_owned(gu_addr, gu_dims, dn_addr, dn_dims, eids, offs, x, sg_gu, sg_dn, gu, act, ye, order, w, out,
                   nth):
    """experts_matmul (gate|up), SwiGLU, experts_matmul (down) and combine_groups in one parallel region where each
    of the nth threads can own whole groups, taken on demand (where the groups split evenly, or eight or more a
    thread): no barrier and no Python between the two products. Each row's arithmetic is theirs, so the bits are
    the same. Returns False, having done nothing, where the groups would not split evenly enough."""
    if not _owned_fits(eids.shape[0], nth):
        return False
    _owned(gu_addr, gu_dims, dn_addr, dn_dims, eids, offs, x, sg_gu, sg_dn, gu, act, ye, nth)
    combine_groups(ye, order, w, out)
    return True


@njit(cache=True)
def _owned_fits(G, nth):
    """Whether G groups split well enough over nth threads for _owned: evenly, or eight or more a thread (the
    one left over then costs a thread at most an eighth of its share)."""
    return G % nth == 0 or G >= 8 * nth


@njit(cache=True)
def _moe_row(h, ra, rdims, perm, k, renorm, gu_addr, gu_dims, dn_addr, dn_dims, sg_gu, sg_dn, F2, out, nth):
    """moe_ffn of a window's rows h [T, D] (a decode step: T = 1) in one call from Python, as moe_ffn and
    experts_ffn run it: the router as matmul's float path runs it (quant._launch_one / _launch), softmax_topk,
    route_groups, then _experts_owned where the groups split well over the nth threads, else experts_matmul's two
    launches, SwiGLU and combine_groups: the same bits. Returns the distinct experts. Not itself parallel: it
    calls the compiled parallel launchers, so a cold start compiles only this glue."""
    T, D = h.shape
    E = gu_addr.shape[0]
    R = T * k
    logits = np.empty((T, E), np.float32)
    xp = np.empty((T, perm.shape[0]), np.float32)
    if rdims[0] == 1:  # one tile: on this thread
        _launch_one(ra, rdims, perm, h, xp, logits)
    else:
        _launch(ra, rdims, perm, h, xp, logits, nth)
    ids = np.empty((T, k), np.int64)
    w = np.empty((T, k), np.float32)
    softmax_topk(logits, k, renorm, ids, w)
    order = np.empty(R, np.int64)
    offs = np.empty(E + 1, np.int64)
    eids = np.empty(E, np.int64)
    x = np.empty((R, D), np.float32)
    n = route_groups(ids, h, order, offs, eids, x)
    gu = np.empty((R, F2), np.float32)
    act = np.empty((R, F2 // 2), np.float32)
    ye = np.empty((R, D), np.float32)
    if not _experts_owned(gu_addr, gu_dims, dn_addr, dn_dims, eids[:n], offs[: n + 1], x, sg_gu, sg_dn, gu, act, ye,
                          order, w, out, nth):
        xb = np.empty(R * (-(-D // QB)) * (QB + ACT_EXTRA), np.uint8)  # qdot.act_bytes(R, D)
        quantize_groups(x, offs[: n + 1], xb, sg_gu)
        _launch_experts(gu_addr, gu_dims, eids[:n], offs[: n + 1], xb, gu, nth)
        swiglu(gu, act)
        ab = np.empty(R * (-(-(F2 // 2) // QB)) * (QB + ACT_EXTRA), np.uint8)
        quantize_groups(act, offs[: n + 1], ab, sg_dn)
        _launch_experts(dn_addr, dn_dims, eids[:n], offs[: n + 1], ab, ye, nth)
        combine_groups(ye, order, w, out)
    return n


@njit(cache=True, inline="always")
def _owned(gu_addr, gu_dims, dn_addr, dn_dims, eids, offs, x, sg_gu, sg_dn, gu, act, ye, nth):
    """Each group's rows quantised, gate|up, SwiGLU, quantised, down, all on the thread that takes the group."""
    G = eids.shape[0]
    R, D = x.shape
    F2 = gu.shape[1]
    F = act.shape[1]
    px = -(-D // QB) * (QB + ACT_EXTRA)  # qdot.act_bytes of one row
    pa = -(-F // QB) * (QB + ACT_EXTRA)
    xbuf = np.empty(R * px, np.uint8)
    abuf = np.empty(R * pa, np.uint8)
    ctr = np.empty(1, np.int64)  # np.zeros would be a parallel loop of its own here
    ctr[0] = 0
    for _ in prange(nth):
        g = fetch_add(ctr.ctypes.data, 1)  # the next group nobody has taken (a slower thread takes fewer)
        while g < G:
            a, b = offs[g], offs[g + 1]
            e = eids[g]
            quantize_acts(x[a:b], xbuf[a * px : b * px], sg_gu)
            nt, nb = gu_dims[e, 0], gu_dims[e, 1]
            _call_kernel(gu_addr[e, 0], gu_addr[e, 1], gu_addr[e, 2], gu_addr[e, 3], gu_addr[e, 4], gu_addr[e, 5],
                         gu_addr[e, 6], nt, nb, xbuf.ctypes.data + a * px, b - a, nb * QB, 0, nt,
                         gu.ctypes.data + 4 * a * F2, F2)
            swiglu(gu[a:b], act[a:b])
            quantize_acts(act[a:b], abuf[a * pa : b * pa], sg_dn)
            nt, nb = dn_dims[e, 0], dn_dims[e, 1]
            _call_kernel(dn_addr[e, 0], dn_addr[e, 1], dn_addr[e, 2], dn_addr[e, 3], dn_addr[e, 4], dn_addr[e, 5],
                         dn_addr[e, 6], nt, nb, abuf.ctypes.data + a * pa, b - a, nb * QB, 0, nt,
                         ye.ctypes.data + 4 * a * D, D)
            g = fetch_add(ctr.ctypes.data, 1)


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
