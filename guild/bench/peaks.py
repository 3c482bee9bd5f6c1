"""What this machine cannot beat: its copy and read bandwidths and its fp32 and int8 multiply-add peaks
(`machine_peaks`), and a window's lower bound from them (`window_bound`): the bytes it reads at the read
bandwidth, or its multiply-adds at the peak, whichever is longer."""

from __future__ import annotations

import time

import numpy as np
from numba import njit, prange

from ..kernels.cpu import simd


@njit(cache=True, parallel=True)
def _peak_fma(n, lanes):
    """n x 12 independent 16-lane fma per thread (registers only)."""
    tot = np.zeros(lanes.size, np.float32)
    for c in prange(lanes.size):
        m = simd.splat_f(np.float32(0.999999))
        k = simd.splat_f(np.float32(1e-7))
        a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = a8 = a9 = a10 = a11 = simd.splat_f(lanes[c])
        for _ in range(n):
            a0 = simd.fma_f(a0, m, k)
            a1 = simd.fma_f(a1, m, k)
            a2 = simd.fma_f(a2, m, k)
            a3 = simd.fma_f(a3, m, k)
            a4 = simd.fma_f(a4, m, k)
            a5 = simd.fma_f(a5, m, k)
            a6 = simd.fma_f(a6, m, k)
            a7 = simd.fma_f(a7, m, k)
            a8 = simd.fma_f(a8, m, k)
            a9 = simd.fma_f(a9, m, k)
            a10 = simd.fma_f(a10, m, k)
            a11 = simd.fma_f(a11, m, k)
        s = simd.add_f(simd.add_f(simd.add_f(a0, a1), simd.add_f(a2, a3)), simd.add_f(a4, a5))
        s = simd.add_f(simd.add_f(s, simd.add_f(a6, a7)), simd.add_f(simd.add_f(a8, a9), simd.add_f(a10, a11)))
        tot[c] = simd.lane(s, 0)
    return tot


@njit(cache=True, parallel=True)
def _peak_int8(n, lanes):
    """n x 8 independent dot8 (the int8 kernels' 4-byte dot pairs: 128 u8 x s8 products each) per thread; each
    chain's accumulator is also its signed operand, or the compiler folds the loop (an invariant product summed
    n times)."""
    tot = np.zeros(lanes.size, np.float32)
    for c in prange(lanes.size):
        u = simd.splat_i(0x01010101)
        a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = simd.splat_i(np.int64(lanes[c]))
        for _ in range(n):
            a0 = simd.dot8(a0, u, a0, u, a0)
            a1 = simd.dot8(a1, u, a1, u, a1)
            a2 = simd.dot8(a2, u, a2, u, a2)
            a3 = simd.dot8(a3, u, a3, u, a3)
            a4 = simd.dot8(a4, u, a4, u, a4)
            a5 = simd.dot8(a5, u, a5, u, a5)
            a6 = simd.dot8(a6, u, a6, u, a6)
            a7 = simd.dot8(a7, u, a7, u, a7)
        s = simd.add_i(simd.add_i(simd.add_i(a0, a1), simd.add_i(a2, a3)), simd.add_i(simd.add_i(a4, a5),
                                                                                  simd.add_i(a6, a7)))
        tot[c] = simd.lane(simd.cvt(s), 0)
    return tot


_READ_STREAMS = 4  # streams a thread reads in step: 4 read fastest here (1, 2 and 8 gave 77-98 %)
_READ_AHEAD = 1024  # prefetch distance in bytes (0 to 4 KiB within 5 %)


@njit(cache=True, parallel=True)
def _read(a, nth):
    """Every byte of `a` (a whole number of 4 KiB pages per thread) read once in 64-byte vectors, split over
    nth threads, each reading its share as _READ_STREAMS streams in step, prefetched _READ_AHEAD ahead: the
    decode kernels' pattern (the fields of a group's weights side by side). Returns a sum, so that it is read."""
    per = a.size // nth
    part = per // _READ_STREAMS
    tot = np.zeros(nth * 16, np.float32)  # a cache line a thread
    for c in prange(nth):
        p0 = a.ctypes.data + c * per
        acc0 = acc1 = simd.zero_i()
        for i in range(0, part, 128):
            for s in range(_READ_STREAMS):
                p = p0 + s * part + i
                simd.prefetch(p + _READ_AHEAD)
                simd.prefetch(p + _READ_AHEAD + 64)
                acc0 = simd.add_i(acc0, simd.ld_i32(p))
                acc1 = simd.add_i(acc1, simd.ld_i32(p + 64))
        tot[16 * c] = simd.lane(simd.cvt(simd.add_i(acc0, acc1)), 0)
    return tot.sum()


