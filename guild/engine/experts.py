"""A bounded expert cache: a MoE model's routed experts read from guild's repack cache file into a fixed set of
memory slots as the router asks for them, for models larger than the memory they may use.

The unit is one layer's expert: its fused gate|up matrix and its down matrix, two contiguous byte ranges of the file
(a matrix's packed arrays are written one after the other, 64-byte aligned). A slot holds one expert, each range at
its offset within a page in the file, the arrays at the same relative offsets, so the kernels read it through an
address table exactly as they read the mapped file (kernels/cpu/quant.experts_matmul's `addr`): the bytes are the
file's, the experts that run are the router's, and the logits are bitwise those of the mapped model.

A miss reads the two ranges' pages with `os.preadv` on an O_DIRECT descriptor straight into the slot: no page cache
copy, nothing for a memory cgroup to reclaim (where the file system refuses O_DIRECT, the reads go through the page
cache and POSIX_FADV_DONTNEED drops them), so memory holds one copy of an expert, inside the bound. Eviction is LRFU
(Lee et al., 2001: each slot's score decays by half every `n_slots` requests and gains 1 per use), which keeps
experts that many tokens use while letting a burst of one-off experts pass through. A window whose union of experts
exceeds the free slots runs its experts in batches that fit (each group's result does not depend on the others).

Prefetch: when a window's rows enter a MoE layer, the layer's own router is applied to the rows as they are
before attention (its input norm, then the router: the "pre-gating" of Eliseev & Mazur, 2023, "Fast Inference of
Mixture-of-Experts Language Models with Offloading"); the experts of each row's PREFETCH_RANKS first predicted
ranks, the first row's first, are read by background threads while attention runs (pread releases the GIL). A
wrong guess costs a read, never a result.
"""

from __future__ import annotations

import mmap
import os
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from ..errors import BadFlagError, GuildError
from ..kernels.cpu import ops
from ..kernels.cpu.quant import ExpertList, ExpertTable, PackedMatrix, matmul
from . import memory

PAGE = mmap.PAGESIZE
IO_THREADS = 4  # reads in flight at once: an SSD serves several in parallel
HISTORY_DECAY = 0.98  # per routed row: the router's history the cold-expert estimate reads spans ~50 rows
UNION_DECAY = 0.99  # per window: the measured growth of a window's union of experts with its rows
# the router's ranks whose experts the pre-gating reads ahead: on the 128-expert upcycle, ranks 1-4 predicted
# before attention were used 97-85% of the time, ranks 5-8 78-47%; a wrong guess costs the disk a whole expert
PREFETCH_RANKS = 4

# the process default (the CLI's --expert-cache-mem, guild.cli.options): "auto", "off" or a size in bytes
_DEFAULT: list = ["auto"]


def set_default(setting: str | int) -> None:
    """The setting loads use when they are given none (the CLI's --expert-cache-mem)."""
    _DEFAULT[0] = setting


def default() -> str | int:
    return _DEFAULT[0]


_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b)?", re.IGNORECASE)


def expert_cache_mem(text: str) -> str | int:
    """--expert-cache-mem: "auto", "off" or bytes (binary suffixes: 3G = 3 GiB)."""
    t = str(text).strip().lower()
    if t in ("auto", "off"):
        return t
    m = _SIZE.fullmatch(t)
    if m is None or (m.group(3) == "ib" and not m.group(2)):
        raise BadFlagError(f"--expert-cache-mem must be auto, off or a size such as 3G or 512MiB, got {text!r}")
    n = int(float(m.group(1)) * (1 << (10 * " kmgt".index(m.group(2) or " "))))
    if n < 1:
        raise BadFlagError(f"--expert-cache-mem must be a positive size, got {text!r}")
    return n


def wanted(setting: str | int, model_bytes: int) -> bool:
    """Whether a model of model_bytes streams its experts under `setting`: a size always, `auto` when the
    model does not fit in the memory budget (memory.budget)."""
    if setting == "off":
        return False
    if setting == "auto":
        return model_bytes > memory.budget()
    return True


