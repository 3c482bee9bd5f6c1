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
size. A worker's error stops the load at the next matrix; the caller's temporary file is then removed."""

from __future__ import annotations

import contextvars
import math
import os
import sys
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor

import numba
import numpy as np

from ..kernels.cpu.quant import current_numerics, layout, pack_checked
from .cache_header import MAGIC

ALIGN = 64


def _pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    """All of `data` at `offset` (pwrite may write less than asked, e.g. past 2 GiB on Linux)."""
    while data:
        n = os.pwrite(fd, data, offset)
        data, offset = data[n:], offset + n


def _parts(raw) -> tuple:
    return tuple(raw) if isinstance(raw, (list, tuple)) else (raw,)


class Recorder:
    """The pack hook of a first load, writing into the open file `fd` (MAGIC already there): repack on
    `threads` threads (default: the kernels' thread count, which -t sets), each matrix's arrays at offsets fixed
    in pack order. Returns no matrix: the model of this pass is discarded, the real one is built from the cache.
    `matrices` and `pos` (the end of the data) are the header's; `finish()` waits for the last writes."""

    def __init__(self, fd: int, g, progress, threads: int | None = None):
        self.fd, self.g, self.progress = fd, g, progress
        self.pos = len(MAGIC)
        self.matrices: list = []
        self.numerics = current_numerics()
        n = max(1, threads or numba.get_num_threads())
        self._pool = ThreadPoolExecutor(n, thread_name_prefix="guild-repack")
        self._slots = threading.BoundedSemaphore(2 * n)
        self._pending: deque = deque()
        self._lock = threading.Lock()

    def __call__(self, qtype, raw, n_rows, n_cols):
        self._reap(wait=False)  # a worker's error stops the load here, not after every matrix is packed
        offsets, sizes = [], []
        for dt, shape in layout(int(qtype), int(n_rows), int(n_cols), self.numerics):
            self.pos += -self.pos % ALIGN
            offsets.append(self.pos)
            sizes.append(dt.itemsize * math.prod(shape))
            self.pos += sizes[-1]
        self.matrices.append([int(qtype), int(n_rows), int(n_cols), offsets])
        self._slots.acquire()
        try:  # the worker runs in this context: the numerics mode is a context variable
            job = self._pool.submit(
                contextvars.copy_context().run, self._pack_write, qtype, raw, n_rows, n_cols, offsets, sizes
            )
        except BaseException:
            self._slots.release()
            raise
        self._pending.append(job)
        return None

    def _pack_write(self, qtype, raw, n_rows, n_cols, offsets, sizes) -> None:
        try:
            pm, bad = pack_checked(qtype, raw, n_rows, n_cols)
            parts = _parts(raw)
            if self.g.scale_ledger is not None:  # the scales checked as read, not by a pass of their own
                self.g.scale_ledger.packed(parts, bad)
            for a, off, size in zip(pm.arrays, offsets, sizes, strict=True):
                if a.nbytes != size:  # the reader would refuse the file; say where it went wrong
                    raise RuntimeError(
                        f"repack of a {qtype}:{n_rows}x{n_cols} matrix made {a.nbytes} bytes, its layout {size}"
                    )
                _pwrite_all(self.fd, memoryview(np.ascontiguousarray(a)).cast("B"), off)
            self.g.release(*parts, drop_cache=True)
            with self._lock:
                self.progress(sum(np.asarray(p).nbytes for p in parts))
        finally:
            self._slots.release()

    def _reap(self, wait: bool) -> None:
        while self._pending and (wait or self._pending[0].done()):
            self._pending.popleft().result()

    def finish(self) -> None:
        """Wait for every matrix to be written; raises the first worker error."""
        self._reap(wait=True)

    def close(self) -> None:
        """Stop: queued matrices are dropped, running ones finish (they write into a file about to be removed)."""
        self._pool.shutdown(wait=True, cancel_futures=True)


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
