"""The first load's writer of a repack cache (guild/formats/repack_cache.py has the format): the GGUF read, its
matrices repacked and the packed arrays written, overlapped.

The model's loader asks for its matrices one by one (the pack hook). Each array's offset in the file follows
from the matrices before it alone (their packed layout: `quant.layout`), so the hook fixes the offsets at once
and hands the repack to a pool of threads (compiled packers that hold no GIL: kernels/cpu/qdot/packers.py; the
grid types' NumPy packing holds it between small operations), each of which hands the count of inf/NaN block
scales it read to the file's ScaleLedger (guild/formats/finite.py), writes its arrays at their offsets (pwrite)
and then releases the GGUF's pages under that matrix, mapped and cached. The bytes are those a serial writer
makes: the same arrays at the same offsets, and the alignment gaps, never written, read as zeros.

At most 2 matrices per thread are in flight, so memory stays near one matrix per thread whatever the model's
size. A worker's error stops the load at the next matrix; the caller's temporary file is then removed.

A model that will be read into memory anyway (resident.py) is kept instead: the workers pack straight into one
zeroed buffer laid out as the file's data section, the hook hands the loader views of it (the model of this pass
is the one returned, complete once `finish` returns), and `_Flusher` writes the buffer's packed prefix as it
grows, bypassing the page cache where the file system allows (O_DIRECT): no second copy, no read-back."""

from __future__ import annotations

import contextvars
import errno
import math
import os
import sys
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor

import numba
import numpy as np

from ..kernels.cpu import qdot
from ..kernels.cpu.quant import PackedMatrix, current_numerics, layout, numerics_for, pack_checked
from .cache_header import MAGIC

ALIGN = 64


def _pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    """All of `data` at `offset` (pwrite may write less than asked, e.g. past 2 GiB on Linux)."""
    while data:
        n = os.pwrite(fd, data, offset)
        data, offset = data[n:], offset + n


def _parts(raw) -> tuple:
    return tuple(raw) if isinstance(raw, (list, tuple)) else (raw,)


def place(pos: int, qtype, n_rows, n_cols, numerics: str) -> tuple[list, list, int]:
    """The offsets and sizes of a matrix's packed arrays when the data so far ends at pos, and the new end."""
    offsets, sizes = [], []
    for dt, shape in layout(int(qtype), int(n_rows), int(n_cols), numerics):
        pos += -pos % ALIGN
        offsets.append(pos)
        sizes.append(dt.itemsize * math.prod(shape))
        pos += sizes[-1]
    return offsets, sizes, pos


def packed_views(buf: np.ndarray, qtype, n_rows, n_cols, offsets, numerics: str) -> PackedMatrix:
    """A matrix over the arrays at `offsets` of buf (a cache file's data section, mapped, read or kept)."""
    lay = layout(int(qtype), int(n_rows), int(n_cols), numerics)
    return PackedMatrix.from_arrays(qtype, n_rows, n_cols, [buf[o : o + dt.itemsize * math.prod(sh)].view(dt)
                                                            .reshape(sh) for o, (dt, sh) in zip(offsets, lay,
                                                                                                 strict=True)],
                                    numerics=numerics)


def pack_into(qtype, raw, n_rows: int, n_cols: int, outs: tuple) -> tuple | None:
    """pack_checked's int8 path with `outs` (zeroed, qdot.layout's arrays) as its arrays: the compiled packers
    write there, not into arrays of their own (fresh memory, then copied). None where the type packs otherwise."""
    q = int(qtype)
    if numerics_for(q) != "i8" or q not in qdot.PACKERS:
        return None
    return pack_checked(q, raw, n_rows, n_cols, outs)[1]


