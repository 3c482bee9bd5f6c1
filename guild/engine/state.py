"""Per-session model state: the KV cache, written a window at a time and committed by `keep`."""

from __future__ import annotations

import numpy as np

from ..errors import ContextOverflowError, DeviceOutOfMemoryError
from ..kernels.cpu import ops as cpu_ops
from ..kvtypes import F32_KV, KVTypes
from ..window import MAX_WINDOW
from .backends import HOST
from .backends.oom import allocating

KV_FIRST_ROWS = 256  # positions a host cache holds before it first grows


def tile_rows(rows: int) -> int:
    """Positions the arrays hold for `rows`: whole key tiles (kernels/cpu/ops.KV_TILE)."""
    return cpu_ops.key_tiles(rows) * cpu_ops.KV_TILE


class KVCache:
    """Keys as [n_layers, n_kv_heads, rows/KV_TILE, head_dim, KV_TILE] (tiles of positions, transposed within a
    tile, for the attention kernels: kernels/cpu/ops.KV_TILE), values as [n_layers, n_kv_heads, rows, head_dim], in
    the stored types of `kv` (guild/kvtypes.py): float32, float16, or q8_0 as int8 quants in those shapes
    with an f16 scale per 32 values along head_dim in `k_scale` [n_layers, n_kv_heads, rows/KV_TILE, head_dim/32,
    KV_TILE] and `v_scale` [n_layers, n_kv_heads, rows, head_dim/32] (llama.cpp's block_q8_0 in two arrays, its 34
    bytes per 32 values; its q8_0 V is laid out per position the same way, the layout its flash attention reads).
    A window's rows are converted once, when written. `rows` grows with the positions used, up to n_ctx (in whole
    tiles: tile_rows).

    `begin(T)` reserves rows pos..pos+T-1 for a window; `commit(keep)` keeps the first `keep` of them and
    clears the rest, so the cache is exactly what `keep` single-token steps would have left
    (docs/contracts.md "Window").
    """

    def __init__(self, n_layers: int, n_kv_heads: int, head_dim: int, n_ctx: int, kv: KVTypes = F32_KV):
        kv.check_head_dim(head_dim)
        self.n_ctx = n_ctx
        self.kv_types = kv
        self.token_bytes = kv.token_bytes(n_layers, n_kv_heads, head_dim)
        self.cap = min(n_ctx, KV_FIRST_ROWS)  # positions it holds (the arrays: that many in whole tiles)
        rows = tile_rows(self.cap)
        tiles = rows // cpu_ops.KV_TILE
        self.k = np.zeros((n_layers, n_kv_heads, tiles, head_dim, cpu_ops.KV_TILE), _DTYPE[kv.k])
        self.v = np.zeros((n_layers, n_kv_heads, rows, head_dim), _DTYPE[kv.v])
        self.k_scale = (np.zeros((n_layers, n_kv_heads, tiles, head_dim // 32, cpu_ops.KV_TILE), np.float16)
                        if kv.k == "q8_0" else None)
        self.v_scale = np.zeros((n_layers, n_kv_heads, rows, head_dim // 32), np.float16) if kv.v == "q8_0" else None
        self.pos = 0  # committed rows
        self.pending = 0  # rows written by the open window

    def _arrays(self) -> list[tuple[str, bool]]:
        """(attribute, tiled) of every stored array: key tiles (positions on axes 2 and 4), else positions on
        axis 2."""
        return [(name, name.startswith("k")) for name in ("k", "k_scale", "v", "v_scale")
                if getattr(self, name) is not None]

    @staticmethod
    def _get(a: np.ndarray, tiled: bool, lo: int, hi: int) -> np.ndarray:
        """Positions lo .. hi - 1 (keys as [..., hd, n]; a view for values, a copy for keys)."""
        return cpu_ops.get_keys(a, lo, hi) if tiled else a[:, :, lo:hi]

    @staticmethod
    def _put(a: np.ndarray, tiled: bool, lo: int, x) -> None:
        """Positions lo .. lo + n = x (keys [..., hd, n], values [..., n, hd])."""
        if tiled:
            cpu_ops.put_keys(a, lo, x)
        else:
            a[..., lo : lo + x.shape[-2], :] = x

    def _reserve(self, rows: int) -> None:
        """Room for `rows` positions: the arrays grow (doubling, at most n_ctx) as the context fills. Allocated
        whole, the first writes would touch every page of the n_ctx-sized cache (hundreds of ms at 4K-8K
        positions, paid by the first prompt) and the memory would not follow the context used."""
        if rows <= self.v.shape[2]:
            return
        self.cap = min(self.n_ctx, max(rows, 2 * self.cap))
        if 4 * (self.n_ctx - self.cap) < self.cap:  # the rest is small: take it now, not in a later copy of the
            self.cap = self.n_ctx  # whole cache (a 16K prompt then grew at its first decoded row: 0.6 s)
        cap = tile_rows(self.cap)
        for name, tiled in self._arrays():
            a = getattr(self, name)
            shape = list(a.shape)
            shape[2] = cap // cpu_ops.KV_TILE if tiled else cap
            grown = np.zeros(shape, a.dtype)
            grown[:, :, : a.shape[2]] = a  # whole tiles or rows: rows past the position are zero in both
            setattr(self, name, grown)

    def begin(self, T: int) -> int:
        if self.pending:
            raise RuntimeError("KVCache.begin: previous window not committed")
        if self.pos + T > self.n_ctx:
            raise ContextOverflowError(
                f"context full: {self.pos} + {T} tokens exceed the context of {self.n_ctx} tokens", self.n_ctx
            )
        self._reserve(self.pos + T)
        self.pending = T
        return self.pos

    def write(self, layer: int, k: np.ndarray, v: np.ndarray) -> None:
        """k, v: [T, n_kv_heads, head_dim] for the open window's rows, converted to the stored types."""
        HOST.kv_write(*self.kv_layer(layer), k, v, self.pos)

    def kv_layer(self, layer: int):
        """A layer's keys and values as the attention kernels take them (kernels/cpu/ops.attention_kv)."""
        return tuple((a[0][layer], a[1][layer]) if isinstance(a, tuple) else a[layer] for a in self.kv_stacked())

    def kv_stacked(self):
        """Every layer's keys and values at once, stacked by layer (kernels/cpu/ops/kv.layer_operand gives layer li
        of each as kv_layer does). Valid until the cache grows (the next window's begin)."""
        ks = None if self.k_scale is None else self.k_scale.view(np.uint16)
        vs = None if self.v_scale is None else self.v_scale.view(np.uint16)
        return self._stacked(self.k, ks), self._stacked(self.v, vs)

    @staticmethod
    def _stacked(a: np.ndarray, scale):
        if scale is not None:
            return a, scale
        return a.view(np.uint16) if a.dtype == np.float16 else a

    def _clear(self, lo: int, hi: int) -> None:
        for name, tiled in self._arrays():
            a = getattr(self, name)
            if tiled:
                cpu_ops.put_keys(a, lo, np.zeros((max(0, hi - lo),), a.dtype))
            else:
                a[:, :, lo:hi] = 0

    def commit(self, keep: int) -> None:
        if not 0 <= keep <= self.pending:
            raise ValueError(f"commit({keep}) outside the open window of {self.pending} rows")
        end = self.pos + self.pending
        self.pos += keep
        if self.pos < end:  # rows >= keep must not survive
            self._clear(self.pos, end)
        self.pending = 0

    def reachable(self, n: int) -> int:
        """The position truncate(n) leaves: any committed row can be cut."""
        return max(0, min(n, self.pos))

    def truncate(self, n: int) -> None:
        """Forget committed rows >= n (a conversation re-tokenised differently from what was fed)."""
        if self.pending:
            raise RuntimeError("KVCache.truncate: a window is open")
        n = self.reachable(n)
        self._clear(n, self.pos)
        self.pos = n

    def fill_copies(self, target: int) -> None:
        """Rows pos..target-1 become copies of rows 0..pos-1, committed (calibration: attention costs the same
        whatever the keys hold)."""
        filled = self.pos
        self._reserve(target)
        while self.pos < target:
            n = min(filled, target - self.pos)
            for name, tiled in self._arrays():
                a = getattr(self, name)
                self._put(a, tiled, self.pos, self._get(a, tiled, 0, n).copy())
            self.pos += n

    @property
    def nbytes(self) -> int:
        """Bytes at the full context in whole key tiles (what a pool must budget for); the arrays hold
        `resident_bytes` now."""
        return self.token_bytes * tile_rows(self.n_ctx)

    @property
    def resident_bytes(self) -> int:
        return sum(getattr(self, name).nbytes for name, _ in self._arrays())


_DTYPE = {"f32": np.float32, "f16": np.float16, "q8_0": np.int8}


class HybridState:
    """State of a hybrid Gated-DeltaNet model (qwen3next, qwen35moe): a KV cache for the full-attention layers
    and, per DeltaNet layer, the recurrent state S [Hv, dk, dv] and the conv history [K-1, C] (the last K-1
    conv inputs). Same interface as KVCache, so guild/engine/session.py drives it unchanged.

    A window runs the recurrence from the committed S without modifying it. `rollback="snapshot"` (default):
    the window writes S after every row into a pool of buffers (1 + the longest window, <= MAX_SNAPSHOT_ROWS)
    and `commit(keep)` makes row keep-1's buffer the committed one (no copy). `rollback="replay"`: the window
    writes only its final S, into a second buffer, and keeps each row's recurrence inputs (q, k, v, g, beta);
    commit swaps buffers when every row is kept, else reruns the `keep` rows from the committed S with the same
    kernel (bitwise what `keep` single steps leave). Windows longer than MAX_SNAPSHOT_ROWS (prefill chunks)
    replay in both modes. Replaying costs a whole recurrence row per kept row where a snapshot costs one store
    per row, so snapshots are the default, at the price of up to 1 + MAX_SNAPSHOT_ROWS states per layer
    (`python -m guild.bench hybrid` measures both). The conv history becomes the last K-1 of (history,
    first `keep` conv inputs). Nothing of rows >= keep survives (docs/contracts.md "Window").
    """

    MAX_SNAPSHOT_ROWS = MAX_WINDOW

    def __init__(self, n_layers: int, attn_layers, rec_layers, n_kv_heads: int, head_dim: int, n_ctx: int,
                 kmap: np.ndarray, k_dim: int, v_dim: int, conv_dim: int, conv_kernel: int,
                 rollback: str = "snapshot", kv: KVTypes = F32_KV):
        if rollback not in ("replay", "snapshot"):
            raise ValueError(f"rollback must be 'replay' or 'snapshot', got {rollback!r}")
        self.rollback = rollback
        self.kv = KVCache(max(len(attn_layers), 1), n_kv_heads, head_dim, n_ctx, kv)
        self.attn_slot = {li: i for i, li in enumerate(attn_layers)}  # model layer -> KV cache layer
        self.rec_slot = {li: i for i, li in enumerate(rec_layers)}  # model layer -> recurrent slot
        self.kmap = np.ascontiguousarray(kmap, np.int64)  # key head of each value head
        self.scale = np.float32(1.0 / np.sqrt(k_dim))
        # snapshot pools grow to 1 + the longest window seen (<= MAX_SNAPSHOT_ROWS), so plain decoding holds 2
        self.S = np.zeros((len(rec_layers), 2, self.kmap.size, k_dim, v_dim), np.float32)
        self.conv = np.zeros((len(rec_layers), conv_kernel - 1, conv_dim), np.float32)
        self.cur = 0  # buffer of S holding the committed state
        self.dst = np.zeros(0, np.int64)  # buffer each row of the open window writes
        self._rows: list = [None] * len(rec_layers)  # per layer: (conv inputs, q, k, v, g, beta) of the window
        self._checkpoint = None  # (pos, S, conv) after the last fully committed prefill window
        self._prefill = False

    @property
    def n_ctx(self) -> int:
        return self.kv.n_ctx

    @property
    def pos(self) -> int:
        return self.kv.pos

    @property
    def pending(self) -> int:
        return self.kv.pending

    def begin(self, T: int, prefill: bool = False) -> int:
        """Open a window of T rows; `prefill` marks a prompt chunk (a rewind checkpoint once fully committed)."""
        pos0 = self.kv.begin(T)
        if self.rollback == "snapshot" and 1 < T <= self.MAX_SNAPSHOT_ROWS:
            self._grow(T + 1)
            self.dst = np.array([b for b in range(T + 1) if b != self.cur][:T], np.int64)
        else:
            self.dst = np.full(T, 1 - self.cur if self.cur < 2 else 0, np.int64)
        self._prefill = prefill
        return pos0

    def write(self, layer: int, k: np.ndarray, v: np.ndarray) -> None:
        """Keys/values [T, Hkv, hd] of an attention layer (model layer index)."""
        self.kv.write(self.attn_slot[layer], k, v)

    def kv_layer(self, layer: int):
        return self.kv.kv_layer(self.attn_slot[layer])

    def _grow(self, n_buf: int) -> None:
        """Snapshot pools of at least n_buf buffers (the committed one keeps its index)."""
        if self.S.shape[1] < n_buf:
            grown = np.zeros((self.S.shape[0], n_buf, *self.S.shape[2:]), np.float32)
            grown[:, : self.S.shape[1]] = self.S
            self.S = grown

    def _save(self):
        return self.S[:, self.cur].copy(), self.conv.copy()

    def _restore(self, saved) -> None:
        """Committed recurrent state and conv history from _save() (None: zeros)."""
        if saved is None:
            self.S[:, self.cur] = 0.0
            self.conv[...] = 0.0
        else:
            self.S[:, self.cur] = saved[0]
            self.conv[...] = saved[1]

    def rec_args(self, layer: int):
        """(backend, kmap, per-row destination buffers) for a DeltaNet layer's recurrence kernel."""
        return HOST, self.kmap, self.dst

    def recurrent(self, layer: int) -> tuple[np.ndarray, np.ndarray]:
        """(S pool [n_buf, Hv, dk, dv], conv history [K-1, C]) of a DeltaNet layer (model layer index)."""
        i = self.rec_slot[layer]
        return self.S[i], self.conv[i]

    def keep_rows(self, layer: int, xconv, q, k, v, g, beta) -> None:
        """The open window's conv inputs and recurrence inputs of a DeltaNet layer (references, for commit)."""
        self._rows[self.rec_slot[layer]] = (xconv, q, k, v, g, beta)

    def commit(self, keep: int) -> None:

        T = self.pending
        if not 0 <= keep <= T:
            raise ValueError(f"commit({keep}) outside the open window of {T} rows")
        self.kv.commit(keep)
        if keep:
            snapshots = T > 1 and self.dst[0] != self.dst[1]
            for li, i in self.rec_slot.items():
                xconv, q, k, v, g, beta = self._rows[i]
                hist = self.conv[i]
                K1 = hist.shape[0]
                if keep >= K1:
                    hist[...] = xconv[keep - K1 : keep]
                else:  # shift the history by keep rows (a copy: device arrays do not cope with the overlap)
                    hist[: K1 - keep] = hist[keep:].copy()
                    hist[K1 - keep :] = xconv[:keep]
                if keep < T and not snapshots:
                    be, kmap, dst = self.rec_args(li)
                    be.gdn_recurrence(q[:keep], k[:keep], v[:keep], g[:keep], beta[:keep], kmap, self.scale,
                                      self.S[i], self.cur, dst[:keep], be.empty((0, 1, 1)))
            self.cur = int(self.dst[keep - 1])
            if self._prefill and keep == T:
                self._checkpoint = (self.pos, self._save())
        self._rows = [None] * len(self._rows)
        self.dst = np.zeros(0, np.int64)
        self._prefill = False

    def reachable(self, n: int) -> int:
        """The position truncate(n) leaves: n itself only at the current position, else the last prefill
        checkpoint at or before n, else 0 (a recurrent state cannot be cut at an arbitrary row)."""
        n = max(0, min(n, self.pos))
        ck = self._checkpoint
        return n if n == self.pos else ck[0] if ck is not None and ck[0] <= n else 0

    def truncate(self, n: int) -> None:
        """Forget committed rows >= n, going back to `reachable(n)`; the session re-feeds tokens[pos:]
        (GuildSession.prefill feeds everything past state.pos), so the result is exact."""
        if self.pending:
            raise RuntimeError("HybridState.truncate: a window is open")
        to = self.reachable(n)
        if to == self.pos:
            return
        self.kv.truncate(to)
        if to:
            self._restore(self._checkpoint[1])
        else:
            self._restore(None)
            self._checkpoint = None

    @property
    def nbytes(self) -> int:
        return self.kv.nbytes + self.S.nbytes + self.conv.nbytes



class DeviceKVCache:
    """KVCache's contract with each layer's cache on that layer's backend (`bes`, one per cache layer; a
    placement puts some on a GPU), in the stored types of `kv`, each layer's operands as its backend's
    attention takes them (Backend.kv_zeros). `commit(keep)` and `truncate(n)` move the position only:
    attention reads positions <= pos0 + t, all written earlier or in the same window, so rows past the position
    are never read before being rewritten (no zeroing pass on the device)."""

    def __init__(self, bes, n_kv_heads: int, head_dim: int, n_ctx: int, kv: KVTypes = F32_KV):
        kv.check_head_dim(head_dim)
        self.kv_types = kv
        self.n_ctx = n_ctx
        self.pos = 0
        self.pending = 0
        self.bes = list(bes)
        self.k, self.v = [], []
        need = kv.token_bytes(1, n_kv_heads, head_dim) * n_ctx
        for i, be in enumerate(self.bes):
            what = f"KV cache {i + 1} of {len(self.bes)} ({n_ctx} tokens, {kv.describe()})"
            with be.activate(), allocating(be, what, need):
                k, v = be.kv_zeros(n_kv_heads, head_dim, n_ctx, kv)
                self.k.append(k)
                self.v.append(v)

    begin = KVCache.begin

    def _reserve(self, rows: int) -> None:
        """Nothing: device caches are allocated whole, as the placement budgeted them."""

    def write(self, layer: int, k, v) -> None:
        self.bes[layer].kv_write(self.k[layer], self.v[layer], k, v, self.pos)

    def kv_layer(self, layer: int):
        return self.k[layer], self.v[layer]

    def commit(self, keep: int) -> None:
        if not 0 <= keep <= self.pending:
            raise ValueError(f"commit({keep}) outside the open window of {self.pending} rows")
        self.pos += keep
        self.pending = 0

    reachable = KVCache.reachable

    def truncate(self, n: int) -> None:
        if self.pending:
            raise RuntimeError("KVCache.truncate: a window is open")
        self.pos = self.reachable(n)

    def fill_copies(self, target: int) -> None:
        """KVCache.fill_copies, each layer copied where it lives (device to device)."""
        filled = self.pos
        while self.pos < target:
            n, p = min(filled, target - self.pos), self.pos
            for k, v in zip(self.k, self.v, strict=True):
                for a in _parts(k):
                    if a.ndim == 4:  # a host layer's key tiles (HostBackend.kv_zeros)
                        cpu_ops.put_keys(a, p, cpu_ops.get_keys(a, 0, n))
                    else:
                        a[:, :, p : p + n] = a[:, :, :n]
                for a in _parts(v):
                    a[:, p : p + n] = a[:, :n]
            self.pos += n

    @property
    def nbytes(self) -> int:
        return sum(int(a.nbytes) for op in (*self.k, *self.v) for a in _parts(op))


def _parts(op) -> tuple:
    """The arrays of a KV operand (a q8_0 pair is two)."""
    return op if isinstance(op, tuple) else (op,)


class DeviceHybridState(HybridState):
    """HybridState with each layer's part on that layer's backend (`bes`, one per model layer): the KV cache of
    the attention layers (DeviceKVCache), and per DeltaNet layer its snapshot pool [n_buf, Hv, dk, dv] and conv
    history [K-1, C]. The same begin / commit(keep) / truncate code runs (HybridState), so a rejected row's
    state is dropped by the same per-row snapshot choice on the device; only the storage is per layer."""

    def __init__(self, bes, attn_layers, rec_layers, n_kv_heads: int, head_dim: int, n_ctx: int, kmap, k_dim: int,
                 v_dim: int, conv_dim: int, conv_kernel: int, rollback: str = "snapshot", kv: KVTypes = F32_KV):
        super().__init__(0, [], [], 1, 1, 1, kmap, k_dim, v_dim, 1, 2, rollback)
        self.bes = list(bes)
        self.kv = DeviceKVCache([self.bes[li] for li in attn_layers] or [HOST], n_kv_heads, head_dim, n_ctx, kv)
        self.attn_slot = {li: i for i, li in enumerate(attn_layers)}
        self.rec_slot = {li: i for i, li in enumerate(rec_layers)}
        self._rows = [None] * len(rec_layers)
        self._rec_be = [self.bes[li] for li in rec_layers]
        self.S, self.conv, self._kmap = [], [], {}
        for li, be in zip(rec_layers, self._rec_be, strict=True):
            need = 4 * (2 * self.kmap.size * k_dim * v_dim + (conv_kernel - 1) * conv_dim) + self.kmap.nbytes
            with be.activate(), allocating(be, f"the recurrent state of layer {li}", need):
                self.S.append(be.zeros((2, self.kmap.size, k_dim, v_dim)))
                self.conv.append(be.zeros((conv_kernel - 1, conv_dim)))
                if be.name not in self._kmap:
                    self._kmap[be.name] = be.upload(self.kmap)
        self._dst: dict = {}
        self._rec_layers = list(rec_layers)

    def begin(self, T: int, prefill: bool = False) -> int:
        pos0 = super().begin(T, prefill)
        self._dst = {}
        return pos0

    def _grow(self, n_buf: int) -> None:
        """Every pool grown to n_buf snapshots, or none (a device out of memory part way leaves the state as it
        was: the new pools replace the old only once all are allocated)."""
        grown = {}
        try:
            for i, be in enumerate(self._rec_be):
                if self.S[i].shape[0] < n_buf:
                    shape = (n_buf, *self.S[i].shape[1:])
                    what = f"the snapshot pool of layer {self._rec_layers[i]} ({n_buf} states)"
                    with be.activate(), allocating(be, what, 4 * int(np.prod(shape))):
                        grown[i] = be.zeros(shape)
                        grown[i][: self.S[i].shape[0]] = self.S[i]
        except DeviceOutOfMemoryError:
            grown.clear()  # the pools grown so far go back now, not when the error's traceback does
            raise
        for i, S in grown.items():
            self.S[i] = S

    def _save(self):
        return [S[self.cur].copy() for S in self.S], [c.copy() for c in self.conv]

    def _restore(self, saved) -> None:
        for i in range(len(self.S)):
            if saved is None:
                self.S[i][self.cur] = 0.0
                self.conv[i][...] = 0.0
            else:
                self.S[i][self.cur] = saved[0][i]
                self.conv[i][...] = saved[1][i]

    def dst_on(self, backend_name: str, dst) -> None:
        """The open window's per-row destination buffers on a backend (the forward's window indices bring them
        to each device in its one H2D: guild.models.llama.Window)."""
        self._dst[backend_name] = dst

    def rec_args(self, layer: int):
        be = self._rec_be[self.rec_slot[layer]]
        return be, self._kmap[be.name], self._dst.get(be.name, self.dst)

    def kv_layer(self, layer: int):
        return self.kv.kv_layer(self.attn_slot[layer])

    @property
    def nbytes(self) -> int:
        return self.kv.nbytes + sum(int(S.nbytes) + int(c.nbytes) for S, c in zip(self.S, self.conv, strict=True))
