"""The CUDA kernels with the CPU kernels' signatures (kernels/cpu/quant.py, kernels/cpu/ops/), on CuPy arrays.

Arrays are float32 (int64 for ids/positions/rows) CuPy arrays whose innermost axis is contiguous; the first
axis may have any stride (views of a fused q|k|v buffer need no copy). Kernels run on the current CuPy stream.
`matmul(..., accumulate=True)` adds into `out` (the residual update x += W a, one kernel instead of two).
Weights: `pack` uploads a matrix's GGUF bytes unchanged (DeviceMatrix); the kernels dequantise on the fly.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as Q

from ...errors import UnsupportedQuantTypeError
from ..quant_types import QUANT_TYPES, row_bytes
from . import kernel

ROWS = 8  # rows per block along y in quant.cu (ROWS)
WARPS = 4  # features per block in quant.cu (WARPS)
ATT_THREADS = 256  # attention.cu
_SUFFIX = {q: t.gpu for q, t in QUANT_TYPES.items() if t.gpu}  # kernels/cuda/quant.cu's `*_<suffix>`
QTYPES = tuple(_SUFFIX)


class DeviceMatrix:
    """A [n_rows, n_cols] weight matrix on the GPU in its GGUF bytes (row-major blocks)."""

    __slots__ = ("qtype", "n_rows", "n_cols", "row_bytes", "data", "suffix", "nbytes")

    def __init__(self, qtype: int, n_rows: int, n_cols: int, data):
        self.qtype, self.n_rows, self.n_cols = int(qtype), int(n_rows), int(n_cols)
        self.row_bytes = row_bytes(self.qtype, self.n_cols)
        self.data = data
        self.suffix = _SUFFIX[Q(self.qtype)]
        self.nbytes = int(data.nbytes)

    def __repr__(self) -> str:
        return f"DeviceMatrix({Q(self.qtype).name}, {self.n_rows}x{self.n_cols}, {self.nbytes} bytes)"


def check_matrix(qtype: int, n_rows: int, n_cols: int, name: str = "tensor") -> None:
    """Raise a GuildError if the GPU kernels cannot take this matrix."""
    qt = Q(int(qtype))
    if qt not in _SUFFIX:
        raise UnsupportedQuantTypeError(f"{name}: no GPU kernel for quant type {qt.name}")
    if n_cols % 8:
        raise UnsupportedQuantTypeError(f"{name}: row length {n_cols} is not a multiple of 8 (GPU kernels)")


def pack(qtype: int, raw: np.ndarray, n_rows: int, n_cols: int) -> DeviceMatrix:
    """Upload raw GGUF data of an [n_rows, n_cols] matrix (same bits)."""
    import cupy

    check_matrix(qtype, n_rows, n_cols)
    rb = row_bytes(int(qtype), int(n_cols))
    b = np.ascontiguousarray(raw).view(np.uint8).reshape(int(n_rows), rb)
    return DeviceMatrix(qtype, n_rows, n_cols, cupy.asarray(b))


def _ld(a, name: str) -> np.int64:
    """Row stride (elements) of a 2-D+ float32/int64 array whose inner axes are contiguous."""
    inner = a.itemsize
    for n, s in zip(reversed(a.shape[1:]), reversed(a.strides[1:]), strict=True):
        if n > 1 and s != inner:
            raise ValueError(f"{name}: inner axes must be contiguous (shape {a.shape}, strides {a.strides})")
        inner *= n
    return np.int64(a.strides[0] // a.itemsize)


def _f32(a, name: str) -> None:
    if a.dtype != np.float32:
        raise ValueError(f"{name}: float32 expected, got {a.dtype}")


def matmul(w: DeviceMatrix, x, out, accumulate: bool = False) -> None:
    """out[t, n] (+)= sum_k W[n, k] * x[t, k]. x [T, K], out [T, N] float32 (row strides free)."""
    T = x.shape[0]
    if x.ndim != 2 or x.shape[1] != w.n_cols or out.shape != (T, w.n_rows):
        raise ValueError(
            f"matmul: W is {w.n_rows}x{w.n_cols}, x {tuple(x.shape)}, out {tuple(out.shape)} "
            f"(want x [T, {w.n_cols}], out [T, {w.n_rows}])"
        )
    _f32(x, "matmul x")
    _f32(out, "matmul out")
    if T == 0:
        return
    grid = (-(-w.n_rows // WARPS), -(-T // ROWS))
    kernel("quant", "matmul_" + w.suffix)(
        grid, (32 * WARPS,),
        (w.data, np.int64(w.row_bytes), np.int32(w.n_rows), np.int32(w.n_cols), x, _ld(x, "x"), out,
         _ld(out, "out"), np.int32(T), np.int32(bool(accumulate))),
    )


def dequantize_rows(w: DeviceMatrix, rows, out) -> None:
    """out[r] = W[rows[r]] as float32 (embedding lookup); rows: int64 device array."""
    n = rows.shape[0]
    if out.shape != (n, w.n_cols):
        raise ValueError(f"dequantize_rows: out is {tuple(out.shape)}, want ({n}, {w.n_cols})")
    if rows.dtype != np.int64:
        raise ValueError("dequantize_rows: rows must be int64")
    if n:
        kernel("quant", "get_rows_" + w.suffix)(
            (n,), (128,), (w.data, np.int64(w.row_bytes), np.int32(w.n_cols), rows, out, _ld(out, "out"))
        )


def rmsnorm(x, w, eps, out) -> None:
    """out[t] = x[t] / sqrt(mean(x[t]^2) + eps) * w; x, out [T, D] (out may be x)."""
    T, D = x.shape
    if T:
        kernel("ops", "rmsnorm")((T,), (256,), (x, _ld(x, "x"), w, np.float64(eps), out, _ld(out, "out"),
                                                np.int32(D)))


def rmsnorm_heads(x, w, eps) -> None:
    """In place, every head vector of x [T, H, hd]."""
    T, H, hd = x.shape
    if T:
        kernel("ops", "rmsnorm_heads")((H, T), (32,), (x, _ld(x, "x"), np.int32(hd), w, np.float64(eps)))


def rope(x, positions, cos, sin, n_rot, neox) -> None:
    """In-place rotary embedding of x [T, H, hd] at positions (int64 device array [T]); cos/sin [ctx, n_rot/2]."""
    T, H, hd = x.shape
    half = int(n_rot) // 2
    if T and half:
        kernel("ops", "rope")(
            (-(-H * half // 128), T), (128,),
            (x, _ld(x, "x"), np.int32(H), np.int32(hd), positions, cos, sin, np.int32(half), np.int32(bool(neox))),
        )


def kv_type(op) -> str:
    """The stored type of a KV operand: a float32 array, f16 bits (uint16), or a q8_0 pair (int8 quants, f16
    scale bits per 32 values along head_dim)."""
    if isinstance(op, tuple):
        return "q8_0"
    return "f16" if op.dtype == np.uint16 else "f32"


def _kv_args(op, hd: int) -> tuple:
    """(values or quants, scale bits) of an operand; a float operand passes itself as its (unread) scales."""
    parts = op if isinstance(op, tuple) else (op, op)
    if not all(a.flags.c_contiguous for a in parts):
        raise ValueError("the KV cache arrays must be contiguous")
    if isinstance(op, tuple) and hd % 32:  # a q8_0 block is 32 values along head_dim (a warp in kv_write)
        raise ValueError(f"a q8_0 KV cache needs a head_dim that is a multiple of 32, got {hd}")
    return parts


def attention(q, kt, vc, pos0, scale, out, scores=None) -> None:
    """Causal GQA attention of q [T, H, hd] (positions pos0..pos0+T-1) over the keys kt [Hkv, hd, ctx] and values
    vc [Hkv, ctx, hd] of any stored type (kv_type); out [T, H, hd]. `scores` (the CPU kernel's scratch) is not
    needed here."""
    T, H, hd = q.shape
    kq, ks = _kv_args(kt, hd)
    vq, vs = _kv_args(vc, hd)
    Hkv, _, ctx = kq.shape
    if hd > ATT_THREADS:
        raise ValueError(f"attention: head_dim {hd} > {ATT_THREADS} is not supported on the GPU")
    if T:
        kernel("attention", f"attention_{kv_type(kt)}_{kv_type(vc)}")(
            (H, T), (ATT_THREADS,),
            (q, _ld(q, "q"), kq, ks, vq, vs, out, _ld(out, "out"), np.int32(H), np.int32(Hkv), np.int32(hd),
             np.int32(ctx), np.int32(pos0), np.float32(scale)),
        )


def swiglu(gu, out) -> None:
    """out = silu(gu[:, :F]) * gu[:, F:]."""
    R, F = out.shape
    if R:
        kernel("ops", "swiglu")((-(-F // 256), R), (256,), (gu, _ld(gu, "gu"), out, _ld(out, "out"), np.int32(F)))


def add(x, y) -> None:
    """x += y, [R, D]."""
    R, D = x.shape
    if R:
        kernel("ops", "add_rows")((-(-D // 256), R), (256,), (x, _ld(x, "x"), y, _ld(y, "y"), np.int32(D)))


def kv_write(kt, vc, k, v, pos0) -> None:
    """One layer's cache: keys kt [Hkv, hd, ctx] and values vc [Hkv, ctx, hd] (operands of any stored type,
    kv_type) get the window's k, v [T, Hkv, hd] at pos0.., converted as the host cache converts them."""
    T, Hkv, hd = k.shape
    kq, ks = _kv_args(kt, hd)
    vq, vs = _kv_args(vc, hd)
    if T:
        kernel("attention", f"kv_write_{kv_type(kt)}_{kv_type(vc)}")(
            (-(-Hkv * hd // 256), T), (256,),
            (k, _ld(k, "k"), v, _ld(v, "v"), kq, ks, vq, vs, np.int32(Hkv), np.int32(hd), np.int32(kq.shape[2]),
             np.int32(pos0)),
        )


def softmax_topk(logits, k, renorm, ids, weights) -> None:
    """Router: softmax over experts -> top-k (ties to the lower id) -> optional renormalise; ids int64 [T, k]."""
    T, E = logits.shape
    if T:
        kernel("ops", "softmax_topk")(
            (T,), (32,),
            (logits, _ld(logits, "logits"), np.int32(E), np.int32(k), np.int32(bool(renorm)), ids, _ld(ids, "ids"),
             weights, _ld(weights, "weights")),
            shared_mem=4 * E,
        )


# -- Gated DeltaNet (deltanet.cu; twins in kernels/ref.py, CPU kernels in kernels/cpu/deltanet.py) ---------------
def gdn_gates(alpha, b, dt_bias, a, g, beta) -> None:
    """g = a * softplus(alpha + dt_bias), beta = sigmoid(b); alpha, b, g, beta [T, H]."""
    T, H = alpha.shape
    if T:
        kernel("deltanet", "gdn_gates")(
            (-(-H // 128), T), (128,),
            (alpha, _ld(alpha, "alpha"), b, _ld(b, "b"), dt_bias, a, g, _ld(g, "g"), beta, _ld(beta, "beta"),
             np.int32(H)),
        )


def conv1d_silu(x, hist, wt, out) -> None:
    """Causal depthwise conv of x [T, C] after hist [K-1, C] (contiguous) with wt [K, C], then SiLU -> out."""
    T, C = x.shape
    if T:
        kernel("deltanet", "conv1d_silu")(
            (-(-C // 256), T), (256,),
            (x, _ld(x, "x"), hist, wt, out, _ld(out, "out"), np.int32(C), np.int32(wt.shape[0])),
        )


def l2norm_heads(x, eps) -> None:
    """In place, every head vector of x [T, H, d] scaled to unit L2 norm (eps inside the root)."""
    T, H, d = x.shape
    if T:
        kernel("deltanet", "l2norm_heads")((-(-H // 32), T), (32,), (x, _ld(x, "x"), np.int32(H), np.int32(d),
                                                                      np.float64(eps)))


def gdn_recurrence(q, k, v, g, beta, kmap, scale, pool, src, dst, out) -> None:
    """The gated delta rule (kernels/cpu/deltanet.gdn_recurrence): q, k [T, Hk, dk], v [T, Hv, dv], g, beta
    [T, Hv], kmap int64 [Hv], pool [n_buf, Hv, dk, dv] (contiguous), dst int64 [T]; out [T, Hv, dv] or 0 rows."""
    T, Hv, dv = v.shape
    dk = q.shape[2]
    if not pool.flags.c_contiguous:
        raise ValueError("gdn_recurrence: the state pool must be contiguous")
    if T:
        want = out.shape[0] > 0
        kernel("deltanet", "gdn_recurrence")(
            (Hv,), (min(256, -(-dv // 32) * 32),),
            (q, _ld(q, "q"), k, _ld(k, "k"), v, _ld(v, "v"), g, _ld(g, "g"), beta, _ld(beta, "beta"), kmap,
             np.float32(scale), pool, np.int32(src), dst, out if want else v, _ld(out, "out") if want else np.int64(0),
             np.int32(T), np.int32(Hv), np.int32(dk), np.int32(dv), np.int32(want)),
        )


def gated_rmsnorm(x, z, w, eps, out) -> None:
    """out[t, h] = rmsnorm(x[t, h]) * w * silu(z[t, h]); x, z, out [T, H, d]."""
    T, H, d = x.shape
    if T:
        kernel("deltanet", "gated_rmsnorm")(
            (-(-H // 32), T), (32,),
            (x, _ld(x, "x"), z, _ld(z, "z"), w, np.float64(eps), out, _ld(out, "out"), np.int32(H), np.int32(d)),
        )


def sigmoid_mul(x, gate, out) -> None:
    """out = x * sigmoid(gate), gate [R, D] or [R, 1] (broadcast)."""
    R, D = x.shape
    if R:
        kernel("deltanet", "sigmoid_mul")(
            (-(-D // 256), R), (256,),
            (x, _ld(x, "x"), gate, _ld(gate, "gate"), np.int32(gate.shape[1]), out, _ld(out, "out"), np.int32(D)),
        )