class Recorder:
    """The pack hook of a first load, writing into the open file `fd` (MAGIC already there): repack on
    `threads` threads (default: the kernels' thread count, which -t sets), each matrix's arrays at offsets fixed
    in pack order. Returns no matrix: the model of this pass is discarded, the real one is built from the cache.
    With `keep` (a zeroed buffer as long as the data section, from a pass that packed nothing) and `path` (the
    file's): packs into keep, returns views of it, and writes it through a `_Flusher`.
    `matrices` and `pos` (the end of the data) are the header's; `finish()` waits for the last writes."""

    def __init__(self, fd: int, g, progress, threads: int | None = None, keep: np.ndarray | None = None,
                 path=None):
        self.fd, self.g, self.progress, self.keep = fd, g, progress, keep
        self.pos = len(MAGIC)
        self.matrices: list = []
        self.numerics = current_numerics()
        n = max(1, threads or numba.get_num_threads())
        self._pool = ThreadPoolExecutor(n, thread_name_prefix="guild-repack")
        self._slots = threading.BoundedSemaphore(2 * n)
        self._pending: deque = deque()
        self._lock = threading.Lock()
        self._flusher = None if keep is None else _Flusher(fd, path, keep)
        self._ends: list[int] = []  # each matrix's end in the file, in pack order
        self._done: set[int] = set()  # packed, past the first matrix not yet packed
        self._ready = 0  # matrices packed in pack order from the first

    def __call__(self, qtype, raw, n_rows, n_cols):
        self._reap(wait=False)  # a worker's error stops the load here, not after every matrix is packed
        offsets, sizes, self.pos = place(self.pos, qtype, n_rows, n_cols, self.numerics)
        out = None
        if self.keep is not None:
            if self.pos > self.keep.size:
                raise RuntimeError(f"the model packs past the {self.keep.size} bytes its first pass packed")
            out = packed_views(self.keep, qtype, n_rows, n_cols, offsets, self.numerics)
        self.matrices.append([int(qtype), int(n_rows), int(n_cols), offsets])
        self._ends.append(self.pos)
        self._slots.acquire()
        try:  # the worker runs in this context: the numerics mode is a context variable
            job = self._pool.submit(contextvars.copy_context().run, self._pack_write, len(self._ends) - 1, qtype,
                                    raw, n_rows, n_cols, offsets, sizes, out)
        except BaseException:
            self._slots.release()
            raise
        self._pending.append(job)
        return out

    def _pack_write(self, i, qtype, raw, n_rows, n_cols, offsets, sizes, out) -> None:
        try:
            parts = _parts(raw)
            bad = None if out is None else pack_into(qtype, raw, n_rows, n_cols, out.arrays)
            arrays = out.arrays if bad is not None else None
            if arrays is None:
                pm, bad = pack_checked(qtype, raw, n_rows, n_cols)
                arrays = pm.arrays
            if self.g.scale_ledger is not None:  # the scales checked as read, not by a pass of their own
                self.g.scale_ledger.packed(parts, bad)
            for j, (a, off, size) in enumerate(zip(arrays, offsets, sizes, strict=True)):
                if a.nbytes != size:  # the reader would refuse the file; say where it went wrong
                    raise RuntimeError(
                        f"repack of a {qtype}:{n_rows}x{n_cols} matrix made {a.nbytes} bytes, its layout {size}"
                    )
                if out is None:
                    _pwrite_all(self.fd, memoryview(np.ascontiguousarray(a)).cast("B"), off)
                elif out.arrays[j] is not a:
                    out.arrays[j][...] = a
            self.g.release(*parts, drop_cache=True)
            with self._lock:
                self.progress(sum(np.asarray(p).nbytes for p in parts))
                if self._flusher is not None:
                    self._done.add(i)
                    while self._ready in self._done:
                        self._done.remove(self._ready)
                        self._ready += 1
                    self._flusher.upto(self._ends[self._ready - 1] if self._ready else 0)
        finally:
            self._slots.release()

    def _reap(self, wait: bool) -> None:
        while self._pending and (wait or self._pending[0].done()):
            self._pending.popleft().result()
        if self._flusher is not None:
            self._flusher.check()

    def finish(self) -> None:
        """Wait for every matrix to be written; raises the first worker error."""
        self._reap(wait=True)
        if self._flusher is not None:
            self._flusher.finish(self.pos)

    def close(self) -> None:
        """Stop: queued matrices are dropped, running ones finish (they write into a file about to be removed)."""
        self._pool.shutdown(wait=True, cancel_futures=True)
        if self._flusher is not None:
            self._flusher.stop()


