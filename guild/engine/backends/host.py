"""The host backend: NumPy arrays and the CPU kernels. `HOST` is what a CPU model runs on; `fake_device()` a
stand-in GPU for CPU tests, whose transfers copy and are counted."""

from __future__ import annotations

import contextlib
import weakref

import numpy as np

from ...kernels.cpu import deltanet as cpu_gdn
from ...kernels.cpu import ops as cpu_ops
from ...kernels.cpu import quant as cpu_quant
from ...kvtypes import F32_KV, KVTypes
from .clock import KernelClock, clocked

PARALLEL_ROWS = 16  # row-wise host ops (rmsnorm) run on one thread below this many rows: waking the others costs more


class OutOfMemoryError(MemoryError):
    """The fake device's allocation failure, named as CuPy's (cupy.cuda.memory.OutOfMemoryError)."""


class HostBackend:
    """NumPy arrays and the CPU kernels. `device=False`: the host itself (arrays are shared with the caller);
    `device=True` (`fake_device()`): a stand-in GPU whose transfers copy and are counted, for CPU tests."""

    clock: KernelClock | None = None  # set only while guild.engine.timing measures a window

    def __init__(self, name: str = "cpu", device: bool = False, capacity: int | None = None):
        self.name, self.device = name, device
        self.h2d = self.d2h = 0  # transfers and their bytes (fake device only)
        self.h2d_bytes = self.d2h_bytes = 0
        # a fake device's memory: `capacity` bytes (None: unlimited), `used` by its live arrays and its weights
        self.capacity, self.used = capacity, 0

    @classmethod
    def fake_device(cls, capacity: int | None = None) -> HostBackend:
        """A stand-in GPU; with `capacity` (bytes) its arrays and weights are counted against it and an allocation
        past it raises OutOfMemoryError, as CuPy does on a full GPU."""
        return cls("fake-gpu", device=True, capacity=capacity)

    def free_bytes(self) -> int | None:
        """Bytes a device has free: a fake device's capacity less what it holds; None without a capacity (the
        host, an unlimited fake device)."""
        return None if self.capacity is None else self.capacity - self.used

    def _take(self, nbytes: int) -> None:
        if self.capacity is not None:
            if self.used + nbytes > self.capacity:
                raise OutOfMemoryError(f"out of memory allocating {nbytes:,} bytes "
                                       f"({self.capacity - self.used:,} of {self.capacity:,} free)")
            self.used += nbytes

    def _held(self, a):
        """`a`, counted against the capacity until it is freed."""
        if self.capacity is not None:
            for x in a if isinstance(a, tuple) else (a,):
                self._take(x.nbytes)
                weakref.finalize(x, self._give, x.nbytes)
        return a

    def _give(self, nbytes: int) -> None:
        self.used -= nbytes

    def _alloc(self, make, shape, dtype):
        if self.capacity is not None:
            n = int(np.prod(shape)) * np.dtype(dtype).itemsize
            self._take(n)  # refused before the host allocates
            a = make(shape, dtype)
            weakref.finalize(a, self._give, n)
            return a
        return make(shape, dtype)

    def activate(self):
        return contextlib.nullcontext()

    def counters(self) -> tuple[int, int, int, int]:
        return self.h2d, self.h2d_bytes, self.d2h, self.d2h_bytes

    # arrays
    def empty(self, shape, dtype=np.float32):
        return self._alloc(np.empty, shape, dtype)

    def zeros(self, shape, dtype=np.float32):
        return self._alloc(np.zeros, shape, dtype)

    def upload(self, a: np.ndarray):
        if not self.device:
            return np.ascontiguousarray(a)
        self._take(a.nbytes)  # refused before the copy
        b = np.array(a, copy=True)
        if self.capacity is not None:
            weakref.finalize(b, self._give, b.nbytes)
        return b

    def contiguous(self, a):
        return np.ascontiguousarray(a)

    def concat(self, arrays):
        return np.concatenate(arrays)

    def linear(self, cpu_weights, tensors, name: str):
        """Weights for matmul: the CPU model's packed matrix or Linear (shared, not copied; a fake device with a
        capacity counts the tensors' bytes, as a GPU would hold them, for as long as it lives)."""
        if self.device:
            self._take(sum(int(t.data.nbytes) for t in tensors))
        return cpu_weights

    def view(self, buf, offset: int, shape, dtype):
        n = int(np.prod(shape)) * np.dtype(dtype).itemsize
        return buf[offset : offset + n].view(dtype).reshape(shape)

    def bytes_of(self, a):
        return a.reshape(-1).view(np.uint8)

    def take_rows(self, x, rows_host: np.ndarray, rows_dev):
        return np.ascontiguousarray(x[rows_host])

    # transfers (staged through pinned host buffers on a real GPU)
    def pinned(self, nbytes: int) -> np.ndarray:
        return np.empty(nbytes, np.uint8)

    def to_host(self, src, dst: np.ndarray) -> None:
        np.copyto(dst, src)
        self.d2h += 1
        self.d2h_bytes += dst.nbytes

    def to_device(self, src: np.ndarray, dst) -> None:
        np.copyto(dst, src)
        self.h2d += 1
        self.h2d_bytes += src.nbytes

    def wait(self) -> None:
        pass

    # kernels (the CPU kernels' signatures)
    def matmul(self, w, x, out, accumulate: bool = False) -> None:
        """out (+)= x W^T; w a PackedMatrix or a Linear (linear.py; parts side by side). Accumulation goes
        through a temporary, as the CPU model's `x += L.wo(a)` did, so the bits are the same."""
        parts = [w] if isinstance(w, cpu_quant.PackedMatrix) else w.parts
        if len(parts) == 1 and not accumulate:
            cpu_quant.matmul(parts[0], x, out)
            return
        off = 0
        for p in parts:
            tmp = np.empty((x.shape[0], p.n_rows), np.float32)
            cpu_quant.matmul(p, x, tmp)
            if accumulate:
                out[:, off : off + p.n_rows] += tmp
            else:
                out[:, off : off + p.n_rows] = tmp
            off += p.n_rows

    def dequantize_rows(self, w, rows, out) -> None:
        cpu_quant.dequantize_rows(w, rows, out)

    def rmsnorm(self, x, w, eps, out) -> None:
        f = cpu_ops.rmsnorm_parallel if x.shape[0] >= PARALLEL_ROWS else cpu_ops.rmsnorm
        if out.flags.c_contiguous:
            f(x, w, eps, out)
            return
        # columns of a wider array (the MTP head's concatenated norms): through a C-contiguous temporary, so
        # each kernel compiles for one layout (a cold start compiled rmsnorm four times, rmsnorm_parallel three)
        tmp = np.empty(out.shape, np.float32)
        f(x, w, eps, tmp)
        out[...] = tmp

    def rmsnorm_heads(self, x, w, eps) -> None:
        cpu_ops.rmsnorm_heads(x, w, eps)

    def rope(self, x, positions, cos, sin, n_rot, neox) -> None:
        cpu_ops.rope(x, positions, cos, sin, n_rot, neox)

    def attention(self, q, kt, vc, pos0, scale, out, scores=None) -> None:
        T, H, _ = q.shape
        if scores is None or scores.shape[0] < T * H or scores.shape[1] < pos0 + T:
            scores = np.empty((T * H, pos0 + T), np.float32)
        cpu_ops.attention_kv(q, kt, vc, pos0, np.float32(scale), out, scores)

    def swiglu(self, gu, out) -> None:
        cpu_ops.swiglu(gu, out)

    def softmax_topk(self, logits, k, renorm, ids, weights) -> None:
        cpu_ops.softmax_topk(logits, k, renorm, ids, weights)

    def add(self, x, y) -> None:
        x += y

    def kv_zeros(self, n_kv_heads: int, head_dim: int, n_ctx: int, kv: KVTypes = F32_KV):
        """A layer's cache as attention takes it (guild/engine/state.py KVCache): keys in tiles
        (kernels/cpu/ops.KV_TILE), values per position; each a float32 array, f16 bits (uint16), or a q8_0 pair
        (int8 quants, f16 scale bits per 32 values along head_dim)."""
        n = cpu_ops.key_tiles(n_ctx)
        kt = self._held(_host_operand(kv.k, (n_kv_heads, n, head_dim, cpu_ops.KV_TILE)))
        return kt, self._held(_host_operand(kv.v, (n_kv_heads, n * cpu_ops.KV_TILE, head_dim)))

    def kv_write(self, kt, vc, k, v, pos0) -> None:
        """Rows k, v [T, Hkv, hd] at positions pos0.. of a layer's operands, converted to their stored types."""
        T = k.shape[0]
        for op, x, tiled in ((kt, k, True), (vc, v, False)):
            for part, y in _stored_parts(op, x):
                if tiled:
                    cpu_ops.put_keys(part, pos0, y.transpose(1, 2, 0))
                else:
                    part[:, pos0 : pos0 + T] = y.transpose(1, 0, 2)

    def split_qkv(self, qkv, H, Hkv, hd):
        """q, k, v [R, heads, hd] from the fused [R, (H + 2 Hkv) hd] output (contiguous copies, as the CPU
        model makes them)."""
        R = qkv.shape[0]
        q = np.ascontiguousarray(qkv[:, : H * hd]).reshape(R, H, hd)
        k = np.ascontiguousarray(qkv[:, H * hd : (H + Hkv) * hd]).reshape(R, Hkv, hd)
        v = np.ascontiguousarray(qkv[:, (H + Hkv) * hd :]).reshape(R, Hkv, hd)
        return q, k, v

    # Gated DeltaNet (kernels/cpu/deltanet.py)
    def gdn_gates(self, alpha, b, dt_bias, a, g, beta) -> None:
        cpu_gdn.gdn_gates(alpha, b, dt_bias, a, g, beta)

    def conv1d_silu(self, x, hist, wt, out) -> None:
        cpu_gdn.conv1d_silu(x, hist, wt, out)

    def l2norm_heads(self, x, eps) -> None:
        cpu_gdn.l2norm_heads(x, eps)

    def gdn_recurrence(self, q, k, v, g, beta, kmap, scale, pool, src, dst, out) -> None:
        with clocked(self.clock, "gdn_recurrence"):
            cpu_gdn.gdn_recurrence(q, k, v, g, beta, kmap, scale, pool, src, dst, out)

    def gated_rmsnorm(self, x, z, w, eps, out) -> None:
        cpu_gdn.gated_rmsnorm(x, z, w, eps, out)

    def sigmoid_mul(self, x, gate, out) -> None:
        cpu_gdn.sigmoid_mul(x, gate, out)


