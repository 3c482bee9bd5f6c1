"""What memory this process may take: the system's available memory lowered by its cgroups' limits, and the
budget an `auto` setting (the expert cache's) spends of it."""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

AUTO_HEADROOM = 0.25  # share of the available memory `auto` leaves to the rest of the process and the system
# glibc's mallopt parameters and the values guild sets (keep_freed_blocks)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_HEAP_KEEP = 1 << 30


def budget() -> int:
    """Bytes an `auto` setting may spend: the available memory less AUTO_HEADROOM."""
    return int(available_memory() * (1 - AUTO_HEADROOM))


def available_memory() -> int:
    """Bytes this process may still take: the system's MemAvailable, lowered by a cgroup (v2) memory limit less
    what the group's processes hold besides reclaimable page cache."""
    avail = _meminfo("MemAvailable")
    for limit, used in _cgroup_limits():
        avail = min(avail, max(0, limit - used))
    return avail


def _meminfo(key: str) -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def _cgroup_limits():
    """(memory.max, memory.current less file pages) of this process's cgroup and each of its ancestors."""
    try:
        rel = next(line.split(":", 2)[2].strip() for line in open("/proc/self/cgroup") if line.startswith("0::"))
    except (OSError, StopIteration):
        return
    d = Path("/sys/fs/cgroup") / rel.lstrip("/")
    root = Path("/sys/fs/cgroup")
    while True:
        try:
            mx = (d / "memory.max").read_text().strip()
            if mx != "max":
                cur = int((d / "memory.current").read_text())
                stat = dict(line.split() for line in (d / "memory.stat").read_text().splitlines())
                yield int(mx), cur - int(stat.get("file", 0))
        except (OSError, ValueError):
            pass
        if d == root or d.parent == d:
            return
        d = d.parent


def keep_freed_blocks() -> bool:
    """Serve the forward's large scratch arrays (activations, expert rows, scores: tens of MB a chunk) from the
    heap, reused chunk after chunk, instead of fresh pages. glibc maps every block over M_MMAP_THRESHOLD (at
    most 32 MiB) anew and unmaps it on free, so each prefill chunk faulted its scratch in again: 3,600-5,100
    minor faults and 9-13 % of the routed experts' time per MoE layer of a 512-row chunk (12-layer Qwen3-30B-A3B
    slice). Blocks up to 1 GiB now come from the heap and the heap is not trimmed below 1 GiB: the process keeps
    its peak scratch resident, as an engine that allocates its compute buffers once does. Only where the C
    library is glibc; returns whether both settings took."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, _HEAP_KEEP)) and bool(libc.mallopt(_M_TRIM_THRESHOLD, _HEAP_KEEP))
    except (OSError, AttributeError):  # not glibc
        return False
