"""The backends every architecture's one window forward (guild/models/) is written against: the CPU kernels'
signatures, allocation and staged transfers, plus the Layout that says which backend holds each layer.

`HostBackend` runs the CPU kernels on NumPy arrays: the shared instance `HOST` is what a CPU model runs on (its
arrays are the caller's, its weights the CPU model's packed matrices), and `HostBackend.fake_device()` is a
stand-in GPU for CPU tests whose transfers copy and are counted, so the same orchestration must give bitwise
the CPU model's logits. `CudaBackend` runs the kernels of kernels/cuda/ on CuPy arrays (one non-blocking stream,
pinned staging buffers). A model placed by guild.engine.gpu is the same model object with a device Layout and
device twins of the layers placed there; its forward is the CPU model's, line for line.
"""

from __future__ import annotations

import contextlib
import time
from typing import Protocol, runtime_checkable

import numpy as np

from ..kernels.cpu import deltanet as cpu_gdn
from ..kernels.cpu import ops as cpu_ops
from ..kernels.cpu import quant as cpu_quant
from ..kernels.cpu.moe import experts_ffn, moe_ffn
from ..kernels.cuda import ops as kops
from ..kvtypes import F32_KV, KVTypes

_ALIGN = 256  # staging buffer sections start on this many bytes
PARALLEL_ROWS = 16  # row-wise host ops (rmsnorm) run on one thread below this many rows: waking the others costs more


