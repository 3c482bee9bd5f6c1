"""The backends the GPU engine's window forward (guild.engine.cuda) is written against: the CPU kernels'
signatures, allocation and staged transfers. `CudaBackend` runs them on a GPU (CuPy RawKernels from
kernels/cuda/); `HostBackend` runs them with the CPU kernels on NumPy arrays, both for the layers a placement
leaves on the CPU and, as a separate instance (`HostBackend.fake_device()`), as a stand-in GPU in CPU tests,
where the same orchestration, transfers included (counted), must give bitwise the CPU model's logits."""

from __future__ import annotations

import contextlib

import numpy as np

from ..kernels.cpu import ops as cpu_ops
from ..kernels.cpu import quant as cpu_quant
from ..kernels.cuda import ops as kops
from ..models.llama import fuse


class HostBackend:
    """NumPy arrays and the CPU kernels. `device=False`: the host itself (arrays are shared with the caller);
    `device=True` (`fake_device()`): a stand-in GPU whose transfers copy and are counted, for CPU tests."""

    def __init__(self, name: str = "cpu", device: bool = False):
        self.name, self.device = name, device
        self.h2d = self.d2h = 0  # transfers and their bytes (fake device only)
        self.h2d_bytes = self.d2h_bytes = 0

    @classmethod
    def fake_device(cls) -> HostBackend:
        return cls("fake-gpu", device=True)

    def activate(self):
        return contextlib.nullcontext()

    # arrays
    def empty(self, shape, dtype=np.float32):
        return np.empty(shape, dtype)

    def zeros(self, shape, dtype=np.float32):
        return np.zeros(shape, dtype)

    def upload(self, a: np.ndarray):
        return np.array(a, copy=True) if self.device else np.ascontiguousarray(a)

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
        if isinstance(w, cpu_quant.PackedMatrix):
            if accumulate:
                tmp = np.empty(out.shape, np.float32)
                cpu_quant.matmul(w, x, tmp)
                out += tmp
            else:
                cpu_quant.matmul(w, x, out)
        else:  # models.llama.Linear (parts of different quant types)
            y = w(x)
            if accumulate:
                out += y
            else:
                out[...] = y

    def dequantize_rows(self, w, rows, out) -> None:
        cpu_quant.dequantize_rows(w, rows, out)

    def rmsnorm(self, x, w, eps, out) -> None:
        cpu_ops.rmsnorm(x, w, eps, out)

    def rmsnorm_heads(self, x, w, eps) -> None:
        cpu_ops.rmsnorm_heads(x, w, eps)

    def rope(self, x, positions, cos, sin, n_rot, neox) -> None:
        cpu_ops.rope(x, positions, cos, sin, n_rot, neox)

    def attention(self, q, kt, vc, pos0, scale, out) -> None:
        T, H, _ = q.shape
        scores = np.empty((T * H, pos0 + T), np.float32)
        cpu_ops.attention(q, kt, vc, pos0, np.float32(scale), out, scores)

    def swiglu(self, gu, out) -> None:
        cpu_ops.swiglu(gu, out)

    def softmax_topk(self, logits, k, renorm, ids, weights) -> None:
        cpu_ops.softmax_topk(logits, k, renorm, ids, weights)

    def add(self, x, y) -> None:
        x += y

    def kv_write(self, kt, vc, k, v, pos0) -> None:
        T = k.shape[0]
        kt[:, :, pos0 : pos0 + T] = k.transpose(1, 2, 0)
        vc[:, pos0 : pos0 + T] = v.transpose(1, 0, 2)

    def split_qkv(self, qkv, H, Hkv, hd):
        """q, k, v [R, heads, hd] from the fused [R, (H + 2 Hkv) hd] output (contiguous copies, as the CPU
        model makes them)."""
        R = qkv.shape[0]
        q = np.ascontiguousarray(qkv[:, : H * hd]).reshape(R, H, hd)
        k = np.ascontiguousarray(qkv[:, H * hd : (H + Hkv) * hd]).reshape(R, Hkv, hd)
        v = np.ascontiguousarray(qkv[:, (H + Hkv) * hd :]).reshape(R, Hkv, hd)
        return q, k, v


class DeviceLinear:
    """One or more GPU matrices sharing an input, fused when their quant types agree (as models.llama.Linear)."""

    def __init__(self, tensors, pack):
        self.n_out, self.n_in, self.parts = fuse(tensors, pack)
        self.nbytes = sum(p.nbytes for p in self.parts)


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

    def empty(self, shape, dtype=np.float32):
        return self.cp.empty(shape, dtype)

    def zeros(self, shape, dtype=np.float32):
        return self.cp.zeros(shape, dtype)

    def upload(self, a: np.ndarray):
        return self.cp.asarray(np.ascontiguousarray(a))

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

    def matmul(self, w: DeviceLinear, x, out, accumulate: bool = False) -> None:
        off = 0
        for p in w.parts:
            self.k.matmul(p, x, out if len(w.parts) == 1 else out[:, off : off + p.n_rows], accumulate)
            off += p.n_rows

    def dequantize_rows(self, w: DeviceLinear, rows, out) -> None:
        self.k.dequantize_rows(w.parts[0], rows, out)

    def rmsnorm(self, x, w, eps, out) -> None:
        self.k.rmsnorm(x, w, eps, out)

    def rmsnorm_heads(self, x, w, eps) -> None:
        self.k.rmsnorm_heads(x, w, eps)

    def rope(self, x, positions, cos, sin, n_rot, neox) -> None:
        self.k.rope(x, positions, cos, sin, n_rot, neox)

    def attention(self, q, kt, vc, pos0, scale, out) -> None:
        self.k.attention(q, kt, vc, pos0, scale, out)

    def swiglu(self, gu, out) -> None:
        self.k.swiglu(gu, out)

    def softmax_topk(self, logits, k, renorm, ids, weights) -> None:
        self.k.softmax_topk(logits, k, renorm, ids, weights)

    def add(self, x, y) -> None:
        self.k.add(x, y)

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