class _Flusher:
    """Writes a kept buffer into the file from its start, up to where the matrices before are all packed, on a
    thread of its own, in large blocks. Through O_DIRECT where the file system takes it: the disk reads the
    buffer itself, and the file's pages neither cost a copy nor crowd the page cache; else through `fd`."""

    BLOCK = 4096  # O_DIRECT's alignment of offsets and lengths (the buffer starts on a huge page)
    CHUNK = 32 << 20  # bytes a write waits for

    def __init__(self, fd: int, path, buf: np.ndarray):
        self.fd, self.buf, self.view = fd, buf, memoryview(buf)
        self.direct = None
        if hasattr(os, "O_DIRECT"):
            try:
                self.direct = os.open(path, os.O_WRONLY | os.O_DIRECT)
            except OSError:  # a file system without direct I/O (tmpfs): the buffered descriptor does
                pass
        self.ready = self.written = 0
        self.end: int | None = None  # set by finish: write it all
        self.error: BaseException | None = None
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="guild-repack-write", daemon=True)
        self._thread.start()

    def upto(self, n: int) -> None:
        with self._cond:
            self.ready = n
            if n - self.written >= self.CHUNK:
                self._cond.notify()

    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    while self.end is None and self.ready - self.written < self.CHUNK:
                        self._cond.wait()
                    end = self.end
                    upto = end if end is not None and end >= 0 else self.ready
                if end is not None and end < 0:
                    return
                self._write(self.written, upto - upto % self.BLOCK, self.direct)
                if end is not None:
                    self._write(self.written, end, None)
                    return
        except BaseException as e:  # raised by check() or finish() on the loader's thread
            self.error = e

    def _write(self, lo: int, hi: int, direct: int | None) -> None:
        while lo < hi:
            n = min(hi - lo, 64 << 20)
            try:
                _pwrite_all(self.fd if direct is None else direct, self.view[lo : lo + n], lo)
            except OSError as e:
                if direct is None or e.errno != errno.EINVAL:
                    raise
                self._close()  # O_DIRECT refused at write time: the buffered descriptor writes the rest
                direct = None
                continue
            lo = self.written = lo + n

    def check(self) -> None:
        if self.error is not None:
            raise self.error

    def finish(self, end: int) -> None:
        """Write the rest, up to `end`; raises the writer's error."""
        with self._cond:
            self.end = end
            self._cond.notify()
        self._thread.join()
        self._close()
        self.check()

    def stop(self) -> None:
        with self._cond:
            if self.end is None:
                self.end = -1
            self._cond.notify()
        self._thread.join()
        self._close()

    def _close(self) -> None:
        if self.direct is not None:
            os.close(self.direct)
            self.direct = None


class Progress:
    """Progress of a long load on stderr: a bar with the time left on a terminal, once the load has run ~2 s;
    elsewhere (a log, a pipe) one line at the end, if it ran that long."""

    DELAY_S = 2.0

    def __init__(self, enabled: bool, total: int, description: str):
        self.tty = sys.stderr.isatty()
        self.enabled = enabled and self.tty
        self.summary = enabled and not self.tty
        self.total, self.description = total, description
        self.done, self.t0, self.bar, self.task = 0, time.perf_counter(), None, None

    def __call__(self, nbytes: int) -> None:
        self.done += nbytes
        if not self.enabled:
            return
        if self.bar is None:
            if time.perf_counter() - self.t0 < self.DELAY_S:
                return
            from rich.console import Console  # deferred: only long loads on a terminal draw a bar
            from rich.progress import (
                BarColumn,
                DownloadColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
                TransferSpeedColumn,
            )

            self.bar = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                DownloadColumn(),
                TransferSpeedColumn(),
                TimeElapsedColumn(),
                TextColumn("left"),
                TimeRemainingColumn(),
                console=Console(stderr=True),
                transient=True,
            )
            self.bar.start()
            self.task = self.bar.add_task(self.description, total=self.total)
        self.bar.update(self.task, completed=min(self.done, self.total))

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
        dt = time.perf_counter() - self.t0
        if self.summary and dt >= self.DELAY_S and self.done:
            sys.stderr.write(
                f"{self.description}: {self.done / 1e9:.2f} GB in {dt:.1f} s ({self.done / dt / 1e9:.2f} GB/s)\n"
            )
