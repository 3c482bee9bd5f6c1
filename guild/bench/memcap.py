"""Less memory than a model: a memory cgroup of our own (a child of this process's, cgroup v2 or v1, no systemd
needed) that caps what a process holds, page cache included, and a file's pages dropped from the page cache so a
run reads it from disk."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path


def drop_pages(path) -> None:
    """Ask the kernel to drop a file's pages from the page cache (clean pages go; what a process maps stays)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _own_cgroup(controller: str) -> str | None:
    """This process's cgroup path in the v1 hierarchy of `controller`, or in the v2 one for ''."""
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, names, path = line.rstrip("\n").split(":", 2)
            if (controller and controller in names.split(",")) or (not controller and names == ""):
                return path
    return None


def make_cap(mem: int, name: str) -> Path | None:
    """A child of this process's memory cgroup limited to `mem` bytes, page cache included (cgroup v2's
    memory.max or v1's memory.limit_in_bytes), or None where none can be made (no rights, no controller)."""
    name = f"guild-bench-{name}-{os.getpid()}"
    for root, controller, limit in (("/sys/fs/cgroup", "", "memory.max"),
                                    ("/sys/fs/cgroup/unified", "", "memory.max"),
                                    ("/sys/fs/cgroup/memory", "memory", "memory.limit_in_bytes")):
        own = _own_cgroup(controller)
        if own is None or not Path(root).is_dir():
            continue
        d = Path(root) / own.lstrip("/") / name
        try:
            d.mkdir()
        except OSError:
            continue
        try:
            if (d / limit).is_file():  # the kernel made the controller's files: a cgroup, not a plain directory
                (d / limit).write_text(str(mem))
                return d
        except OSError:
            pass
        d.rmdir()
    return None


def can_cap() -> bool:
    """Whether this process may make a cap."""
    cap = make_cap(1 << 30, "probe")
    if cap is not None:
        cap.rmdir()
    return cap is not None


def cap_figures(cap: Path | None) -> dict:
    """cap_peak_mb: the most the cap's processes held at once, page cache included; {} where the kernel does not
    say (or uncapped)."""
    for f in ("memory.peak", "memory.max_usage_in_bytes"):
        if cap is not None and (cap / f).is_file():
            return {"cap_peak_mb": int((cap / f).read_text()) / 2**20}
    return {}


def cap_stat(cap: Path) -> dict[str, int]:
    """The cap's reclaim counters (v2 or v1 memory.stat): page faults, scans, steals, refaults."""
    if not (cap / "memory.stat").is_file():
        return {}
    stat = dict(line.split() for line in (cap / "memory.stat").read_text().splitlines())
    return {k: int(stat[k]) for k in ("pgmajfault", "pgscan", "pgsteal", "workingset_refault_file",
                                      "total_pgmajfault", "total_pgpgin", "total_pgpgout") if k in stat}


@contextmanager
def capped(mem: int | None, name: str, files: Sequence = ()) -> Iterator[Path | None]:
    """This process in a fresh cap of `mem` bytes for the block (None: uncapped, as where none can be made), the
    files' pages dropped once it is in: what it allocates or reads from then on is charged to the cap. Leaving
    moves it back to the cap's parent (what it still holds is charged there) and removes the cap."""
    cap = None if mem is None else make_cap(mem, name)
    try:
        if cap is not None:
            (cap / "cgroup.procs").write_text(str(os.getpid()))
        for f in files:
            drop_pages(f)
        yield cap
    finally:
        if cap is not None:
            (cap.parent / "cgroup.procs").write_text(str(os.getpid()))
            cap.rmdir()
