"""The CUDA backend: CuPy arrays on one GPU, the kernels of kernels/cuda/, one non-blocking stream, pinned
staging buffers."""

from __future__ import annotations

import contextlib

import numpy as np

from ...kernels.cuda import ops as kops
from ...kvtypes import F32_KV, KVTypes
from .linear import DeviceLinear


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

    def free_bytes(self) -> int | None:
        """Bytes this GPU can still give: the driver's free memory and the blocks CuPy's pool holds unused."""
        with self._dev:
            free, _ = self.cp.cuda.runtime.memGetInfo()
        return int(free) + int(self.cp.get_default_memory_pool().free_bytes())

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