def _align(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


class KernelClock:
    """Seconds spent inside kernels, by name. The host attributes its costliest ones while attached to it
    (`HOST.clock`, by guild.engine.timing): "experts" (the routed experts, kernels/cpu/moe) and
    "gdn_recurrence"; HOST.clock is None otherwise and nothing is timed. A TimedBackend on the clock adds every
    backend op by its name. A span inside another counts toward the outer one only, so nothing counts twice."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self._depth = 0

    def reset(self) -> None:
        self.seconds.clear()

    def ms(self) -> dict[str, float]:
        return {k: v * 1e3 for k, v in self.seconds.items()}

    @contextlib.contextmanager
    def span(self, name: str):
        self._depth += 1
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self._depth -= 1
            if not self._depth:
                self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t0

    def timed(self, name: str, fn):
        """fn, its calls counted under name."""

        def call(*args, **kwargs):
            with self.span(name):
                return fn(*args, **kwargs)

        return call


_UNTIMED = contextlib.nullcontext()  # reusable: it holds no state


def _span(clock: KernelClock | None, name: str):
    return _UNTIMED if clock is None else clock.span(name)


@runtime_checkable
class Backend(Protocol):
    """What an architecture's forward and the Layout call on a backend: allocation, staged transfers and the
    kernels, with the CPU kernels' signatures. HostBackend and CudaBackend implement exactly these
    (tests/gpu/test_gpu_host.py checks both against this list); arrays are NumPy on the host, CuPy on a GPU."""

    name: str  # the key of a layout's rope tables and window metadata
    device: bool  # False: the host itself, whose arrays are the caller's
    h2d: int
    d2h: int
    h2d_bytes: int
    d2h_bytes: int

    def activate(self): ...

    def counters(self) -> tuple[int, int, int, int]: ...

    # arrays
    def empty(self, shape, dtype=np.float32): ...

    def zeros(self, shape, dtype=np.float32): ...

    def upload(self, a: np.ndarray): ...

    def contiguous(self, a): ...

    def concat(self, arrays): ...

    def linear(self, cpu_weights, tensors, name: str): ...

    def view(self, buf, offset: int, shape, dtype): ...

    def bytes_of(self, a): ...

    def take_rows(self, x, rows_host: np.ndarray, rows_dev): ...

    # transfers
    def pinned(self, nbytes: int) -> np.ndarray: ...

    def to_host(self, src, dst: np.ndarray) -> None: ...

    def to_device(self, src: np.ndarray, dst) -> None: ...

    def wait(self) -> None: ...

    # kernels
    def matmul(self, w, x, out, accumulate: bool = False) -> None: ...

    def dequantize_rows(self, w, rows, out) -> None: ...

    def rmsnorm(self, x, w, eps, out) -> None: ...

    def rmsnorm_heads(self, x, w, eps) -> None: ...

    def rope(self, x, positions, cos, sin, n_rot, neox) -> None: ...

    def attention(self, q, kt, vc, pos0, scale, out, scores=None) -> None: ...

    def swiglu(self, gu, out) -> None: ...

    def softmax_topk(self, logits, k, renorm, ids, weights) -> None: ...

    def add(self, x, y) -> None: ...

    def kv_zeros(self, n_kv_heads: int, head_dim: int, n_ctx: int, kv: KVTypes = F32_KV): ...

    def kv_write(self, kt, vc, k, v, pos0) -> None: ...

    def split_qkv(self, qkv, H, Hkv, hd): ...

    # Gated DeltaNet
    def gdn_gates(self, alpha, b, dt_bias, a, g, beta) -> None: ...

    def conv1d_silu(self, x, hist, wt, out) -> None: ...

    def l2norm_heads(self, x, eps) -> None: ...

    def gdn_recurrence(self, q, k, v, g, beta, kmap, scale, pool, src, dst, out) -> None: ...

    def gated_rmsnorm(self, x, z, w, eps, out) -> None: ...

    def sigmoid_mul(self, x, gate, out) -> None: ...


def backend_ops() -> tuple[str, ...]:
    """The Backend Protocol's ops, in declaration order."""
    return tuple(n for n, v in vars(Backend).items() if callable(v) and not n.startswith("_"))


class TimedBackend:
    """Another backend whose every op (backend_ops) is counted on a KernelClock under its own name: a
    forward's per-op split, measured by running it on this (guild.engine.timing) with the kernels untouched.
    The ops' results, and so the bits, are the inner backend's."""

    def __init__(self, inner: Backend, clock: KernelClock):
        self.inner, self.clock = inner, clock
        for op in backend_ops():
            setattr(self, op, clock.timed(op, getattr(inner, op)))

    def __getattr__(self, name: str):  # name, device and the transfer counters: the inner backend's
        return getattr(self.inner, name)


class HostBackend:
    """NumPy arrays and the CPU kernels. `device=False`: the host itself (arrays are shared with the caller);
    `device=True` (`fake_device()`): a stand-in GPU whose transfers copy and are counted, for CPU tests."""

    clock: KernelClock | None = None  # set only while guild.engine.timing measures a window

    def __init__(self, name: str = "cpu", device: bool = False):
        self.name, self.device = name, device
        self.h2d = self.d2h = 0  # transfers and their bytes (fake device only)
        self.h2d_bytes = self.d2h_bytes = 0

    @classmethod
    def fake_device(cls) -> HostBackend:
        return cls("fake-gpu", device=True)

    def activate(self):
        return contextlib.nullcontext()

    def counters(self) -> tuple[int, int, int, int]:
        return self.h2d, self.h2d_bytes, self.d2h, self.d2h_bytes

    # arrays
    def empty(self, shape, dtype=np.float32):
        return np.empty(shape, dtype)

    def zeros(self, shape, dtype=np.float32):
        return np.zeros(shape, dtype)

    def upload(self, a: np.ndarray):
        return np.array(a, copy=True) if self.device else np.ascontiguousarray(a)

    def contiguous(self, a):
        return np.ascontiguousarray(a)

    def concat(self, arrays):
        return np.concatenate(arrays)

    def linear(self, cpu_weights, tensors, name: str):
        """Weights for matmul: the CPU model's packed matrix or Linear (shared, not copied)."""
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
        """out (+)= x W^T; w a PackedMatrix or a models.llama.Linear (parts side by side). Accumulation goes
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
        (cpu_ops.rmsnorm_parallel if x.shape[0] >= PARALLEL_ROWS else cpu_ops.rmsnorm)(x, w, eps, out)

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
        return (_host_operand(kv.k, (n_kv_heads, n, head_dim, cpu_ops.KV_TILE)),
                _host_operand(kv.v, (n_kv_heads, n * cpu_ops.KV_TILE, head_dim)))

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
        with _span(self.clock, "gdn_recurrence"):
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


class DeviceLinear:
    """One or more GPU matrices sharing an input, fused when their quant types agree (as models.llama.Linear)."""

    def __init__(self, tensors, pack):
        self.n_out, self.n_in = sum(t.shape[0] for t in tensors), tensors[0].shape[1]
        groups = [list(tensors)] if len({t.qtype for t in tensors}) == 1 else [[t] for t in tensors]
        self.parts = [pack(g[0].qtype, g[0].data if len(g) == 1 else np.concatenate([t.data for t in g]),
                           sum(t.shape[0] for t in g), self.n_in) for g in groups]
        self.nbytes = sum(p.nbytes for p in self.parts)

    @property
    def n_rows(self) -> int:  # as a PackedMatrix (output features)
        return self.n_out


class CudaBackend:
    """CuPy arrays on one GPU, the kernels of kernels/cuda/, one non-blocking stream, pinned staging buffers."""

    def __init__(self, index: int = 0):
        import cupy  # optional: guild[gpu]

        self.cp, self.k = cupy, kops
        self.name, self.device = f"cuda:{index}", True
        self.h2d = self.d2h = self.h2d_bytes = self.d2h_bytes = 0
        self._dev = cupy.cuda.Device(index)
        with self._dev:
            self.stream = cupy.cuda.Stream(non_blocking=True)

    @contextlib.contextmanager
    def activate(self):
        with self._dev, self.stream:
            yield

    def counters(self) -> tuple[int, int, int, int]:
        return self.h2d, self.h2d_bytes, self.d2h, self.d2h_bytes

    def empty(self, shape, dtype=np.float32):
        return self.cp.empty(shape, dtype)

    def zeros(self, shape, dtype=np.float32):
        return self.cp.zeros(shape, dtype)

    def upload(self, a: np.ndarray):
        return self.cp.asarray(np.ascontiguousarray(a))

    def contiguous(self, a):
        return self.cp.ascontiguousarray(a)

    def concat(self, arrays):
        return self.cp.concatenate(arrays)

    def linear(self, cpu_weights, tensors, name: str):
        for t in tensors:
            self.k.check_matrix(t.qtype, t.shape[0], t.shape[1], t.name)
        return DeviceLinear(tensors, self.k.pack)

    def view(self, buf, offset: int, shape, dtype):
        n = int(np.prod(shape)) * np.dtype(dtype).itemsize
        return buf[offset : offset + n].view(dtype).reshape(shape)

    def bytes_of(self, a):
        return a.reshape(-1).view(self.cp.uint8)

    def take_rows(self, x, rows_host: np.ndarray, rows_dev):
        return self.cp.take(x, rows_dev, axis=0)

    def pinned(self, nbytes: int) -> np.ndarray:
        mem = self.cp.cuda.alloc_pinned_memory(max(int(nbytes), 1))
        return np.frombuffer(mem, np.uint8, int(nbytes))  # keeps `mem` alive

    @staticmethod
    def _addr(a) -> int:
        return a.data.ptr

    def to_host(self, src, dst: np.ndarray) -> None:
        rt = self.cp.cuda.runtime
        rt.memcpyAsync(dst.ctypes.data, self._addr(src), dst.nbytes, rt.memcpyDeviceToHost, self.stream.ptr)
        self.d2h += 1
        self.d2h_bytes += dst.nbytes

    def to_device(self, src: np.ndarray, dst) -> None:
        rt = self.cp.cuda.runtime
        rt.memcpyAsync(self._addr(dst), src.ctypes.data, src.nbytes, rt.memcpyHostToDevice, self.stream.ptr)
        self.h2d += 1
        self.h2d_bytes += src.nbytes

    def wait(self) -> None:
        self.stream.synchronize()

    def matmul(self, w, x, out, accumulate: bool = False) -> None:
        parts = w.parts if isinstance(w, DeviceLinear) else [w]
        off = 0
        for p in parts:
            self.k.matmul(p, x, out if len(parts) == 1 else out[:, off : off + p.n_rows], accumulate)
            off += p.n_rows

    def dequantize_rows(self, w, rows, out) -> None:
        self.k.dequantize_rows(w.parts[0] if isinstance(w, DeviceLinear) else w, rows, out)

    def rmsnorm(self, x, w, eps, out) -> None:
        self.k.rmsnorm(x, w, eps, out)

    def rmsnorm_heads(self, x, w, eps) -> None:
        self.k.rmsnorm_heads(x, w, eps)

    def rope(self, x, positions, cos, sin, n_rot, neox) -> None:
        self.k.rope(x, positions, cos, sin, n_rot, neox)

    def attention(self, q, kt, vc, pos0, scale, out, scores=None) -> None:
        self.k.attention(q, kt, vc, pos0, scale, out)

    def swiglu(self, gu, out) -> None:
        self.k.swiglu(gu, out)

    def softmax_topk(self, logits, k, renorm, ids, weights) -> None:
        self.k.softmax_topk(logits, k, renorm, ids, weights)

    def add(self, x, y) -> None:
        self.k.add(x, y)

    def kv_zeros(self, n_kv_heads: int, head_dim: int, n_ctx: int, kv: KVTypes = F32_KV):
        """A layer's cache as the CUDA attention takes it: keys transposed [Hkv, hd, ctx], values per position
        [Hkv, ctx, hd], in the stored types of `kv` (kernels/cuda/attention.cu)."""
        def zeros(name: str, shape, scales):
            if name == "q8_0":
                return self.cp.zeros(shape, np.int8), self.cp.zeros(scales, np.uint16)
            return self.cp.zeros(shape, np.float32 if name == "f32" else np.uint16)

        Hkv, hd = n_kv_heads, head_dim
        return (zeros(kv.k, (Hkv, hd, n_ctx), (Hkv, hd // 32, n_ctx)),
                zeros(kv.v, (Hkv, n_ctx, hd), (Hkv, n_ctx, hd // 32)))

    def kv_write(self, kt, vc, k, v, pos0) -> None:
        self.k.kv_write(kt, vc, k, v, pos0)

    def split_qkv(self, qkv, H, Hkv, hd):
        """Views into the fused output (the kernels take row strides): no copies, no launches."""
        R = qkv.shape[0]
        q = qkv[:, : H * hd].reshape(R, H, hd)
        k = qkv[:, H * hd : (H + Hkv) * hd].reshape(R, Hkv, hd)
        v = qkv[:, (H + Hkv) * hd :].reshape(R, Hkv, hd)
        # rope and QK-norm work in place: a reshape that copied would silently lose them
        base = self._addr(qkv)
        for a, off in ((q, 0), (k, H * hd), (v, (H + Hkv) * hd)):
            if self._addr(a) != base + 4 * off or (R > 1 and a.strides[0] != qkv.strides[0]):
                raise RuntimeError("split_qkv: reshape copied instead of returning a view")
        return q, k, v

    # Gated DeltaNet (kernels/cuda/deltanet.cu)
    def gdn_gates(self, alpha, b, dt_bias, a, g, beta) -> None:
        self.k.gdn_gates(alpha, b, dt_bias, a, g, beta)

    def conv1d_silu(self, x, hist, wt, out) -> None:
        self.k.conv1d_silu(x, hist, wt, out)

    def l2norm_heads(self, x, eps) -> None:
        self.k.l2norm_heads(x, eps)

    def gdn_recurrence(self, q, k, v, g, beta, kmap, scale, pool, src, dst, out) -> None:
        self.k.gdn_recurrence(q, k, v, g, beta, kmap, scale, pool, src, dst, out)

    def gated_rmsnorm(self, x, z, w, eps, out) -> None:
        self.k.gated_rmsnorm(x, z, w, eps, out)

    def sigmoid_mul(self, x, gate, out) -> None:
        self.k.sigmoid_mul(x, gate, out)


# ---------------------------------------------------------------------------------------------------------
class _Staging:
    """A growable host buffer (pinned on a GPU) and, if `with_dev`, its device twin; reused across windows.
    Reuse is safe: every window ends waiting for the stream, and within a window each reuse comes after a
    wait that orders it behind the previous use."""

    def __init__(self, with_dev: bool = True):
        self.with_dev = with_dev
        self.dev = self.host = None
        self.size = 0

    def get(self, be, nbytes: int):
        if nbytes > self.size:
            self.size = max(nbytes, 2 * self.size)
            self.dev = be.empty((self.size,), np.uint8) if self.with_dev and be.device else None
            self.host = be.pinned(self.size)
        return self.dev, self.host


class Layout:
    """Where a model's parts run: a backend per layer, for the embedding lookup and for the output head (the
    final norm and LM head), rope tables per backend, and the staging buffers of the transfers between them.
    A CPU model's layout is HOST everywhere (`Layout.host`) and moves nothing; guild.engine.gpu builds a
    device layout from a placement. Transfers happen only here: the window's indices (one H2D per device),
    the residual rows at a placement boundary, the MoE rows to the CPU experts and back, the logits, and the
    final hidden rows when a consumer reads them (DeviceRows)."""

    def __init__(self, layer_be, embed_be, out_be, rope: dict, head_be=None):
        self.layer_be = list(layer_be)
        self.embed_be, self.out_be = embed_be, out_be
        self.head_be = head_be or out_be  # where an MTP head's block, norms and draft LM head run
        self.rope = rope  # backend name -> (cos, sin)
        seen = {}
        for be in (*self.layer_be, embed_be, out_be, self.head_be):
            if be.device:
                seen.setdefault(id(be), be)
        self.devices = list(seen.values())
        self._stage: dict = {}

    @classmethod
    def host(cls, n_layers: int, cos, sin) -> Layout:
        return cls([HOST] * n_layers, HOST, HOST, {HOST.name: (cos, sin)})

    def set_rope(self, cos, sin) -> None:
        """New rope tables on every backend that holds them, in place: an MTP head's layout shares the dict."""
        bes = {be.name: be for be in (*self.layer_be, self.embed_be, self.out_be, self.head_be)}
        for name in list(self.rope):
            with bes[name].activate():
                self.rope[name] = (bes[name].upload(cos), bes[name].upload(sin))

    def timed(self, clock: KernelClock) -> Layout:
        """This layout with each of its backends wrapped once in a TimedBackend on clock."""
        wrapped: dict[int, TimedBackend] = {}

        def w(be):
            if id(be) not in wrapped:
                wrapped[id(be)] = TimedBackend(be, clock)
            return wrapped[id(be)]

        return Layout([w(be) for be in self.layer_be], w(self.embed_be), w(self.out_be), self.rope, w(self.head_be))

    def stage(self, key: str, with_dev: bool = True) -> _Staging:
        s = self._stage.get(key)
        if s is None:
            s = self._stage[key] = _Staging(with_dev)
        return s

    def move(self, x, src, dst):
        """x [R, D] (contiguous float32) from backend src to dst, through a pinned host buffer."""
        if src is dst or (not src.device and not dst.device):
            return x
        nbytes = x.size * 4
        if src.device:
            with src.activate():
                _, host = self.stage("move", False).get(src, nbytes)
                src.to_host(src.bytes_of(x), host[:nbytes])
                src.wait()
            x_host = host[:nbytes].view(np.float32).reshape(x.shape).copy()
            if not dst.device:
                return x_host
            x = x_host
        with dst.activate():
            _, host = self.stage("move", False).get(dst, nbytes)
            host[:nbytes] = np.ascontiguousarray(x).reshape(-1).view(np.uint8)
            out = dst.empty(x.shape)
            dst.to_device(host[:nbytes], dst.bytes_of(out))
        return out

    def download(self, be, x) -> np.ndarray:
        """x (float32 on be) as a new host array; one counted D2H on a device."""
        if not be.device:
            return x
        nbytes = x.size * 4
        with be.activate():
            _, host = self.stage("down", False).get(be, nbytes)
            be.to_host(be.bytes_of(be.contiguous(x)), host[:nbytes])
            be.wait()
        return host[:nbytes].view(np.float32).reshape(x.shape).copy()

    def meta(self, tokens: np.ndarray, positions: np.ndarray, last: np.ndarray, extra=()) -> dict:
        """The window's token ids, positions and last-row indices (and `extra` int64 arrays: the states' per-row
        buffer indices) on every backend of the layout: one H2D per device. Returns backend name ->
        (tokens, positions, last, [extra...])."""
        extra = [np.asarray(e, np.int64) for e in extra]
        out = {HOST.name: (tokens, positions, last, extra)}
        if not self.devices:
            return out
        parts = [tokens, positions, last, *extra]
        flat = np.concatenate(parts).astype(np.int64)
        bounds = np.cumsum([0] + [p.size for p in parts])
        for dev in self.devices:
            with dev.activate():
                d, h = self.stage("meta").get(dev, flat.nbytes)
                h[: flat.nbytes] = flat.view(np.uint8)
                dev.to_device(h[: flat.nbytes], d[: flat.nbytes])
                md = d[: flat.nbytes].view(np.int64)
                views = [md[bounds[i] : bounds[i + 1]] for i in range(len(parts))]
                out[dev.name] = (views[0], views[1], views[2], views[3:])
        return out

    def moe_rows(self, be, R: int, D: int, k: int):
        """Where a MoE layer's FFN input rows [R, D] go: on a device, a view of the staging buffer that also
        holds the router's ids and weights, so that one D2H carries all three to the CPU experts."""
        if not be.device:
            return np.empty((R, D), np.float32)
        o_h = _align(R * k * 8) + _align(R * k * 4)
        buf, _ = self.stage("moe").get(be, o_h + R * D * 4)
        return be.view(buf, o_h, (R, D), np.float32)

    def routed_experts(self, be, h, router, experts_gu, experts_down, k: int, renorm: bool):
        """The routed-experts half of a MoE FFN over h [R, D] (from moe_rows, on be): the router runs on be,
        the experts always on the CPU. Returns (out [R, D] on be, distinct experts). On the host it is
        kernels/cpu/moe.moe_ffn (bitwise); on a device the ids, weights and rows go down in one D2H and the
        experts' output comes back in one H2D."""
        R, D = h.shape
        if not be.device:
            out = np.empty((R, D), np.float32)
            with _span(HOST.clock, "experts"):
                return out, moe_ffn(h, router, experts_gu, experts_down, k, renorm, out)
        o_w = _align(R * k * 8)
        o_h = o_w + _align(R * k * 4)
        nbytes = o_h + R * D * 4
        buf, host = self.stage("moe").get(be, nbytes)
        ids = be.view(buf, 0, (R, k), np.int64)
        w = be.view(buf, o_w, (R, k), np.float32)
        logits = be.empty((R, router.n_rows))
        be.matmul(router, h, logits)
        be.softmax_topk(logits, k, renorm, ids, w)
        be.to_host(buf[:nbytes], host[:nbytes])
        be.wait()  # the only wait of the layer: the experts need these rows
        hh = host[o_h:nbytes].view(np.float32).reshape(R, D)
        ww = host[o_w : o_w + R * k * 4].view(np.float32).reshape(R, k)
        ii = host[: R * k * 8].view(np.int64).reshape(R, k)
        fdev, fhost = self.stage("ffn").get(be, R * D * 4)
        out = fhost[: R * D * 4].view(np.float32).reshape(R, D)
        with _span(HOST.clock, "experts"):
            n = experts_ffn(hh, ii, ww, experts_gu, experts_down, out)
        be.to_device(fhost[: R * D * 4], fdev[: R * D * 4])
        return fdev[: R * D * 4].view(np.float32).reshape(R, D), n


