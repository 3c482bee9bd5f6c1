"""Pass 1 of `guild optimize`: what machine is this (the plan's hardware identity) and how fast is its memory.

Linux sources: /proc/cpuinfo (model name, flags, physical/core ids), /sys/devices/system/node (NUMA nodes).
The GPU comes from CuPy when it is importable and sees a device; otherwise the machine has none (never an error).
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import numpy as np

from ..plan import GpuInfo, HardwareIdentity

# ISA flags that decide which kernels a plan's timings came from (as /proc/cpuinfo spells them)
ISA_FLAGS = ("avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
             "avx512_fp16", "avx_vnni", "amx_tile", "amx_int8", "amx_bf16")


def _cpuinfo(text: str) -> tuple[str, tuple[str, ...], int, int]:
    """(model name, ISA flags, physical cores, logical CPUs) from /proc/cpuinfo text."""
    model, flags, cores, logical = "", set(), set(), 0
    phys = core = None
    for line in text.splitlines() + [""]:
        key, _, val = (s.strip() for s in line.partition(":"))
        if key == "processor":
            logical += 1
        elif key == "model name" and not model:
            model = val
        elif key == "flags" and not flags:
            flags = set(val.split())
        elif key == "physical id":
            phys = val
        elif key == "core id":
            core = val
        elif not line.strip():  # end of one processor's block
            if core is not None:
                cores.add((phys, core))
            phys = core = None
    isa = tuple(sorted(f for f in ISA_FLAGS if f in flags))
    return model, isa, len(cores) or logical, logical


def numa_nodes(root: str | Path = "/sys/devices/system/node") -> int:
    try:
        return max(1, sum(1 for p in Path(root).iterdir() if re.fullmatch(r"node\d+", p.name)))
    except OSError:
        return 1


def gpu_info() -> GpuInfo | None:
    """The first CUDA device CuPy sees, or None (CuPy missing, no driver, no device)."""
    try:
        import cupy
    except Exception:  # ImportError, or a broken CUDA install failing at import
        return None
    try:
        rt = cupy.cuda.runtime
        if rt.getDeviceCount() < 1:
            return None
        p = rt.getDeviceProperties(0)
        name = p["name"].decode() if isinstance(p["name"], bytes) else str(p["name"])
        return GpuInfo(name, f"{p['major']}.{p['minor']}", int(p["totalGlobalMem"]))
    except Exception:
        return None


def hardware_identity(cpuinfo_path: str = "/proc/cpuinfo") -> HardwareIdentity:
    """This machine's identity as a plan records it (cheap: no measurement)."""
    try:
        text = Path(cpuinfo_path).read_text(errors="replace")
    except OSError:
        text = ""
    model, isa, cores, logical = _cpuinfo(text)
    logical = logical or os.cpu_count() or 1
    import platform

    return HardwareIdentity(model or platform.processor() or platform.machine(), isa, max(1, min(cores, logical)),
                            logical, numa_nodes(), gpu_info())


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
