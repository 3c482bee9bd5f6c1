"""A decode row's or a verification window's every layer in one compiled call (kernels/cpu/decode_row.moe_layers /
dense_layers): the layers' matrices, norms and router as tables stacked by layer, built once per model.

The per-layer path (Llama.block: one compiled call per half) runs ~0.1 ms of Python a layer between the halves;
a step streams its weights through the caches and evicts the interpreter's working set, so that Python costs
10-20x its hot-loop time. Here the whole step's layers are one call, the same halves on the same values in the
same order: bitwise the per-layer path (tests/models/test_decode_step.py).
"""

from __future__ import annotations

import time

import numba
import numpy as np

from ..engine.backends import HOST
from ..engine.state import KVCache
from ..kernels.cpu.decode_row import dense_layers, moe_layers
from ..kernels.cpu.intrinsics import read_cycles
from ..kernels.cpu.moe import expert_tables
from ..kernels.cpu.ops.gqa import MARKS, row_mode, window_mode
from ..kernels.cpu.quant import GEMV_MAX_ROWS

_RATE: list[float] = []


def _cycles_per_s() -> float:
    """The cycle counter's rate (intrinsics.cycles), measured once against the wall clock over ~20 ms."""
    if not _RATE:
        c0, t0 = read_cycles(), time.perf_counter()
        while time.perf_counter() - t0 < 0.02:
            pass
        _RATE.append((read_cycles() - c0) / (time.perf_counter() - t0))
    return _RATE[0]


def _stack(arrays) -> np.ndarray:
    return np.ascontiguousarray(np.stack(arrays))


def _tables(ts: list) -> tuple:
    """LinearTables (one a layer) stacked: addr, dims, sg, col [L, P(+1), ...], each padded to the most parts
    with parts of no tiles (which linear_rows skips, sharing the first part's quantised input)."""
    P = max(len(t.addr) for t in ts)

    def pad(t):
        n = P - len(t.addr)
        return (np.concatenate([t.addr, np.repeat(t.addr[:1], n, 0)]),
                np.concatenate([t.dims, np.repeat([[0, t.dims[0, 1]]], n, 0)]),
                np.concatenate([t.sg, np.repeat(t.sg[:1], n)]), np.concatenate([t.col, np.repeat(t.col[-1:], n)]))

    return tuple(_stack(f) for f in zip(*(pad(t) for t in ts), strict=True))


class DecodeStep:
    """The stacked tables of a Llama-family model's layers (`ok`: all MoE or all dense, every matrix on the int8
    path, a float router and resident experts), for the layers list it was built from."""

    def __init__(self, model):
        self.layers = model.layers  # kept: the tables hold the addresses of its weights
        a = model.args
        Ls = self.layers
        self.ok = False
        if not Ls:
            return
        self.moe = Ls[0].moe
        tq, to = [getattr(L.qkv, "table", None) for L in Ls], [getattr(L.wo, "table", None) for L in Ls]
        if not all(t is not None and t.ok for t in tq + to) or any(L.moe != self.moe for L in Ls):
            return  # a device's matrices (DeviceLinear), another path, or MoE and dense layers mixed
        no_norm = np.zeros(0, np.float32)
        self.attn = (_stack([L.attn_norm for L in Ls]), *_tables(tq),
                     _stack([no_norm if L.q_norm is None else L.q_norm for L in Ls]),
                     _stack([no_norm if L.k_norm is None else L.k_norm for L in Ls]), *_tables(to))
        self.fnorm = _stack([L.ffn_norm for L in Ls])
        if self.moe:
            tabs = [expert_tables(L.router, L.experts_gu, L.experts_down) for L in Ls]
            if any(t is None for t in tabs) or len({(tg.addr.shape, td.addr.shape, tg.n_rows) for tg, td in tabs}) != 1:
                return
            r = [L.router for L in Ls]
            self.ffn = (_stack([w.addr for w in r]), _stack([w.dims for w in r]), _stack([w.perm for w in r]),
                        a.n_experts_used, a.norm_topk_prob, _stack([tg.addr for tg, _ in tabs]),
                        _stack([tg.dims for tg, _ in tabs]), _stack([td.addr for _, td in tabs]),
                        _stack([td.dims for _, td in tabs]), np.array([tg.sg for tg, _ in tabs], np.int64),
                        np.array([td.sg for _, td in tabs], np.int64), tabs[0][0].n_rows)
        else:
            tg, td = [L.gu.table for L in Ls], [L.down.table for L in Ls]
            if not all(t.ok for t in tg + td):
                return
            self.ffn = (*_tables(tg), *_tables(td))
        self.ok = True

    @classmethod
    def of(cls, model) -> DecodeStep:
        """The model's tables, rebuilt when its layers list is replaced."""
        st = getattr(model, "_decode_step", None)
        if st is None or st.layers is not model.layers:
            st = model._decode_step = cls(model)
        return st

    def run(self, model, x, w) -> bool:
        """Every layer over the window's rows x [T, D] (T <= GEMV_MAX_ROWS: a decode row or a verification window)
        in place, in one compiled call, where the window allows it (one host KV cache, every layer on the host, no
        expert cache); False, having done nothing, elsewhere. Records what the per-layer path would: the distinct
        experts, the rows an MTP head fuses (w.features)."""
        st = w.states[0]
        if not (self.ok and 1 <= x.shape[0] <= GEMV_MAX_ROWS and len(w.states) == 1 and type(st) is KVCache
                and x.flags.c_contiguous and w.experts is None and not any(be.device for be in w.layout.layer_be)):
            return False
        a = model.args
        T, H, Hkv, hd = x.shape[0], a.n_heads, a.n_kv_heads, a.head_dim
        an, qa, qd, qs, qc, qn, kn, oa, od, os, oc = self.attn
        K, V = st.kv_stacked()
        k0, v0 = st.kv_layer(0)
        cos, sin = w.rope[HOST.name]
        A = (an, qa, qd, qs, qc, H, Hkv, hd, qn, kn, w.positions_on(HOST), cos, sin, model.n_rot, a.rope_neox, K, V,
             w.pos0s[0], np.float32(1.0 / np.sqrt(hd)), MARKS[row_mode(H, hd, k0, v0)], MARKS[window_mode(v0)],
             w.scores, oa, od, os, oc)
        keep = np.full(len(self.layers), -1, np.int64)
        for i, li in enumerate(sorted(w.keep)):
            keep[li] = i
        feats = np.empty((len(w.keep), T, a.dim), np.float32)
        nth = numba.get_num_threads()
        t0 = time.perf_counter()
        if self.moe:
            c = moe_layers(x, a.norm_eps, A, self.fnorm, *self.ffn, keep, feats, w.distinct, nth)
        else:
            c = 0
            dense_layers(x, a.norm_eps, A, self.fnorm, *self.ffn, keep, feats, nth)
        if HOST.clock is not None:  # the op split timing reads: the experts apart, as the per-layer path clocks them
            total, e = time.perf_counter() - t0, c / _cycles_per_s()
            HOST.clock.add("experts", min(e, total))
            HOST.clock.add("decode_layers", max(total - e, 0.0))
        w.features = [(HOST, feats[i]) for i in range(len(w.keep))]
        return True