class DeviceRows:
    """A window's final residual rows left on a device backend: nothing moves until a consumer reads them.
    Slicing gives another DeviceRows (no transfer); `np.asarray(rows)` (or `host()`) copies them to the host
    (one counted D2H); `on(be)` hands the device array to a consumer on the same backend (no transfer)."""

    def __init__(self, layout: Layout, be, x, r0: int, r1: int):
        self.layout, self.be, self.x, self.r0, self.r1 = layout, be, x, int(r0), int(r1)

    def __len__(self) -> int:
        return self.r1 - self.r0

    @property
    def shape(self) -> tuple[int, int]:
        return (self.r1 - self.r0, int(self.x.shape[1]))

    def __getitem__(self, s):
        if not isinstance(s, slice) or s.step not in (None, 1):
            raise TypeError("DeviceRows: only contiguous row slices")
        a, b, _ = s.indices(len(self))
        return DeviceRows(self.layout, self.be, self.x, self.r0 + a, self.r0 + max(a, b))

    def device(self):
        return self.x[self.r0 : self.r1]

    def host(self) -> np.ndarray:
        if self.r1 == self.r0:
            return np.empty((0, self.x.shape[1]), np.float32)
        return self.layout.download(self.be, self.device())

    def __array__(self, dtype=None, copy=None):
        a = self.host()
        return a if dtype is None else a.astype(dtype)

    def __array_function__(self, func, types, args, kwargs):
        """np.concatenate of rows that all live on this device stays there (no transfer: the MTP head catching
        up over several windows' rows on the same device); anything else reads them to the host first."""
        if func is np.concatenate and not kwargs:
            seq = list(args[0])
            if all(isinstance(r, DeviceRows) and r.be is self.be for r in seq):
                with self.be.activate():
                    x = self.be.concat([r.device() for r in seq])
                return DeviceRows(self.layout, self.be, x, 0, int(x.shape[0]))
            return np.concatenate([np.asarray(r) for r in seq], *args[1:])
        conv = [np.asarray(a) if isinstance(a, DeviceRows) else a for a in args]
        return func(*conv, **kwargs)


def rows_on(rows, be):
    """Hidden rows (a NumPy array or DeviceRows) as an array on backend be, moving them only if needed."""
    if isinstance(rows, DeviceRows):
        if rows.be is be:
            return rows.device()
        rows = rows.host()
    rows = np.ascontiguousarray(rows, np.float32)
    if not be.device:
        return rows
    return Layout([], HOST, HOST, {}).move(rows, HOST, be)
