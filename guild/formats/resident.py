"""Weights read into the process's own memory instead of mapped from the repack cache file (llama.cpp's
--no-mmap, ik_llama.cpp's run-time repack).

Decode reads every active weight once per token, so its speed is the rate at which memory streams those bytes.
Mapped pages of a file stream slower than the process's own anonymous memory, and much slower than anonymous
memory on 2 MiB pages: on a 2-core AVX-512 Xeon VM a vectorised read ran at 18 GB/s over the mapped cache file,
22.5 over anonymous 4 KiB pages and 27.5 over transparent huge pages, and decode of the 12-layer Qwen3-30B-A3B
slice went from 27.6-33.7 to 39.1 tok/s (docs/benchmarks.md). The cost: the weights are read once at load (about
a second per 5 GB from the page cache) and held as resident memory, not as file pages the kernel may drop.

So a load reads the cache file into an anonymous, 2 MiB-aligned region advised for huge pages when it fits in
the memory budget (the expert cache's rule: the available memory less a quarter), and maps it otherwise, or
when `--mmap` / GUILD_MMAP=1 asks for mapping. A model whose experts are streamed by the expert cache is mapped.
"""

from __future__ import annotations

import mmap
import os
import weakref
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..errors import BadFlagError

ENV = "GUILD_MMAP"
HUGE = 2 << 20  # a transparent huge page (x86-64, arm64 with 4 KiB base pages)
_CHUNK = 64 << 20  # bytes per read call
_FLAG: list[bool | None] = [None]  # this process's --mmap, over the environment
# what a process has read, by file identity: loads of the same file share one copy while any model holds it, as
# mapped loads share the page cache (tests, benchmarks and the server load one model many times)
_SHARED: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def set_mmap(on: bool | None) -> None:
    """--mmap for this process's loads (None: the environment's GUILD_MMAP decides)."""
    _FLAG[0] = on


def mmap_forced() -> bool:
    """Whether loads map the cache file whatever the memory: --mmap, else GUILD_MMAP (0/1, yes/no)."""
    if _FLAG[0] is not None:
        return _FLAG[0]
    v = os.environ.get(ENV, "").strip().lower()
    if v in ("", "0", "no", "off", "false"):
        return False
    if v in ("1", "yes", "on", "true"):
        return True
    raise BadFlagError(f"{ENV} must be 0 or 1, not {v!r}")


def wanted(nbytes: int) -> bool:
    """Whether weights of nbytes are read into memory: not --mmap and within the memory budget."""
    from ..engine import memory  # deferred: the budget reads /proc at call time only

    return not mmap_forced() and nbytes <= memory.budget()


def anonymous(nbytes: int) -> np.ndarray:
    """A zeroed uint8 array of nbytes in private anonymous memory starting on a 2 MiB boundary, advised for
    transparent huge pages where the platform has them (else plain pages: the same bytes)."""
    m = mmap.mmap(-1, nbytes + HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            m.madvise(mmap.MADV_HUGEPAGE)
        except OSError:  # THP compiled out: plain pages
            pass
    a0 = (-np.frombuffer(m, np.uint8, count=1).ctypes.data) % HUGE
    # an array straight over the mapping (its base), not a slice of one: its first byte is byte 0 of what is read
    # into it, as for a mapped file (the expert cache reckons file offsets from the root array's address)
    return np.frombuffer(m, np.uint8, count=nbytes, offset=a0)


def read_file(fd: int, nbytes: int, threads: int | None = None) -> np.ndarray:
    """The first nbytes of an open file, read into `anonymous` memory by a few threads (os.preadv releases the
    GIL). OSError on a read error or a file shorter than nbytes."""
    buf = anonymous(nbytes)
    view = memoryview(buf)

    def part(off: int) -> None:
        end = min(nbytes, off + _CHUNK)
        while off < end:
            n = os.preadv(fd, [view[off:end]], off)
            if n <= 0:
                raise OSError(f"file ends at {off} bytes, {nbytes} expected")
            off += n

    workers = threads or min(4, os.cpu_count() or 1)
    with ThreadPoolExecutor(workers, thread_name_prefix="guild-read") as ex:
        for f in [ex.submit(part, o) for o in range(0, nbytes, _CHUNK)]:
            f.result()
    return buf


def _key(st: os.stat_result, nbytes: int) -> tuple:
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, nbytes


def read_shared(fd: int, nbytes: int) -> np.ndarray:
    """`read_file`, or the copy this process already holds of the same file (device, inode, size, mtime) and
    length while a model still uses it."""
    key = _key(os.fstat(fd), nbytes)
    buf = _SHARED.get(key)
    if buf is None:
        buf = _SHARED[key] = read_file(fd, nbytes)
    return buf


def remember(path, buf: np.ndarray) -> None:
    """buf holds the first buf.size bytes of the file at path (it was written from it): `read_shared` gives it."""
    _SHARED[_key(os.stat(path), buf.size)] = buf