def machine_peaks(threads: int, repeats: int = 5) -> dict:
    """This machine with `threads` threads: copy bandwidth (STREAM's count: bytes read + written, GB/s, 256 MiB
    arrays, one thread), read bandwidth (`threads` threads reading 1 GiB as decode reads its weights: the bound
    of a memory-bound decode step), fp32 fma and int8 dot-product rates (G multiply-adds/s); best of `repeats`."""
    a = np.ones(64 << 20, np.float32)
    b = np.empty_like(a)
    r = np.ones(1 << 30, np.uint8)
    lanes = np.ones(threads, np.float32)
    _peak_fma(10, lanes)
    _peak_int8(10, lanes)
    _read(r[: threads << 16], threads)
    bw, rd, f, i = [], [], [], []
    n = 2_000_000
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(b, a)
        t1 = time.perf_counter()
        _peak_fma(n, lanes)
        t2 = time.perf_counter()
        _peak_int8(n, lanes)
        t3 = time.perf_counter()
        _read(r, threads)
        t4 = time.perf_counter()
        bw.append(2 * a.nbytes / (t1 - t0) / 1e9)
        f.append(threads * n * 12 * 16 / (t2 - t1) / 1e9)
        i.append(threads * n * 8 * 128 / (t3 - t2) / 1e9)
        rd.append(r.nbytes / (t4 - t3) / 1e9)
    return {"copy_gbs": max(bw), "read_gbs": max(rd), "fp32_gmacs": max(f), "int8_gmacs": max(i),
            "threads": threads}


def window_bound(model, ctx: int, distinct: dict, peaks: dict) -> dict:
    """Lower bound (ms) on a window of T rows at context ctx: max(the window's distinct weight and KV bytes at
    the read bandwidth, its multiply-adds at the peak rate of each matrix's numerics). `distinct`: mean distinct
    experts per MoE layer for each T (window_costs)."""
    from ..calib.cpu import model_matrices

    a = model.args
    mats = model_matrices(model)
    shared = [m for _, m, e in mats if not e]
    experts = [m for _, m, e in mats if e]
    n_moe = max(1, a.n_layers)
    n_exp = max(1, a.n_experts) if experts else 1
    exp_bytes = sum(m.nbytes for m in experts) / (n_moe * n_exp) if experts else 0.0  # one expert of one layer
    exp_macs = sum(m.n_rows * m.n_cols for m in experts) / (n_moe * n_exp) if experts else 0.0
    exp_i8 = bool(experts) and experts[0].numerics == "i8"
    kv = 2 * a.n_layers * a.n_kv_heads * a.head_dim * ctx * 4  # fp32 K and V, read once per window
    att_macs = 2 * a.n_layers * a.n_heads * a.head_dim * ctx  # per row
    rate = {"i8": peaks["int8_gmacs"] * 1e9, "f32": peaks["fp32_gmacs"] * 1e9}
    out = {}
    for T, d in distinct.items():
        byts = sum(m.nbytes for m in shared) + (d * exp_bytes * n_moe if experts else 0) + kv
        t_mac = T * (sum(m.n_rows * m.n_cols / rate[m.numerics] for m in shared)
                     + a.n_experts_used * n_moe * exp_macs / rate["i8" if exp_i8 else "f32"]
                     + att_macs / rate["f32"])
        t_mem = byts / (peaks["read_gbs"] * 1e9)
        out[T] = {"mem_ms": t_mem * 1e3, "mac_ms": t_mac * 1e3, "bound_ms": max(t_mem, t_mac) * 1e3}
    return out
