"""Pass 1 of `guild optimize`: what machine is this (guild.plans.machine: the plan's hardware identity) and how fast
is its memory."""

from __future__ import annotations

import time

import numpy as np

from ..plans.machine import ISA_FLAGS, _cpuinfo, gpu_info, hardware_identity, numa_nodes

__all__ = ["ISA_FLAGS", "_cpuinfo", "gpu_info", "hardware_identity", "memory_bandwidth_gbs", "numa_nodes"]

def memory_bandwidth_gbs(mib: int = 128, repeats: int = 5) -> float:
    """Copy bandwidth of one thread (read + write bytes / s), best of `repeats`, arrays well beyond the caches."""
    n = mib * 2**20 // 8
    src = np.ones(n, np.float64)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # touch the pages first
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t0)
    return 2 * src.nbytes / best / 1e9
