"""What memory this process may take: the system's available memory lowered by its cgroups' limits, and the
budget an `auto` setting (the expert cache's) spends of it."""

from __future__ import annotations

import os
from pathlib import Path

AUTO_HEADROOM = 0.25  # share of the available memory `auto` leaves to the rest of the process and the system


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
