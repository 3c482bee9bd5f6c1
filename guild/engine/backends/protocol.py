"""The Backend protocol every architecture's forward and the Layout are written against (the CPU kernels'
signatures), and TimedBackend, any backend with its ops counted on a KernelClock."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np

from ...kvtypes import F32_KV, KVTypes
from .clock import KernelClock


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
    def free_bytes(self) -> int | None: ...

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

    # the Protocol's data members, the inner backend's live values: from Python 3.12 isinstance() looks members up
    # statically (inspect.getattr_static), never through __getattr__
    name, device, h2d, d2h, h2d_bytes, d2h_bytes = (property(lambda self, n=n: getattr(self.inner, n))
                                                    for n in ("name", "device", "h2d", "d2h", "h2d_bytes", "d2h_bytes"))

    def __getattr__(self, name: str):  # anything else the inner backend has
        return getattr(self.inner, name)