def wait_passively() -> bool:
    """Have the kernels' OpenMP threads sleep as soon as they wait (GOMP_SPINCOUNT=0) unless the environment
    says otherwise; True when in effect. libgomp's default spin (milliseconds) burns, while a token waits on the
    disk, the cores the I/O threads need. libgomp reads it once, when Numba starts its threads."""
    from numba.np.ufunc import parallel

    if not parallel._is_initialized:
        os.environ.setdefault("GOMP_SPINCOUNT", "0")
    return os.environ.get("GOMP_SPINCOUNT") == "0"


# -- the model's experts -----------------------------------------------------------------------------------
def _moe_parts(blk):
    """(the object holding experts_gu/experts_down/router, the FFN's input norm) of a block, or None."""
    if isinstance(blk, tuple):  # hybrid: ((attn_norm, post_attention_norm), mixer, moe)
        return blk[2], blk[0][1]
    if getattr(blk, "moe", False):
        return blk, blk.ffn_norm
    return None


def _root(a: np.ndarray) -> np.ndarray:
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


@dataclass(frozen=True)
class _Kind:
    """One matrix kind (gate|up or down) of a layer's experts: file offsets and sizes of every expert's span,
    the kernels' original address table, and each flat array's offset inside the span (-1: unused array)."""

    file_off: np.ndarray  # int64 [E]
    span: int
    region: int  # bytes of a slot this kind takes: the largest expert's span with its lead, in whole pages
    orig: np.ndarray  # int64 [E, 7] (ExpertTable.addr)
    rel: np.ndarray  # int64 [E, 6]

    @classmethod
    def of(cls, ws: list, base: int, buf_root: np.ndarray, end: int) -> _Kind:
        starts, spans, rels = [], [], []
        for w in ws:
            if _root(w.flat[0]) is not buf_root:
                raise GuildError("expert cache: the experts are not all views of one repack cache file")
            live = [(a.ctypes.data, a.nbytes) for a in w.flat if a.nbytes]
            s = min(p for p, _ in live)
            starts.append(s - base)
            spans.append(max(p + n for p, n in live) - s)
            rels.append([a.ctypes.data - s if a.nbytes else -1 for a in w.flat])
        off = np.array(starts, np.int64)
        if off.min() < 0 or int(off.max()) + max(spans) > end:
            raise GuildError("expert cache: an expert lies outside the repack cache file's data")
        region = -(-int((off % PAGE + np.array(spans)).max()) // PAGE) * PAGE
        return cls(off, max(spans), region, ExpertTable(ws).addr.copy(), np.array(rels, np.int64))


class LayerExperts:
    """One MoE layer's experts as the cache serves them: `addr_gu`/`addr_down` are the address tables the
    kernels read (resident experts point into their slot, the rest at the mapped file, which is never read for
    them), `slot_of[e]` the slot of expert e (-1: not resident)."""

    def __init__(self, cache: ExpertCache, li: int, gu: _Kind, down: _Kind, router: PackedMatrix, norm, eps):
        self.cache, self.li, self.gu, self.down = cache, li, gu, down
        self.router, self.norm, self.eps = router, norm, np.float32(eps)
        self.addr_gu, self.addr_down = gu.orig.copy(), down.orig.copy()
        self.slot_of = np.full(gu.orig.shape[0], -1, np.int64)
        self.chosen = np.zeros(gu.orig.shape[0], np.float64)  # decayed count of rows that chose each expert
        self.rows = 0.0  # decayed count of rows routed
        self.last: np.ndarray | None = None  # the experts of the last window when it was one row
        self.down_at = gu.region  # the down matrix's offset in a slot

    @property
    def slot_bytes(self) -> int:
        return self.down_at + self.down.region

    def point(self, e: int, slot_addr: int | None) -> None:
        """Expert e's address rows: into the slot at slot_addr, or back to the mapped file (None)."""
        for kind, table, at in ((self.gu, self.addr_gu, 0), (self.down, self.addr_down, self.down_at)):
            if slot_addr is None:
                table[e] = kind.orig[e]
            else:
                r = kind.rel[e]
                lead = int(kind.file_off[e]) % PAGE  # a slot mirrors the file's pages: direct reads need that
                table[e, 1:] = np.where(r >= 0, slot_addr + at + lead + r, kind.orig[e, 1:])

    def batches(self, eids: np.ndarray, counts: np.ndarray):
        """The cache's batches of eids (see ExpertCache.batches); counts[g]: rows (times ranks) that chose
        eids[g], the router's history the cold-expert estimate reads."""
        t = int(counts.sum()) // self.cache.top_k
        g = HISTORY_DECAY ** t
        self.chosen *= g
        self.chosen[eids] += counts
        self.rows = self.rows * g + t
        self.cache.observe_union(t, eids, self.last)
        self.last = eids if t == 1 else None
        return self.cache.batches(self, eids)

    def predict(self, x: np.ndarray) -> None:
        """Start reading the experts the router would pick for rows x (before attention), row 0's first."""
        c = self.cache
        if not c.prefetching:
            return
        t0 = time.perf_counter()
        h = np.empty(x.shape, np.float32)
        ops.rmsnorm(x, self.norm, self.eps, h)
        logits = np.empty((x.shape[0], self.router.n_rows), np.float32)
        matmul(self.router, h, logits)
        top = np.argsort(-logits, axis=1, kind="stable")[:, : min(c.top_k, PREFETCH_RANKS)]
        seen, order = set(), []
        for e in top.reshape(-1).tolist():  # row-major: the first row's experts first
            if e not in seen and self.slot_of[e] < 0:
                seen.add(e)
                order.append(e)
        if order:
            c.prefetch(self, order[: c.prefetch_max])
        c.stats.predict_s += time.perf_counter() - t0


class CachedExperts(ExpertList):
    """A MoE layer's list of gate|up experts (the model's PackedMatrix list) whose bytes an expert cache serves:
    kernels/cpu/moe.experts_ffn reads `resident` (a LayerExperts) for the slots' address tables."""

    def __init__(self, ws: list, resident: LayerExperts):
        super().__init__(ws)
        self.resident = resident


@dataclass
class Stats:
    hits: int = 0  # expert requests served from a slot
    misses: int = 0  # expert requests that read the expert synchronously (or waited for its prefetch)
    evictions: int = 0  # slots taken from another expert
    prefetched: int = 0  # experts read ahead by prediction
    prefetch_used: int = 0  # of those, requested before being evicted
    bytes_read: int = 0
    # where a window's time goes (seconds; the read and drop times are summed over the I/O threads)
    wait_s: float = 0.0  # windows blocked on expert reads, their own or a prefetch's
    sync_reads: int = 0  # experts a window read itself (not predicted, or predicted too late to start)
    reads: int = 0  # experts read from the file (sync or prefetch)
    depth_sum: int = 0  # reads in flight when each began, summed: depth_sum / reads is the mean queue depth
    read_s: float = 0.0  # inside preadv
    drop_s: float = 0.0  # inside posix_fadvise(DONTNEED)
    predict_s: float = 0.0  # pre-gating: the router applied to the rows before attention

    def as_dict(self) -> dict:
        n = self.hits + self.misses
        return {**self.__dict__, "hit_rate": self.hits / n if n else None}


class ExpertCache:
    """The bounded resident set of a model's experts (see the module docstring). `bound`: bytes of slots at
    most, or "auto" (the memory budget, memory.budget, less the file's non-expert part, which the process
    maps and reads like any file page); `resident_bytes`: what the slots take (<= bound)."""

    def __init__(self, model, path: str | os.PathLike, bound: int | str, prefetch: bool = True,
                 drop_pages: bool = True):
        self.path = str(path)
        self.prefetching, self.drop_pages = prefetch, drop_pages
        self.top_k = int(model.args.n_experts_used)
        self.fd = os.open(self.path, os.O_RDONLY)
        try:
            holders = self._layers(model, os.fstat(self.fd).st_size)
        except BaseException:
            os.close(self.fd)
            raise
        self.slot_bytes = -(-max(L.slot_bytes for L in self.layers.values()) // PAGE) * PAGE
        self.expert_bytes = sum(L.slot_of.size * (L.gu.span + L.down.span) for L in self.layers.values())
        if bound == "auto":
            bound = memory.budget() - (os.path.getsize(self.path) - self.expert_bytes)
        self.bound = int(bound)
        n_experts = sum(L.slot_of.size for L in self.layers.values())
        n = min(self.bound // self.slot_bytes, n_experts)  # more slots than experts would never be used
        if n < 1:
            os.close(self.fd)
            raise BadFlagError(f"--expert-cache-mem: {max(self.bound, 0)} bytes hold no expert (one takes "
                               f"{self.slot_bytes} bytes)")
        self.n_slots = n
        self.direct_fd = None  # O_DIRECT: misses bypass the page cache (no copy, no charge, nothing to drop)
        if drop_pages and hasattr(os, "O_DIRECT"):
            try:
                self.direct_fd = os.open(self.path, os.O_RDONLY | os.O_DIRECT)
            except OSError:  # a file system without direct I/O (tmpfs): read through the page cache and drop
                pass
        self.resident_bytes = n * self.slot_bytes
        self._mem = mmap.mmap(-1, self.resident_bytes)  # anonymous: pages are taken as slots fill
        self.mem = np.frombuffer(self._mem, np.uint8)
        self.base = self.mem.ctypes.data
        self.owner: list = [None] * n  # slot -> (LayerExperts, expert) | None
        self.free = list(range(n - 1, -1, -1))  # never-used slots, popped from the end
        self.pins = np.zeros(n, np.int64)
        self.loading = np.zeros(n, bool)
        self.crf = np.zeros(n, np.float64)  # LRFU score at t_last
        self.t_last = np.zeros(n, np.float64)
        self.from_prefetch = np.zeros(n, bool)
        self.lam = 1.0 / n  # the score halves every n requests
        self.clock = 0
        self.prefetch_max = max(1, n // 4)
        self.passive = wait_passively()  # False: the kernels' threads started spinning before the cache
        self.stats = Stats()
        self.in_flight = 0  # reads under way (the I/O threads')
        self.read_ms: float | None = None  # decayed mean ms a window waits per expert it reads
        self.cond = threading.Condition()
        self.pool = ThreadPoolExecutor(IO_THREADS, thread_name_prefix="guild-experts")
        self.closed = False
        self._reset_history()
        for holder, ws_gu, L in holders:
            holder.experts_gu = CachedExperts(ws_gu, L)
            for kind in (L.gu, L.down):  # pages a first load or a build left in the page cache
                for off in kind.file_off.tolist():
                    self._drop(off, kind.span)

    def _layers(self, model, file_end: int) -> list:
        self.layers: dict[int, LayerExperts] = {}
        holders = []
        for li, blk in enumerate(model.blocks()):
            parts = _moe_parts(blk)
            if parts is None:
                continue
            holder, norm = parts
            ws_gu, ws_down = list(holder.experts_gu), list(holder.experts_down)
            if not (ExpertTable(ws_gu).ok and ExpertTable(ws_down).ok):
                raise GuildError("--expert-cache-mem: this model's experts are not on the int8 kernels "
                                 "(--numerics f32 or a quant type without them); run with --expert-cache-mem off")
            buf = _root(ws_gu[0].flat[0])
            if not isinstance(getattr(buf.base, "obj", buf.base), mmap.mmap):  # np.frombuffer(mmap) or its memoryview
                raise GuildError("--expert-cache-mem: the experts are not mapped from guild's repack cache "
                                 "(GUILD_REPACK_CACHE=0 or an unwritable cache directory)")
            base = buf.ctypes.data
            L = LayerExperts(self, li, _Kind.of(ws_gu, base, buf, file_end), _Kind.of(ws_down, base, buf, file_end),
                             holder.router, norm, model.args.norm_eps)
            self.layers[li] = L
            holders.append((holder, ws_gu, L))
        if not self.layers:
            raise GuildError("--expert-cache-mem: the model has no routed experts")
        return holders

    # -- residency (under self.cond) ---------------------------------------------------------------------
    def _touch(self, s: int) -> None:
        self.clock += 1
        t = float(self.clock)
        self.crf[s] = 1.0 + self.crf[s] * np.exp2(-self.lam * (t - self.t_last[s]))
        self.t_last[s] = t

    def _victim(self) -> int:
        """A never-used slot, else the lowest-scoring one neither in use nor being read (-1: none)."""
        if self.free:
            return self.free.pop()
        score = self.crf * np.exp2(-self.lam * (self.clock - self.t_last))
        score[(self.pins > 0) | self.loading] = np.inf
        s = int(np.argmin(score))
        return -1 if score[s] == np.inf else s

    def _assign(self, s: int, L: LayerExperts, e: int) -> None:
        """Give slot s to expert e of L (the caller reads it in): the previous owner falls back to the file."""
        old = self.owner[s]
        if old is not None:
            old[0].slot_of[old[1]] = -1
            old[0].point(old[1], None)
            self.stats.evictions += 1
        self.owner[s] = (L, e)
        L.slot_of[e] = s
        self.crf[s], self.t_last[s] = 0.0, float(self.clock)
        self.loading[s] = True

    # -- reading (I/O threads) ---------------------------------------------------------------------------
    def _read(self, s: int) -> None:
        """Read slot s's expert from the file (its two ranges), then publish its addresses."""
        with self.cond:
            L, e = self.owner[s]
            self.in_flight += 1
            self.stats.reads += 1
            self.stats.depth_sum += self.in_flight
        at = s * self.slot_bytes
        n, t_read, t_drop = 0, 0.0, 0.0
        try:
            for kind, off in ((L.gu, 0), (L.down, L.down_at)):
                t0 = time.perf_counter()
                n += self.read_kind(kind, e, self.mem[at + off : at + off + kind.region], drop=False)
                t1 = time.perf_counter()
                t_read += t1 - t0
                if self.direct_fd is None:
                    self._drop(int(kind.file_off[e]), kind.span)
                    t_drop += time.perf_counter() - t1
        except BaseException:
            with self.cond:  # the slot goes back empty; whoever waits for it sees the error from its own read
                self.in_flight -= 1
                L.slot_of[e] = -1
                self.owner[s] = None
                self.loading[s] = False
                self.free.append(s)
                self.cond.notify_all()
            raise
        with self.cond:
            L.point(e, self.base + at)
            self.in_flight -= 1
            self.stats.bytes_read += n
            self.stats.read_s += t_read
            self.stats.drop_s += t_drop
            self.loading[s] = False
            self.cond.notify_all()

    def read_kind(self, kind: _Kind, e: int, dst: np.ndarray, drop: bool = True) -> int:
        """Read expert e's span of `kind` into dst (a page-aligned slot region, kind.region bytes) at its offset
        within its first page; returns the bytes read. Direct: the whole pages, from the page holding the span's
        first byte. Else through the page cache, the pages dropped after when `drop`."""
        f_off = int(kind.file_off[e])
        lead = f_off % PAGE
        if self.direct_fd is not None:
            n_al = -(-(lead + kind.span) // PAGE) * PAGE
            return self._pread(self.direct_fd, dst[:n_al], f_off - lead, lead + kind.span)
        n = self._pread(self.fd, dst[lead : lead + kind.span], f_off, kind.span)
        if drop:
            self._drop(f_off, kind.span)
        return n

    def _pread(self, fd: int, dst: np.ndarray, off: int, need: int) -> int:
        """Read into dst from file offset off until at least `need` bytes came (the end of the file may cut a
        direct read's last page short); returns the bytes read."""
        view, done = memoryview(dst), 0
        while done < need:
            got = os.preadv(fd, [view[done:]], off + done)
            if got <= 0:
                raise GuildError(f"{self.path}: short read at offset {off + done} (the repack cache file shrank?)")
            done += got
        return done

    def _drop(self, off: int, n: int) -> None:
        if self.drop_pages and hasattr(os, "posix_fadvise"):
            os.posix_fadvise(self.fd, off, n, os.POSIX_FADV_DONTNEED)

    # -- the kernels' side -------------------------------------------------------------------------------
    def batches(self, L: LayerExperts, eids: np.ndarray):
        """Yield (g0, g1, addr_gu, addr_down): groups g0:g1 of eids (a layer's experts, as route_groups orders
        them) resident and pinned until the next step; as many per batch as the slots not in use allow."""
        g, n = 0, len(eids)
        while g < n:
            g0, pinned, reads = g, [], []
            with self.cond:
                while g < n:
                    e = int(eids[g])
                    s = int(L.slot_of[e])
                    if s >= 0:
                        if self.loading[s]:
                            self.stats.misses += 1  # its prefetch is still in flight
                        else:
                            self.stats.hits += 1
                        if self.from_prefetch[s]:
                            self.from_prefetch[s] = False
                            self.stats.prefetch_used += 1
                    else:
                        s = self._victim()
                        if s < 0:
                            break
                        self._assign(s, L, e)
                        self.stats.misses += 1
                        self.stats.sync_reads += 1
                        reads.append(s)
                    self.pins[s] += 1
                    self._touch(s)
                    pinned.append(s)
                    g += 1
                if not pinned:  # every slot is being read by a prefetch: wait for one
                    self.cond.wait()
                    continue
            try:
                t0 = time.perf_counter()
                for f in [self.pool.submit(self._read, s) for s in reads]:
                    f.result()
                if reads:  # what a window waits per cold expert, reads in parallel included
                    ms = (time.perf_counter() - t0) * 1e3 / len(reads)
                    self.read_ms = ms if self.read_ms is None else 0.9 * self.read_ms + 0.1 * ms
                with self.cond:
                    while self.loading[pinned].any():
                        self.cond.wait()
                    self.stats.wait_s += time.perf_counter() - t0
                    if any(self.owner[s] is None for s in pinned):
                        raise GuildError(f"{self.path}: an expert's read failed")
                yield g0, g, L.addr_gu, L.addr_down
            finally:
                with self.cond:
                    self.pins[pinned] -= 1
                    self.cond.notify_all()

    def prefetch(self, L: LayerExperts, order: list) -> None:
        """Read L's experts in `order` into slots in the background (those not already resident or loading)."""
        with self.cond:
            for e in order:
                if L.slot_of[e] >= 0:
                    continue
                s = self._victim()
                if s < 0:
                    break
                self._assign(s, L, e)
                self.from_prefetch[s] = True
                self.stats.prefetched += 1
                self.pool.submit(self._read, s)

    def _reset_history(self) -> None:
        self.union_sum: dict[int, float] = {}  # per T: decayed sums of a T-row window's experts / top_k
        self.union_n: dict[int, float] = {}
        self.fresh_sum = self.fresh_n = 0.0  # decayed sums of the share of a row's experts its predecessor lacked

    def observe_union(self, t: int, eids: np.ndarray, last: np.ndarray | None) -> None:
        """A layer's window of t rows routed to `eids` (distinct); `last`: that layer's previous window's experts
        when it was one row (so at t = 1, the row before this one)."""
        d = UNION_DECAY
        if t >= 2:
            self.union_sum[t] = d * self.union_sum.get(t, 0.0) + eids.size / self.top_k
            self.union_n[t] = d * self.union_n.get(t, 0.0) + 1.0
        elif last is not None:
            # eids ascending (route_groups' order): the shared experts by one binary search, not a set operation
            shared = np.count_nonzero(last[np.minimum(np.searchsorted(last, eids), last.size - 1)] == eids)
            self.fresh_sum = d * self.fresh_sum + 1.0 - shared / self.top_k
            self.fresh_n = d * self.fresh_n + 1.0

    def growth(self, t: int) -> float:
        """A window of t rows' union of experts in rows' worth (1 at t = 1): measured on windows of t rows,
        shrunk towards 1 + (t - 1) f, f the share of a row's experts the row before it did not use (consecutive
        tokens share experts; f = 1, rows with nothing in common, until measured)."""
        if t <= 1:
            return 1.0
        f = self.fresh_sum / self.fresh_n if self.fresh_n > 0 else 1.0
        w0 = 4.0  # the prior's weight, in windows
        prior = 1.0 + (t - 1) * f
        return (self.union_sum.get(t, 0.0) + w0 * prior) / (self.union_n.get(t, 0.0) + w0)

    def cold_experts(self, t_max: int) -> list[float]:
        """Expected experts a window of T = 1..t_max rows would read from disk: a row's (over every layer, each
        expert not resident times its share p_e of the router's recent rows) times the window's union growth
        (`growth`: consecutive rows share experts, which a model of independent rows would price T times)."""
        with self.cond:
            one = 0.0
            for L in self.layers.values():
                if L.rows > 0:
                    one += float(np.minimum(L.chosen[L.slot_of < 0] / L.rows, 1.0).sum())
            return [one * self.growth(t) for t in range(1, t_max + 1)]

    def clear(self) -> None:
        """Empty every slot and forget the router's history, as just after loading (a benchmark's cold start);
        waits for the reads in flight. The slots' pages go back to the system."""
        with self.cond:
            while self.in_flight or self.pins.any() or self.loading.any():
                self.cond.wait()
            for own in self.owner:
                if own is not None:
                    own[0].slot_of[own[1]] = -1
                    own[0].point(own[1], None)
            self.owner = [None] * self.n_slots
            self.free = list(range(self.n_slots - 1, -1, -1))
            self.crf[:], self.t_last[:], self.from_prefetch[:] = 0.0, 0.0, False
            self.clock, self.read_ms = 0, None
            for L in self.layers.values():
                L.chosen[:], L.rows, L.last = 0.0, 0.0, None
            self._reset_history()
            if hasattr(self._mem, "madvise") and hasattr(mmap, "MADV_DONTNEED"):
                self._mem.madvise(mmap.MADV_DONTNEED)

    def cold_ms(self, t_max: int) -> list[float] | None:
        """cold_experts priced at the measured wait per expert read (None until one was timed): the residency
        input of the adaptive scheduler's window cost."""
        if self.read_ms is None:
            return None
        return [c * self.read_ms for c in self.cold_experts(t_max)]

    def close(self) -> None:
        """Wait for the reads in flight and close the file (the slots stay mapped while the model uses them)."""
        if not self.closed:
            self.closed = True
            self.pool.shutdown(wait=True)
            os.close(self.fd)
            if self.direct_fd is not None:
                os.close(self.direct_fd)


def attach(model, path: str | os.PathLike, bound: int | str, **kw) -> ExpertCache:
    """Serve model's routed experts from a cache of at most `bound` bytes ("auto": see ExpertCache) reading the
    repack cache file at path (the file the model's matrices are mapped from); the model's forward then predicts
    and reads its experts through it."""
    cache = ExpertCache(model, path, bound, **kw)
    model.expert_cache = cache
    return cache