HOST = HostBackend()  # the CPU itself: what every CPU model runs on


def _host_operand(name: str, shape):
    """Zeros of a host KV operand of a stored type (head_dim on axis 2: a q8_0 pair's scales have a 32nd of it)."""
    if name == "q8_0":
        return np.zeros(shape, np.int8), np.zeros((*shape[:2], shape[2] // 32, *shape[3:]), np.uint16)
    return np.zeros(shape, np.float32 if name == "f32" else np.uint16)


def _stored_parts(op, x: np.ndarray):
    """(array of the operand, rows [T, Hkv, X] to store in it) for rows x [T, Hkv, hd] of float32: as they
    are, as f16 bits, or as q8_0 quants and scale bits (kernels/cpu/ops.kv_quantize_q8_0)."""
    if isinstance(op, tuple):
        T, Hkv, hd = x.shape
        qs = np.empty((T * Hkv, hd), np.int8)
        d = np.empty((T * Hkv, hd // 32), np.float32)
        cpu_ops.kv_quantize_q8_0(np.ascontiguousarray(x, np.float32).reshape(T * Hkv, hd), qs, d)
        return [(op[0], qs.reshape(T, Hkv, hd)), (op[1], d.astype(np.float16).view(np.uint16).reshape(T, Hkv, -1))]
    if op.dtype == np.uint16:
        return [(op, x.astype(np.float16).view(np.uint16))]
    return [(op, x)]

