"""Quantized matrix kernels for the CPU (Numba): GEMV over windows of T <= 8 rows, prefill GEMM, get_rows.

Numeric mode: fp32 dequant-dot. Weights are dequantised to float32 in registers (or a per-thread scratch) and
multiplied with float32 activations; every product is accumulated with a fused multiply-add (llvm.fma).
Accuracy vs a float64 reference: |err| <= 1e-4 * (|W| @ |x|) elementwise (tests/test_quant.py).

Layout ("feature tiles"). `pack` regroups the N output features into tiles of NT = 64 (N padded with zero
rows) and stores each tile feature-minor: quant byte j of block b of the tile's 64 features is contiguous,
`qs[tile, b, j, 0:64]`, and so are the block scales, kept as raw f16 bits (`d[tile, b, 0:64]`). The kernels
run their innermost loop over the 64 features of a tile: long, stride-1, branch-free loops that LLVM turns
into packed code (vpmovzxbd, vcvtdq2ps, vcvtph2ps, vfmadd231ps on ymm) without any fast-math flag. Integer
bit-fiddling goes through small intrinsics that stay in 32-bit lanes (Numba would widen it to int64). Quant
bytes keep their ggml bit-packing, so a packed matrix holds the GGUF bytes (K-quants: plus their sub-scales
decoded to bytes, < 3 %).

Row invariance (DESIGN.md "Contracts"). Output feature n of row t is one sequential fma chain over k in a
fixed per-type ("canonical") order and nothing else: no horizontal reductions, no re-association, no
fast-math. T = 1 and T = 2 dequantise in registers; T >= 3 dequantises each block once into a float32 scratch
and runs the chains of all rows from it, four rows at a time sharing the loads. All paths evaluate bitwise
the same weights and the same chains. Threads split the tiles (one parallel region per call) and never a
chain. So out[t] is bitwise the same whatever T <= GEMV_MAX_ROWS is, whatever the other rows are and however
many threads run.

Canonical order. Where a quant byte holds two elements (nibbles), the chain visits them in byte order (low
element, high element, next byte ...); the activations are permuted once per call (`perm`) into that order so
that the kernels read them with stride 1.

Dispatch. Each type's kernel is a Numba cfunc (compiled lazily, cached on disk), called by address from a
single parallel launcher: one small parallel region to compile, and no kernel is re-optimised inside another
function (this halves the cold compile time of the test suite).

Prefill (T > 64): the same kernels, in "dequantise" mode (T = 0), expand chunks of tiles to float32 [K, cols]
and BLAS (numpy matmul) multiplies; deterministic, not bitwise equal to the GEMV path. Windows of 9..64 rows
still take the GEMV kernels, which are faster there (measured). `dequantize_rows` / `dequantize` are
bit-exact with gguf.quants.dequantize.
"""

from __future__ import annotations

import numba
import numpy as np
from gguf import GGMLQuantizationType as Q
from llvmlite import ir
from numba import carray, cfunc, njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from ..blocks import BLOCK, KVALUES_IQ4NL, iq4xs_scales, k_scale_min, row_bytes

GEMV_MAX_ROWS = 8  # windows of T <= this use the fused, row-invariant path
NT = 64  # features per tile
_PREFILL_ROWS = 1024  # features dequantised per BLAS call in the prefill path
# Windows up to this many rows also take the GEMV kernels (still deterministic, and row-invariant, though
# only T <= GEMV_MAX_ROWS is promised): the BLAS path pays a dequantisation of the whole matrix per call and
# only wins beyond ~64 rows here (measured on 1536x576 / 576x1536, Q4_1 and Q4_K).
_GEMV_PATH_ROWS = 64
ROW_INVARIANT_ROWS = _GEMV_PATH_ROWS  # up to this many rows per call, every row is bitwise the same as alone

_KV = KVALUES_IQ4NL.astype(np.float32)


# ---------------------------------------------------------------------------------------------------------
# scalar intrinsics (the loop vectoriser widens them)
def _has_avx512() -> bool:
    try:
        import llvmlite.binding as llvm

        return "+avx512f" in llvm.get_host_cpu_features().flatten()
    except Exception:  # pragma: no cover - feature query unavailable
        return False


_AVX512 = _has_avx512()


def _prefer_wide_vectors(fn) -> None:
    """On AVX-512 hosts let LLVM vectorise the kernels with 512-bit registers (its default for recent Xeons
    prefers 256): +10-20 % here. llvmlite validates function attributes against a fixed list, hence the
    direct set insertion; the string is emitted verbatim into the function definition."""
    if _AVX512 and '"prefer-vector-width"="512"' not in fn.attributes:
        try:
            set.add(fn.attributes, '"prefer-vector-width"="512"')
        except Exception:  # pragma: no cover - llvmlite internals changed: keep LLVM's default
            pass


@intrinsic
def fma32(typingctx, a, b, c):
    """a * b + c with one rounding (llvm.fma.f32)."""
    sig = types.float32(types.float32, types.float32, types.float32)

    def codegen(context, builder, signature, args):
        f = ir.FloatType()
        _prefer_wide_vectors(builder.function)
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(f, [f, f, f]), "llvm.fma.f32")
        return builder.call(fn, args)

    return sig, codegen


@intrinsic
def i2f(typingctx, a):
    """Small integer → float32, converted as a 32-bit int (Numba widens int arithmetic to int64, and
    int64 → float has no packed AVX2 form). Values must fit in int32."""
    if not isinstance(a, types.Integer):
        return None
    sig = types.float32(a)
    signed = a.signed

    def codegen(context, builder, signature, args):
        v = args[0]
        i32 = ir.IntType(32)
        if v.type.width > 32:
            v = builder.trunc(v, i32)
            return builder.sitofp(v, ir.FloatType())
        if signed:
            return builder.sitofp(v, ir.FloatType())
        return builder.uitofp(v, ir.FloatType())

    return sig, codegen


@intrinsic
def h2f(typingctx, a):
    """IEEE half bits (uint16) → float32 (exact; vcvtph2ps)."""
    if a != types.uint16:
        return None
    sig = types.float32(types.uint16)

    def codegen(context, builder, signature, args):
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())

    return sig, codegen


@intrinsic
def bf2f(typingctx, a):
    """bfloat16 bits (uint16) → float32 (exact)."""
    if a != types.uint16:
        return None
    sig = types.float32(types.uint16)

    def codegen(context, builder, signature, args):
        i32 = ir.IntType(32)
        v = builder.shl(builder.zext(args[0], i32), ir.Constant(i32, 16))
        return builder.bitcast(v, ir.FloatType())

    return sig, codegen


@intrinsic
def q5f(typingctx, lo, lo_shift, hi, hi_shift, hi_mask, offset):
    """float32(((lo >> lo_shift) & 15 | ((hi >> hi_shift) & hi_mask) << 4) - offset), all in 32-bit integers
    (4-bit low part + high bits from another word: Q5_0, Q5_K, Q6_K). Numba would widen this arithmetic
    to int64 and the vectoriser would then use half-width lanes."""
    if not all(isinstance(a, types.Integer) for a in (lo, lo_shift, hi, hi_shift, hi_mask, offset)):
        return None
    sig = types.float32(lo, lo_shift, hi, hi_shift, hi_mask, offset)

    def codegen(context, builder, signature, args):
        i32 = ir.IntType(32)

        def to32(v, ty):
            w = v.type.width
            if w == 32:
                return v
            if w > 32:
                return builder.trunc(v, i32)
            return builder.sext(v, i32) if ty.signed else builder.zext(v, i32)

        a = [to32(v, t) for v, t in zip(args, signature.args, strict=True)]
        low = builder.and_(builder.lshr(a[0], a[1]), ir.Constant(i32, 15))
        high = builder.shl(builder.and_(builder.lshr(a[2], a[3]), a[4]), ir.Constant(i32, 4))
        q = builder.sub(builder.or_(low, high), a[5])
        return builder.sitofp(q, ir.FloatType())

    return sig, codegen


# IQ4_NL / IQ4_XS grid without a table lookup (a gather, slow in vector loops): a degree-4 minimax polynomial
# in the 4-bit index is within 0.434 of every grid value, so round-to-nearest (the 1.5 * 2^23 trick) gives
# the grid value exactly; tests check all 16 indices.
_IQ4_C = (0.0015862755244597793, 0.03107772208750248, -1.3718189001083374, 24.173370361328125, -126.56681823730469)
_MAGIC = 12582912.0


@njit(cache=True, inline="always")
def kvf(q):
    """IQ4 grid value of the 4-bit index q (an integer 0..15) as float32, exact."""
    z = i2f(q)
    p = fma32(np.float32(_IQ4_C[0]), z, np.float32(_IQ4_C[1]))
    p = fma32(p, z, np.float32(_IQ4_C[2]))
    p = fma32(p, z, np.float32(_IQ4_C[3]))
    p = fma32(p, z, np.float32(_IQ4_C[4]))
    return (p + np.float32(_MAGIC)) - np.float32(_MAGIC)


def _ptr_intrinsic(nbty):
    """An intrinsic turning an int64 address into a typed C pointer (for numba.carray)."""

    @intrinsic
    def _p(typingctx, addr):
        if not isinstance(addr, types.Integer):
            return None
        sig = types.CPointer(nbty)(addr)

        def codegen(context, builder, signature, args):
            return builder.inttoptr(args[0], context.get_value_type(nbty).as_pointer())

        return sig, codegen

    return _p


_pu8 = _ptr_intrinsic(types.uint8)
_pi8 = _ptr_intrinsic(types.int8)
_pu16 = _ptr_intrinsic(types.uint16)
_pu32 = _ptr_intrinsic(types.uint32)
_pf32 = _ptr_intrinsic(types.float32)
_pi64 = _ptr_intrinsic(types.int64)


@intrinsic
def _call_kernel(typingctx, fn, p0, p1, p2, p3, p4, p5, nt, nb, pxp, T, Kp, g0, g1, pout, N):
    """Indirect call of a GEMV kernel (a cfunc of signature _KSIG) through its address `fn`."""
    argtys = (p0, p1, p2, p3, p4, p5, nt, nb, pxp, T, Kp, g0, g1, pout, N)
    if not all(isinstance(a, types.Integer) for a in (fn,) + argtys):
        return None
    sig = types.void(types.int64, *([types.int64] * 15))

    def codegen(context, builder, signature, args):
        i64 = ir.IntType(64)
        fnty = ir.FunctionType(ir.VoidType(), [i64] * 15)
        vals = [context.cast(builder, v, t, types.int64) for v, t in zip(args[1:], signature.args[1:], strict=True)]
        builder.call(builder.inttoptr(args[0], fnty.as_pointer()), vals)
        return context.get_dummy_value()

    return sig, codegen


# C signature of every GEMV kernel: addresses of the six packed arrays, tiles, blocks per row, address of the
# permuted activations xp [T, Kp], T, Kp, tile range [g0, g1), address of out [T, N], N. Dequantise mode:
# T = 0, xp → perm (int64 [Kp]), out → float32 [Kp, N] receiving W[g0*NT:g1*NT].T in natural k order.
_KSIG = types.void(*([types.int64] * 15))


# ---------------------------------------------------------------------------------------------------------
# shared pieces of the GEMV drivers
@njit(cache=True)
def _permute_x(x, perm, xp):
    """xp[t, c] = x[t, perm[c]] (0 where perm < 0: padding)."""
    for t in range(x.shape[0]):
        for c in range(perm.shape[0]):
            p = perm[c]
            xp[t, c] = x[t, p] if p >= 0 else np.float32(0.0)


@njit(cache=True, inline="always")
def _store(acc, out, g, T):
    N = out.shape[1]
    n0 = g * NT
    n1 = min(n0 + NT, N)
    for t in range(T):
        for n in range(n1 - n0):
            out[t, n0 + n] = acc[t, n]


@njit(cache=True, inline="always")
def _scratch(pxp, T, Kp, pout, N):
    """Views of the activations (or, in dequantise mode T = 0, of perm) and of the output, and this thread's
    scratch buffers."""
    xp = carray(_pf32(pxp), (T, Kp))
    perm = carray(_pi64(pxp), (Kp if T == 0 else 0,))
    out = carray(_pf32(pout), (T if T > 0 else Kp, N))
    acc = np.empty((T, NT), np.float32)
    wb = np.empty((128, NT), np.float32)
    sd = np.empty((16, NT), np.float32)
    sm = np.empty((16, NT), np.float32)
    return xp, perm, out, acc, wb, sd, sm


@njit(cache=True, inline="always")
def _use(wb, xp, acc, T, kb, U, out, perm, col):
    """Consume the dequantised block wb [U, NT] (canonical order): accumulate it into the T rows, or in
    dequantise mode (T = 0) write it to out[k, col:col + NT] at its natural k = perm[kb + u]."""
    if T == 0:
        for u in range(U):
            r = perm[kb + u]
            if r >= 0:
                for n in range(NT):
                    out[r, col + n] = wb[u, n]
    else:
        _accum(wb, xp, acc, T, kb, U)


@njit(cache=True, inline="always")
def _accum(wb, xp, acc, T, kb, U):
    """acc[t, n] ← chain of fma(wb[u, n], xp[t, kb + u]) for u = 0..U-1, four rows sharing the weight loads.

    Per (t, n) the chain is the same as the T = 1 fused loops (steps of 4, one load/store of acc per step)."""
    t = 0
    while t + 4 <= T:
        for u in range(0, U, 4):
            k = kb + u
            a0 = xp[t, k]
            a1 = xp[t, k + 1]
            a2 = xp[t, k + 2]
            a3 = xp[t, k + 3]
            b0 = xp[t + 1, k]
            b1 = xp[t + 1, k + 1]
            b2 = xp[t + 1, k + 2]
            b3 = xp[t + 1, k + 3]
            c0 = xp[t + 2, k]
            c1 = xp[t + 2, k + 1]
            c2 = xp[t + 2, k + 2]
            c3 = xp[t + 2, k + 3]
            d0 = xp[t + 3, k]
            d1 = xp[t + 3, k + 1]
            d2 = xp[t + 3, k + 2]
            d3 = xp[t + 3, k + 3]
            for n in range(NT):
                w0 = wb[u, n]
                w1 = wb[u + 1, n]
                w2 = wb[u + 2, n]
                w3 = wb[u + 3, n]
                s = acc[t, n]
                s = fma32(w0, a0, s)
                s = fma32(w1, a1, s)
                s = fma32(w2, a2, s)
                s = fma32(w3, a3, s)
                acc[t, n] = s
                s = acc[t + 1, n]
                s = fma32(w0, b0, s)
                s = fma32(w1, b1, s)
                s = fma32(w2, b2, s)
                s = fma32(w3, b3, s)
                acc[t + 1, n] = s
                s = acc[t + 2, n]
                s = fma32(w0, c0, s)
                s = fma32(w1, c1, s)
                s = fma32(w2, c2, s)
                s = fma32(w3, c3, s)
                acc[t + 2, n] = s
                s = acc[t + 3, n]
                s = fma32(w0, d0, s)
                s = fma32(w1, d1, s)
                s = fma32(w2, d2, s)
                s = fma32(w3, d3, s)
                acc[t + 3, n] = s
        t += 4
    if t + 2 <= T:
        for u in range(0, U, 4):
            k = kb + u
            a0 = xp[t, k]
            a1 = xp[t, k + 1]
            a2 = xp[t, k + 2]
            a3 = xp[t, k + 3]
            b0 = xp[t + 1, k]
            b1 = xp[t + 1, k + 1]
            b2 = xp[t + 1, k + 2]
            b3 = xp[t + 1, k + 3]
            for n in range(NT):
                w0 = wb[u, n]
                w1 = wb[u + 1, n]
                w2 = wb[u + 2, n]
                w3 = wb[u + 3, n]
                s = acc[t, n]
                s = fma32(w0, a0, s)
                s = fma32(w1, a1, s)
                s = fma32(w2, a2, s)
                s = fma32(w3, a3, s)
                acc[t, n] = s
                s = acc[t + 1, n]
                s = fma32(w0, b0, s)
                s = fma32(w1, b1, s)
                s = fma32(w2, b2, s)
                s = fma32(w3, b3, s)
                acc[t + 1, n] = s
        t += 2
    if t < T:
        for u in range(0, U, 4):
            k = kb + u
            a0 = xp[t, k]
            a1 = xp[t, k + 1]
            a2 = xp[t, k + 2]
            a3 = xp[t, k + 3]
            for n in range(NT):
                s = acc[t, n]
                s = fma32(wb[u, n], a0, s)
                s = fma32(wb[u + 1, n], a1, s)
                s = fma32(wb[u + 2, n], a2, s)
                s = fma32(wb[u + 3, n], a3, s)
                acc[t, n] = s


# ---------------------------------------------------------------------------------------------------------
# The GEMV kernels `_k_<type>` below are plain Python functions compiled on first use as cfuncs of signature
# _KSIG (see _kernel); `_r_<type>` are the bit-exact get_rows twins (natural element order).
#
# Q8_0: qs int8 [tiles, nb, 32, NT], d f16 bits [tiles, nb, NT]; canonical order = natural order
def _k_q8_0(p0, p1, p2, p3, p4, p5, nt, nb, pxp, T, Kp, g0, g1, pout, N):
    qs = carray(_pi8(p0), (nt, nb, 32, NT))
    d = carray(_pu16(p1), (nt, nb, NT))
    xp, perm, out, acc, wb, sd, sm = _scratch(pxp, T, Kp, pout, N)
    for g in range(g0, g1):
        acc[:, :] = 0.0
        for b in range(nb):
            kb = b * 32
            if T == 1:
                for u in range(0, 32, 8):
                    x0 = xp[0, kb + u]
                    x1 = xp[0, kb + u + 1]
                    x2 = xp[0, kb + u + 2]
                    x3 = xp[0, kb + u + 3]
                    x4 = xp[0, kb + u + 4]
                    x5 = xp[0, kb + u + 5]
                    x6 = xp[0, kb + u + 6]
                    x7 = xp[0, kb + u + 7]
                    for n in range(NT):
                        dd = h2f(d[g, b, n])
                        s = acc[0, n]
                        s = fma32(i2f(qs[g, b, u, n]) * dd, x0, s)
                        s = fma32(i2f(qs[g, b, u + 1, n]) * dd, x1, s)
                        s = fma32(i2f(qs[g, b, u + 2, n]) * dd, x2, s)
                        s = fma32(i2f(qs[g, b, u + 3, n]) * dd, x3, s)
                        s = fma32(i2f(qs[g, b, u + 4, n]) * dd, x4, s)
                        s = fma32(i2f(qs[g, b, u + 5, n]) * dd, x5, s)
                        s = fma32(i2f(qs[g, b, u + 6, n]) * dd, x6, s)
                        s = fma32(i2f(qs[g, b, u + 7, n]) * dd, x7, s)
                        acc[0, n] = s
            elif T == 2:
                for u in range(0, 32, 4):
                    x0 = xp[0, kb + u]
                    x1 = xp[0, kb + u + 1]
                    x2 = xp[0, kb + u + 2]
                    x3 = xp[0, kb + u + 3]
                    y0 = xp[1, kb + u]
                    y1 = xp[1, kb + u + 1]
                    y2 = xp[1, kb + u + 2]
                    y3 = xp[1, kb + u + 3]
                    for n in range(NT):
                        dd = h2f(d[g, b, n])
                        w0 = i2f(qs[g, b, u, n]) * dd
                        w1 = i2f(qs[g, b, u + 1, n]) * dd
                        w2 = i2f(qs[g, b, u + 2, n]) * dd
                        w3 = i2f(qs[g, b, u + 3, n]) * dd
                        s = acc[0, n]
                        s = fma32(w0, x0, s)
                        s = fma32(w1, x1, s)
                        s = fma32(w2, x2, s)
                        s = fma32(w3, x3, s)
                        acc[0, n] = s
                        s = acc[1, n]
                        s = fma32(w0, y0, s)
                        s = fma32(w1, y1, s)
                        s = fma32(w2, y2, s)
                        s = fma32(w3, y3, s)
                        acc[1, n] = s
            else:
                for u in range(32):
                    for n in range(NT):
                        wb[u, n] = i2f(qs[g, b, u, n]) * h2f(d[g, b, n])
                _use(wb, xp, acc, T, kb, 32, out, perm, (g - g0) * NT)
        _store(acc, out, g, T)


@njit(cache=True)
def _r_q8_0(qs, d, rows, out):
    nb = qs.shape[1]
    for r in range(rows.shape[0]):
        g, n = divmod(rows[r], NT)
        for b in range(nb):
            dd = h2f(d[g, b, n])
            for j in range(32):
                out[r, b * 32 + j] = i2f(qs[g, b, j, n]) * dd


# ---------------------------------------------------------------------------------------------------------
# Q4_0 / Q4_1 / IQ4_NL: qs uint8 [tiles, nb, 16, NT] (byte j: low nibble → element j, high → j + 16),
# d (and m) f16 bits [tiles, nb, NT]; canonical order j, j+16, j+1, j+17, ...
def _k_q4_0(p0, p1, p2, p3, p4, p5, nt, nb, pxp, T, Kp, g0, g1, pout, N):
    qs = carray(_pu8(p0), (nt, nb, 16, NT))
    d = carray(_pu16(p1), (nt, nb, NT))
    xp, perm, out, acc, wb, sd, sm = _scratch(pxp, T, Kp, pout, N)
    for g in range(g0, g1):
        acc[:, :] = 0.0
        for b in range(nb):
            kb = b * 32
            if T == 1:
                for j in range(0, 16, 4):
                    x0 = xp[0, kb + 2 * j]
                    x1 = xp[0, kb + 2 * j + 1]
                    x2 = xp[0, kb + 2 * j + 2]
                    x3 = xp[0, kb + 2 * j + 3]
                    x4 = xp[0, kb + 2 * j + 4]
                    x5 = xp[0, kb + 2 * j + 5]
                    x6 = xp[0, kb + 2 * j + 6]
                    x7 = xp[0, kb + 2 * j + 7]
                    for n in range(NT):
                        dd = h2f(d[g, b, n])
                        q0 = qs[g, b, j, n]
                        q1 = qs[g, b, j + 1, n]
                        q2 = qs[g, b, j + 2, n]
                        q3 = qs[g, b, j + 3, n]
                        s = acc[0, n]
                        s = fma32(dd * i2f((q0 & 15) - 8), x0, s)
                        s = fma32(dd * i2f((q0 >> 4) - 8), x1, s)
                        s = fma32(dd * i2f((q1 & 15) - 8), x2, s)
                        s = fma32(dd * i2f((q1 >> 4) - 8), x3, s)
                        s = fma32(dd * i2f((q2 & 15) - 8), x4, s)
                        s = fma32(dd * i2f((q2 >> 4) - 8), x5, s)
                        s = fma32(dd * i2f((q3 & 15) - 8), x6, s)
                        s = fma32(dd * i2f((q3 >> 4) - 8), x7, s)
                        acc[0, n] = s
            elif T == 2:
                for j in range(0, 16, 2):
                    x0 = xp[0, kb + 2 * j]
                    x1 = xp[0, kb + 2 * j + 1]
                    x2 = xp[0, kb + 2 * j + 2]
                    x3 = xp[0, kb + 2 * j + 3]
                    y0 = xp[1, kb + 2 * j]
                    y1 = xp[1, kb + 2 * j + 1]
                    y2 = xp[1, kb + 2 * j + 2]
                    y3 = xp[1, kb + 2 * j + 3]
                    for n in range(NT):
                        dd = h2f(d[g, b, n])
                        q0 = qs[g, b, j, n]
                        q1 = qs[g, b, j + 1, n]
                        w0 = dd * i2f((q0 & 15) - 8)
                        w1 = dd * i2f((q0 >> 4) - 8)
                        w2 = dd * i2f((q1 & 15) - 8)
                        w3 = dd * i2f((q1 >> 4) - 8)
                        s = acc[0, n]
                        s = fma32(w0, x0, s)
                        s = fma32(w1, x1, s)
                        s = fma32(w2, x2, s)
                        s = fma32(w3, x3, s)
                        acc[0, n] = s
                        s = acc[1, n]
                        s = fma32(w0, y0, s)
                        s = fma32(w1, y1, s)
                        s = fma32(w2, y2, s)
                        s = fma32(w3, y3, s)
                        acc[1, n] = s
            else:
                for j in range(16):
                    for n in range(NT):
                        dd = h2f(d[g, b, n])
                        q0 = qs[g, b, j, n]
                        wb[2 * j, n] = dd * i2f((q0 & 15) - 8)
                        wb[2 * j + 1, n] = dd * i2f((q0 >> 4) - 8)
                _use(wb, xp, acc, T, kb, 32, out, perm, (g - g0) * NT)
        _store(acc, out, g, T)


@njit(cache=True)
def _r_q4_0(qs, d, rows, out):
    nb = qs.shape[1]
    for r in range(rows.shape[0]):
        g, n = divmod(rows[r], NT)
        for b in range(nb):
            dd = h2f(d[g, b, n])
            for j in range(16):
                q = qs[g, b, j, n]
                out[r, b * 32 + j] = dd * i2f((q & 15) - 8)
                out[r, b * 32 + j + 16] = dd * i2f((q >> 4) - 8)


def _k_q4_1(p0, p1, p2, p3, p4, p5, nt, nb, pxp, T, Kp, g0, g1, pout, N):
    qs = carray(_pu8(p0), (nt, nb, 16, NT))
    d = carray(_pu16(p1), (nt, nb, NT))
    m = carray(_pu16(p2), (nt, nb, NT))
    xp, perm, out, acc, wb, sd, sm = _scratch(pxp, T, Kp, pout, N)
    for g in range(g0, g1):
        acc[:, :] = 0.0
        for b in range(nb):
            kb = b * 32
            if T == 1:
                for j in range(0, 16, 4):
                    x0 = xp[0, kb + 2 * j]
                    x1 = xp[0, kb + 2 * j + 1]
                    x2 = xp[0, kb + 2 * j + 2]
                    x3 = xp[0, kb + 2 * j + 3]
                    x4 = xp[0, kb + 2 * j + 4]
                    x5 = xp[0, kb + 2 * j + 5]
                    x6 = xp[0, kb + 2 * j + 6]
                    x7 = xp[0, kb + 2 * j + 7]
                    for n in range(NT):
                        dd = h2f(d[g, b, n])
                        mm = h2f(m[g, b, n])
                        q0 = qs[g, b, j, n]
                        q1 = qs[g, b, j + 1, n]
                        q2 = qs[g, b, j + 2, n]
                        q3 = qs[g, b, j + 3, n]
                        s = acc[0, n]
                        s = fma32(fma32(i2f(q0 & 15), dd, mm), x0, s)
                        s = fma32(fma32(i2f(q0 >> 4), dd, mm), x1, s)
                        s = fma32(fma32(i2f(q1 & 15), dd, mm), x2, s)
                        s = fma32(fma32(i2f(q1 >> 4), dd, mm), x3, s)
                        s = fma32(fma32(i2f(q2 & 15), dd, mm), x4, s)
                        s = fma32(fma32(i2f(q2 >> 4), dd, mm), x5, s)
                        s = fma32(fma32(i2f(q3 & 15), dd, mm), x6, s)
                        s = fma32(fma32(i2f(q3 >> 4), dd, mm), x7, s)
                        acc[0, n] = s
            elif T == 2:
                for j in range(0, 16, 2):
                    x0 = xp[0, kb + 2 * j]
                    x1 = xp[0, kb + 2 * j + 1]
                    x2 = xp[0, kb + 2 * j + 2]
                    x3 = xp[0, kb + 2 * j + 3]
                    y0 = xp[1, kb + 2 * j]
                    y1 = xp[1, kb + 2 * j + 1]
                    y2 = xp[1, kb + 2 * j + 2]
                    y3 = xp[1, kb + 2 * j + 3]
                    for n in range(NT):
                        dd = h2f(d[g, b, n])
                        mm = h2f(m[g, b, n])
                        q0 = qs[g, b, j, n]
                        q1 = qs[g, b, j + 1, n]
                        w0 = fma32(i2f(q0 & 15), dd, mm)
                        w1 = fma32(i2f(q0 >> 4), dd, mm)
                        w2 = fma32(i2f(q1 & 15), dd, mm)
                        w3 = fma32(i2f(q1 >> 4), dd, mm)
                        s = acc[0, n]
                        s = fma32(w0, x0, s)
                        s = fma32(w1, x1, s)
                        s = fma32(w2, x2, s)
                        s = fma32(w3, x3, s)
                        acc[0, n] = s
                        s = acc[1, n]
                        s = fma32(w0, y0, s)
                        s = fma32(w1, y1, s)
                        s = fma32(w2, y2, s)
                        s = fma32(w3, y3, s)
                        acc[1, n] = s
            else:
                for j in range(16):
                    for n in range(NT):
                        dd = h2f(d[g, b, n])
                        mm = h2f(m[g, b, n])
                        q0 = qs[g, b, j, n]
                        wb[2 * j, n] = fma32(i2f(q0 & 15), dd, mm)
                        wb[2 * j + 1, n] = fma32(i2f(q0 >> 4), dd, mm)
                _use(wb, xp, acc, T, kb, 32, out, perm, (g - g0) * NT)
        _store(acc, out, g, T)


@njit(cache=True)
def _r_q4_1(qs, d, m, rows, out):
    nb = qs.shape[1]
    for r in range(rows.shape[0]):
        g, n = divmod(rows[r], NT)
        for b in range(nb):
            dd = h2f(d[g, b, n])
            mm = h2f(m[g, b, n])
            for j in range(16):
                q = qs[g, b, j, n]
                out[r, b * 32 + j] = dd * i2f(q & 15) + mm
                out[r, b * 32 + j + 16] = dd * i2f(q >> 4) + mm


def _k_iq4_nl(p0, p1, p2, p3, p4, p5, nt, nb, pxp, T, Kp, g0, g1, pout, N):
    qs = carray(_pu8(p0), (nt, nb, 16, NT))
    d = carray(_pu16(p1), (nt, nb, NT))
    xp, perm, out, acc, wb, sd, sm = _scratch(pxp, T, Kp, pout, N)
    for g in range(g0, g1):
        acc[:, :] = 0.0
        for b in range(nb):
            kb = b * 32
            if T == 1:
                for j in range(0, 16, 4):
                    x0 = xp[0, kb + 2 * j]
                    x1 = xp[0, kb + 2 * j + 1]
                    x2 = xp[0, kb + 2 * j + 2]
                    x3 = xp[0, kb + 2 * j + 3]
                    x4 = xp[0, kb + 2 * j + 4]
                    x5 = xp[0, kb + 2 * j + 5]
                    x6 = xp[0, kb + 2 * j + 6]
                    x7 = xp[0, kb + 2 * j + 7]
                    for n in range(NT):
                        dd = h2f(d[g, b, n])
                        q0 = qs[g, b, j, n]
                        q1 = qs[g, b, j + 1, n]
                        q2 = qs[g, b, j + 2, n]
                        q3 = qs[g, b, j + 3, n]
                        s = acc[0, n]
                        s = fma32(dd * kvf(q0 & 15), x0, s)
                        s = fma32(dd * kvf(q0 >> 4), x1, s)
                        s = fma32(dd * kvf(q1 & 15), x2, s)
                        s = fma32(dd * kvf(q1 >> 4), x3, s)
                        s = fma32(dd * kvf(q2 & 15), x4, s)
                        s = fma32(dd * kvf(q2 >> 4), x5, s)
                        s = fma32(dd * kvf(q3 & 15), x6, s)
                        s = fma32(dd * kvf(q3 >> 4), x7, s)
                        acc[0, n] = s
            elif T == 2:
                for j in range(0, 16, 2):
                    x0 = xp[0, kb + 2 * j]
                    x1 = xp[0, kb + 2 * j + 1]
                    x2 = xp[0, kb + 2 * j + 2]
                    x3 = xp[0, kb + 2 * j + 3]
                    y0 = xp[1, kb + 2 * j]
                    y1 = xp[1, kb + 2 * j + 1]
                    y2 = xp[1, kb + 2 * j + 2]
                    y3 = xp[1, kb + 2 * j + 3]
                    for n in range(NT):
                        dd = h2f(d[g, b, n])
                        q0 = qs[g, b, j, n]
                        q1 = qs[g, b, j + 1, n]
                        w0 = dd * kvf(q0 & 15)
                        w1 = dd * kvf(q0 >> 4)
                        w2 = dd * kvf(q1 & 15)
                        w3 = dd * kvf(q1 >> 4)
                        s = acc[0, n]
                        s = fma32(w0, x0, s)
                        s = fma32(w1, x1, s)
                        s = fma32(w2, x2, s)
                        s = fma32(w3, x3, s)
                        acc[0, n] = s
                        s = acc[1, n]
                        s = fma32(w0, y0, s)
                        s = fma32(w1, y1, s)
                        s = fma32(w2, y2, s)
                        s = fma32(w3, y3, s)
                        acc[1, n] = s
            else:
                for j in range(16):
                    for n in range(NT):
                        dd = h2f(d[g, b, n])
                        q0 = qs[g, b, j, n]
                        wb[2 * j, n] = dd * kvf(q0 & 15)
                        wb[2 * j + 1, n] = dd * kvf(q0 >> 4)
                _use(wb, xp, acc, T, kb, 32, out, perm, (g - g0) * NT)
        _store(acc, out, g, T)


@njit(cache=True)
def _r_iq4_nl(qs, d, rows, out):
    nb = qs.shape[1]
    kv = _KV
    for r in range(rows.shape[0]):
        g, n = divmod(rows[r], NT)
        for b in range(nb):
            dd = h2f(d[g, b, n])
            for j in range(16):
                q = qs[g, b, j, n]
                out[r, b * 32 + j] = dd * kv[q & 15]
                out[r, b * 32 + j + 16] = dd * kv[q >> 4]


# ---------------------------------------------------------------------------------------------------------
# Q5_0: qs like Q4_0, qh uint32 [tiles, nb, NT] (bit j → 5th bit of element j), d f16 bits
def _k_q5_0(p0, p1, p2, p3, p4, p5, nt, nb, pxp, T, Kp, g0, g1, pout, N):
    qs = carray(_pu8(p0), (nt, nb, 16, NT))
    qh = carray(_pu32(p1), (nt, nb, NT))
    d = carray(_pu16(p2), (nt, nb, NT))
    xp, perm, out, acc, wb, sd, sm = _scratch(pxp, T, Kp, pout, N)
    for g in range(g0, g1):
        acc[:, :] = 0.0
        for b in range(nb):
            kb = b * 32
            if T == 1:
                for j in range(0, 16, 4):
                    x0 = xp[0, kb + 2 * j]
                    x1 = xp[0, kb + 2 * j + 1]
                    x2 = xp[0, kb + 2 * j + 2]
                    x3 = xp[0, kb + 2 * j + 3]
                    x4 = xp[0, kb + 2 * j + 4]
                    x5 = xp[0, kb + 2 * j + 5]
                    x6 = xp[0, kb + 2 * j + 6]
                    x7 = xp[0, kb + 2 * j + 7]
                    for n in range(NT):
                        dd = h2f(d[g, b, n])
                        h = qh[g, b, n]
                        q0 = qs[g, b, j, n]
                        q1 = qs[g, b, j + 1, n]
                        q2 = qs[g, b, j + 2, n]
                        q3 = qs[g, b, j + 3, n]
                        s = acc[0, n]
                        s = fma32(dd * q5f(q0, 0, h, j, 1, 16), x0, s)
                        s = fma32(dd * q5f(q0, 4, h, j + 16, 1, 16), x1, s)
                        s = fma32(dd * q5f(q1, 0, h, j + 1, 1, 16), x2, s)
                        s = fma32(dd * q5f(q1, 4, h, j + 17, 1, 16), x3, s)
                        s = fma32(dd * q5f(q2, 0, h, j + 2, 1, 16), x4, s)
                        s = fma32(dd * q5f(q2, 4, h, j + 18, 1, 16), x5, s)
                        s = fma32(dd * q5f(q3, 0, h, j + 3, 1, 16), x6, s)
                        s = fma32(dd * q5f(q3, 4, h, j + 19, 1, 16), x7, s)
                        acc[0, n] = s
            elif T == 2:
                for j in range(0, 16, 2):
                    x0 = xp[0, kb + 2 * j]
                    x1 = xp[0, kb + 2 * j + 1]
                    x2 = xp[0, kb + 2 * j + 2]
                    x3 = xp[0, kb + 2 * j + 3]
                    y0 = xp[1, kb + 2 * j]
                    y1 = xp[1, kb + 2 * j + 1]
                    y2 = xp[1, kb + 2 * j + 2]
                    y3 = xp[1, kb + 2 * j + 3]
                    for n in range(NT):
                        dd = h2f(d[g, b, n])
                        h = qh[g, b, n]
                        q0 = qs[g, b, j, n]
                        q1 = qs[g, b, j + 1, n]
                        w0 = dd * q5f(q0, 0, h, j, 1, 16)
                        w1 = dd * q5f(q0, 4, h, j + 16, 1, 16)
                        w2 = dd * q5f(q1, 0, h, j + 1, 1, 16)
                        w3 = dd * q5f(q1, 4, h, j + 17, 1, 16)
                        s = acc[0, n]
                        s = fma32(w0, x0, s)
                        s = fma32(w1, x1, s)
                        s = fma32(w2, x2, s)
                        s = fma32(w3, x3, s)
                        acc[0, n] = s
                        s = acc[1, n]
                        s = fma32(w0, y0, s)
                        s = fma32(w1, y1, s)
                        s = fma32(w2, y2, s)
                        s = fma32(w3, y3, s)
                        acc[1, n] = s
            else:
                for j in range(16):
                    for n in range(NT):
                        dd = h2f(d[g, b, n])
                        h = qh[g, b, n]
                        q0 = qs[g, b, j, n]
                        wb[2 * j, n] = dd * q5f(q0, 0, h, j, 1, 16)
                        wb[2 * j + 1, n] = dd * q5f(q0, 4, h, j + 16, 1, 16)
                _use(wb, xp, acc, T, kb, 32, out, perm, (g - g0) * NT)
        _store(acc, out, g, T)


@njit(cache=True)
def _r_q5_0(qs, qh, d, rows, out):
    nb = qs.shape[1]
    for r in range(rows.shape[0]):
        g, n = divmod(rows[r], NT)
        for b in range(nb):
            dd = h2f(d[g, b, n])
            h = qh[g, b, n]
            for j in range(16):
                q = qs[g, b, j, n]
                out[r, b * 32 + j] = dd * q5f(q, 0, h, j, 1, 16)
                out[r, b * 32 + j + 16] = dd * q5f(q, 4, h, j + 16, 1, 16)


# ---------------------------------------------------------------------------------------------------------
# Q4_K / Q5_K: per super-block of 256: qs uint8 [tiles, nsb, 4, 32, NT] (pair i, byte j: low nibble →
# element 64i + j, high → 64i + 32 + j), d, dmin f16 bits [tiles, nsb, NT], decoded 6-bit scales and mins
# sc, mn uint8 [tiles, nsb, 8, NT]; Q5_K adds qh uint8 [tiles, nsb, 32, NT] (bit s of qh[j] → 5th bit of
# element 32s + j). Unit of the kernel = pair i (64 elements), canonical order byte-major as Q4_0.
def _k_q4_k(p0, p1, p2, p3, p4, p5, nt, nb, pxp, T, Kp, g0, g1, pout, N):
    qs = carray(_pu8(p0), (nt, nb, 4, 32, NT))
    d = carray(_pu16(p1), (nt, nb, NT))
    dmin = carray(_pu16(p2), (nt, nb, NT))
    sc = carray(_pu8(p3), (nt, nb, 8, NT))
    mn = carray(_pu8(p4), (nt, nb, 8, NT))
    xp, perm, out, acc, wb, sd, sm = _scratch(pxp, T, Kp, pout, N)
    for g in range(g0, g1):
        acc[:, :] = 0.0
        for b in range(nb):
            for s in range(8):
                for n in range(NT):
                    sd[s, n] = h2f(d[g, b, n]) * i2f(sc[g, b, s, n])
                    sm[s, n] = -(h2f(dmin[g, b, n]) * i2f(mn[g, b, s, n]))
            for i in range(4):
                kb = b * 256 + i * 64
                if T == 1:
                    for j in range(0, 32, 2):
                        x0 = xp[0, kb + 2 * j]
                        x1 = xp[0, kb + 2 * j + 1]
                        x2 = xp[0, kb + 2 * j + 2]
                        x3 = xp[0, kb + 2 * j + 3]
                        for n in range(NT):
                            dl = sd[2 * i, n]
                            ml = sm[2 * i, n]
                            dh = sd[2 * i + 1, n]
                            mh = sm[2 * i + 1, n]
                            q0 = qs[g, b, i, j, n]
                            q1 = qs[g, b, i, j + 1, n]
                            s = acc[0, n]
                            s = fma32(fma32(i2f(q0 & 15), dl, ml), x0, s)
                            s = fma32(fma32(i2f(q0 >> 4), dh, mh), x1, s)
                            s = fma32(fma32(i2f(q1 & 15), dl, ml), x2, s)
                            s = fma32(fma32(i2f(q1 >> 4), dh, mh), x3, s)
                            acc[0, n] = s
                elif T == 2:
                    for j in range(0, 32, 2):
                        x0 = xp[0, kb + 2 * j]
                        x1 = xp[0, kb + 2 * j + 1]
                        x2 = xp[0, kb + 2 * j + 2]
                        x3 = xp[0, kb + 2 * j + 3]
                        y0 = xp[1, kb + 2 * j]
                        y1 = xp[1, kb + 2 * j + 1]
                        y2 = xp[1, kb + 2 * j + 2]
                        y3 = xp[1, kb + 2 * j + 3]
                        for n in range(NT):
                            dl = sd[2 * i, n]
                            ml = sm[2 * i, n]
                            dh = sd[2 * i + 1, n]
                            mh = sm[2 * i + 1, n]
                            q0 = qs[g, b, i, j, n]
                            q1 = qs[g, b, i, j + 1, n]
                            w0 = fma32(i2f(q0 & 15), dl, ml)
                            w1 = fma32(i2f(q0 >> 4), dh, mh)
                            w2 = fma32(i2f(q1 & 15), dl, ml)
                            w3 = fma32(i2f(q1 >> 4), dh, mh)
                            s = acc[0, n]
                            s = fma32(w0, x0, s)
                            s = fma32(w1, x1, s)
                            s = fma32(w2, x2, s)
                            s = fma32(w3, x3, s)
                            acc[0, n] = s
                            s = acc[1, n]
                            s = fma32(w0, y0, s)
                            s = fma32(w1, y1, s)
                            s = fma32(w2, y2, s)
                            s = fma32(w3, y3, s)
                            acc[1, n] = s
                else:
                    for j in range(32):
                        for n in range(NT):
                            q0 = qs[g, b, i, j, n]
                            wb[2 * j, n] = fma32(i2f(q0 & 15), sd[2 * i, n], sm[2 * i, n])
                            wb[2 * j + 1, n] = fma32(i2f(q0 >> 4), sd[2 * i + 1, n], sm[2 * i + 1, n])
                    _use(wb, xp, acc, T, kb, 64, out, perm, (g - g0) * NT)
        _store(acc, out, g, T)


@njit(cache=True)
def _r_q4_k(qs, d, dmin, sc, mn, rows, out):
    nb = qs.shape[1]
    for r in range(rows.shape[0]):
        g, n = divmod(rows[r], NT)
        for b in range(nb):
            dd = h2f(d[g, b, n])
            dm = h2f(dmin[g, b, n])
            for i in range(4):
                dl = dd * i2f(sc[g, b, 2 * i, n])
                ml = dm * i2f(mn[g, b, 2 * i, n])
                dh = dd * i2f(sc[g, b, 2 * i + 1, n])
                mh = dm * i2f(mn[g, b, 2 * i + 1, n])
                k0 = b * 256 + i * 64
                for j in range(32):
                    q = qs[g, b, i, j, n]
                    out[r, k0 + j] = dl * i2f(q & 15) - ml
                    out[r, k0 + 32 + j] = dh * i2f(q >> 4) - mh


def _k_q5_k(p0, p1, p2, p3, p4, p5, nt, nb, pxp, T, Kp, g0, g1, pout, N):
    qs = carray(_pu8(p0), (nt, nb, 4, 32, NT))
    qh = carray(_pu8(p1), (nt, nb, 32, NT))
    d = carray(_pu16(p2), (nt, nb, NT))
    dmin = carray(_pu16(p3), (nt, nb, NT))
    sc = carray(_pu8(p4), (nt, nb, 8, NT))
    mn = carray(_pu8(p5), (nt, nb, 8, NT))
    xp, perm, out, acc, wb, sd, sm = _scratch(pxp, T, Kp, pout, N)
    for g in range(g0, g1):
        acc[:, :] = 0.0
        for b in range(nb):
            for s in range(8):
                for n in range(NT):
                    sd[s, n] = h2f(d[g, b, n]) * i2f(sc[g, b, s, n])
                    sm[s, n] = -(h2f(dmin[g, b, n]) * i2f(mn[g, b, s, n]))
            for i in range(4):
                kb = b * 256 + i * 64
                sl = 2 * i
                sh = 2 * i + 1
                if T == 1:
                    for j in range(0, 32, 2):
                        x0 = xp[0, kb + 2 * j]
                        x1 = xp[0, kb + 2 * j + 1]
                        x2 = xp[0, kb + 2 * j + 2]
                        x3 = xp[0, kb + 2 * j + 3]
                        for n in range(NT):
                            dl = sd[sl, n]
                            ml = sm[sl, n]
                            dh = sd[sh, n]
                            mh = sm[sh, n]
                            q0 = qs[g, b, i, j, n]
                            q1 = qs[g, b, i, j + 1, n]
                            h0 = qh[g, b, j, n]
                            h1 = qh[g, b, j + 1, n]
                            s = acc[0, n]
                            s = fma32(fma32(q5f(q0, 0, h0, sl, 1, 0), dl, ml), x0, s)
                            s = fma32(fma32(q5f(q0, 4, h0, sh, 1, 0), dh, mh), x1, s)
                            s = fma32(fma32(q5f(q1, 0, h1, sl, 1, 0), dl, ml), x2, s)
                            s = fma32(fma32(q5f(q1, 4, h1, sh, 1, 0), dh, mh), x3, s)
                            acc[0, n] = s
                elif T == 2:
                    for j in range(0, 32, 2):
                        x0 = xp[0, kb + 2 * j]
                        x1 = xp[0, kb + 2 * j + 1]
                        x2 = xp[0, kb + 2 * j + 2]
                        x3 = xp[0, kb + 2 * j + 3]
                        y0 = xp[1, kb + 2 * j]
                        y1 = xp[1, kb + 2 * j + 1]
                        y2 = xp[1, kb + 2 * j + 2]
                        y3 = xp[1, kb + 2 * j + 3]
                        for n in range(NT):
                            dl = sd[sl, n]
                            ml = sm[sl, n]
                            dh = sd[sh, n]
                            mh = sm[sh, n]
                            q0 = qs[g, b, i, j, n]
                            q1 = qs[g, b, i, j + 1, n]
                            h0 = qh[g, b, j, n]
                            h1 = qh[g, b, j + 1, n]
                            w0 = fma32(q5f(q0, 0, h0, sl, 1, 0), dl, ml)
                            w1 = fma32(q5f(q0, 4, h0, sh, 1, 0), dh, mh)
                            w2 = fma32(q5f(q1, 0, h1, sl, 1, 0), dl, ml)
                            w3 = fma32(q5f(q1, 4, h1, sh, 1, 0), dh, mh)
                            s = acc[0, n]
                            s = fma32(w0, x0, s)
                            s = fma32(w1, x1, s)
                            s = fma32(w2, x2, s)
                            s = fma32(w3, x3, s)
                            acc[0, n] = s
                            s = acc[1, n]
                            s = fma32(w0, y0, s)
                            s = fma32(w1, y1, s)
                            s = fma32(w2, y2, s)
                            s = fma32(w3, y3, s)
                            acc[1, n] = s
                else:
                    for j in range(32):
                        for n in range(NT):
                            q0 = qs[g, b, i, j, n]
                            h0 = qh[g, b, j, n]
                            wb[2 * j, n] = fma32(q5f(q0, 0, h0, sl, 1, 0), sd[sl, n], sm[sl, n])
                            wb[2 * j + 1, n] = fma32(q5f(q0, 4, h0, sh, 1, 0), sd[sh, n], sm[sh, n])
                    _use(wb, xp, acc, T, kb, 64, out, perm, (g - g0) * NT)
        _store(acc, out, g, T)


@njit(cache=True)
def _r_q5_k(qs, qh, d, dmin, sc, mn, rows, out):
    nb = qs.shape[1]
    for r in range(rows.shape[0]):
        g, n = divmod(rows[r], NT)
        for b in range(nb):
            dd = h2f(d[g, b, n])
            dm = h2f(dmin[g, b, n])
            for i in range(4):
                sl = 2 * i
                sh = 2 * i + 1
                dl = dd * i2f(sc[g, b, sl, n])
                ml = dm * i2f(mn[g, b, sl, n])
                dh = dd * i2f(sc[g, b, sh, n])
                mh = dm * i2f(mn[g, b, sh, n])
                k0 = b * 256 + i * 64
                for j in range(32):
                    q = qs[g, b, i, j, n]
                    h = qh[g, b, j, n]
                    out[r, k0 + j] = dl * q5f(q, 0, h, sl, 1, 0) - ml
                    out[r, k0 + 32 + j] = dh * q5f(q, 4, h, sh, 1, 0) - mh


# ---------------------------------------------------------------------------------------------------------
# Q6_K: per super-block: ql uint8 [tiles, nsb, 2, 64, NT], qh uint8 [tiles, nsb, 2, 32, NT], sc int8
# [tiles, nsb, 16, NT] (one per 16 elements), d f16 bits [tiles, nsb, NT]. Unit = half h (128 elements);
# step l (0..31) yields elements 128h + l, +32, +64, +96 from ql[l] low, ql[l+32] low, ql[l] high,
# ql[l+32] high and the 2-bit fields 0..3 of qh[l]; canonical order = that.
def _k_q6_k(p0, p1, p2, p3, p4, p5, nt, nb, pxp, T, Kp, g0, g1, pout, N):
    ql = carray(_pu8(p0), (nt, nb, 2, 64, NT))
    qh = carray(_pu8(p1), (nt, nb, 2, 32, NT))
    sc = carray(_pi8(p2), (nt, nb, 16, NT))
    d = carray(_pu16(p3), (nt, nb, NT))
    xp, perm, out, acc, wb, sd, sm = _scratch(pxp, T, Kp, pout, N)
    for g in range(g0, g1):
        acc[:, :] = 0.0
        for b in range(nb):
            for s in range(16):
                for n in range(NT):
                    sd[s, n] = h2f(d[g, b, n]) * i2f(sc[g, b, s, n])
            for hf in range(2):
                kb = b * 256 + hf * 128
                if T == 1:
                    for ll in range(32):
                        s0 = hf * 8 + ll // 16
                        x0 = xp[0, kb + 4 * ll]
                        x1 = xp[0, kb + 4 * ll + 1]
                        x2 = xp[0, kb + 4 * ll + 2]
                        x3 = xp[0, kb + 4 * ll + 3]
                        for n in range(NT):
                            q0 = ql[g, b, hf, ll, n]
                            q1 = ql[g, b, hf, ll + 32, n]
                            h = qh[g, b, hf, ll, n]
                            s = acc[0, n]
                            s = fma32(sd[s0, n] * q5f(q0, 0, h, 0, 3, 32), x0, s)
                            s = fma32(sd[s0 + 2, n] * q5f(q1, 0, h, 2, 3, 32), x1, s)
                            s = fma32(sd[s0 + 4, n] * q5f(q0, 4, h, 4, 3, 32), x2, s)
                            s = fma32(sd[s0 + 6, n] * q5f(q1, 4, h, 6, 3, 32), x3, s)
                            acc[0, n] = s
                elif T == 2:
                    for ll in range(32):
                        s0 = hf * 8 + ll // 16
                        x0 = xp[0, kb + 4 * ll]
                        x1 = xp[0, kb + 4 * ll + 1]
                        x2 = xp[0, kb + 4 * ll + 2]
                        x3 = xp[0, kb + 4 * ll + 3]
                        y0 = xp[1, kb + 4 * ll]
                        y1 = xp[1, kb + 4 * ll + 1]
                        y2 = xp[1, kb + 4 * ll + 2]
                        y3 = xp[1, kb + 4 * ll + 3]
                        for n in range(NT):
                            q0 = ql[g, b, hf, ll, n]
                            q1 = ql[g, b, hf, ll + 32, n]
                            h = qh[g, b, hf, ll, n]
                            w0 = sd[s0, n] * q5f(q0, 0, h, 0, 3, 32)
                            w1 = sd[s0 + 2, n] * q5f(q1, 0, h, 2, 3, 32)
                            w2 = sd[s0 + 4, n] * q5f(q0, 4, h, 4, 3, 32)
                            w3 = sd[s0 + 6, n] * q5f(q1, 4, h, 6, 3, 32)
                            s = acc[0, n]
                            s = fma32(w0, x0, s)
                            s = fma32(w1, x1, s)
                            s = fma32(w2, x2, s)
                            s = fma32(w3, x3, s)
                            acc[0, n] = s
                            s = acc[1, n]
                            s = fma32(w0, y0, s)
                            s = fma32(w1, y1, s)
                            s = fma32(w2, y2, s)
                            s = fma32(w3, y3, s)
                            acc[1, n] = s
                else:
                    for ll in range(32):
                        s0 = hf * 8 + ll // 16
                        for n in range(NT):
                            q0 = ql[g, b, hf, ll, n]
                            q1 = ql[g, b, hf, ll + 32, n]
                            h = qh[g, b, hf, ll, n]
                            wb[4 * ll, n] = sd[s0, n] * q5f(q0, 0, h, 0, 3, 32)
                            wb[4 * ll + 1, n] = sd[s0 + 2, n] * q5f(q1, 0, h, 2, 3, 32)
                            wb[4 * ll + 2, n] = sd[s0 + 4, n] * q5f(q0, 4, h, 4, 3, 32)
                            wb[4 * ll + 3, n] = sd[s0 + 6, n] * q5f(q1, 4, h, 6, 3, 32)
                    _use(wb, xp, acc, T, kb, 128, out, perm, (g - g0) * NT)
        _store(acc, out, g, T)


@njit(cache=True)
def _r_q6_k(ql, qh, sc, d, rows, out):
    nb = ql.shape[1]
    for r in range(rows.shape[0]):
        g, n = divmod(rows[r], NT)
        for b in range(nb):
            dd = h2f(d[g, b, n])
            for hf in range(2):
                k0 = b * 256 + hf * 128
                for ll in range(32):
                    s0 = hf * 8 + ll // 16
                    q0 = ql[g, b, hf, ll, n]
                    q1 = ql[g, b, hf, ll + 32, n]
                    h = qh[g, b, hf, ll, n]
                    out[r, k0 + ll] = (dd * i2f(sc[g, b, s0, n])) * q5f(q0, 0, h, 0, 3, 32)
                    out[r, k0 + 32 + ll] = (dd * i2f(sc[g, b, s0 + 2, n])) * q5f(q1, 0, h, 2, 3, 32)
                    out[r, k0 + 64 + ll] = (dd * i2f(sc[g, b, s0 + 4, n])) * q5f(q0, 4, h, 4, 3, 32)
                    out[r, k0 + 96 + ll] = (dd * i2f(sc[g, b, s0 + 6, n])) * q5f(q1, 4, h, 6, 3, 32)


# ---------------------------------------------------------------------------------------------------------
# IQ4_XS: per super-block: qs uint8 [tiles, nsb, 8, 16, NT] (sub-block s, byte j: low nibble → element
# 32s + j, high → 32s + 16 + j), sc int8 [tiles, nsb, 8, NT] (decoded scale - 32), d f16 bits [tiles, nsb, NT].
# Unit = sub-block (32), canonical order as IQ4_NL.
def _k_iq4_xs(p0, p1, p2, p3, p4, p5, nt, nb, pxp, T, Kp, g0, g1, pout, N):
    qs = carray(_pu8(p0), (nt, nb, 8, 16, NT))
    sc = carray(_pi8(p1), (nt, nb, 8, NT))
    d = carray(_pu16(p2), (nt, nb, NT))
    xp, perm, out, acc, wb, sd, sm = _scratch(pxp, T, Kp, pout, N)
    for g in range(g0, g1):
        acc[:, :] = 0.0
        for b in range(nb):
            for s in range(8):
                for n in range(NT):
                    sd[s, n] = h2f(d[g, b, n]) * i2f(sc[g, b, s, n])
            for s in range(8):
                kb = b * 256 + s * 32
                if T == 1:
                    for j in range(0, 16, 2):
                        x0 = xp[0, kb + 2 * j]
                        x1 = xp[0, kb + 2 * j + 1]
                        x2 = xp[0, kb + 2 * j + 2]
                        x3 = xp[0, kb + 2 * j + 3]
                        for n in range(NT):
                            dl = sd[s, n]
                            q0 = qs[g, b, s, j, n]
                            q1 = qs[g, b, s, j + 1, n]
                            a = acc[0, n]
                            a = fma32(dl * kvf(q0 & 15), x0, a)
                            a = fma32(dl * kvf(q0 >> 4), x1, a)
                            a = fma32(dl * kvf(q1 & 15), x2, a)
                            a = fma32(dl * kvf(q1 >> 4), x3, a)
                            acc[0, n] = a
                elif T == 2:
                    for j in range(0, 16, 2):
                        x0 = xp[0, kb + 2 * j]
                        x1 = xp[0, kb + 2 * j + 1]
                        x2 = xp[0, kb + 2 * j + 2]
                        x3 = xp[0, kb + 2 * j + 3]
                        y0 = xp[1, kb + 2 * j]
                        y1 = xp[1, kb + 2 * j + 1]
                        y2 = xp[1, kb + 2 * j + 2]
                        y3 = xp[1, kb + 2 * j + 3]
                        for n in range(NT):
                            dl = sd[s, n]
                            q0 = qs[g, b, s, j, n]
                            q1 = qs[g, b, s, j + 1, n]
                            w0 = dl * kvf(q0 & 15)
                            w1 = dl * kvf(q0 >> 4)
                            w2 = dl * kvf(q1 & 15)
                            w3 = dl * kvf(q1 >> 4)
                            a = acc[0, n]
                            a = fma32(w0, x0, a)
                            a = fma32(w1, x1, a)
                            a = fma32(w2, x2, a)
                            a = fma32(w3, x3, a)
                            acc[0, n] = a
                            a = acc[1, n]
                            a = fma32(w0, y0, a)
                            a = fma32(w1, y1, a)
                            a = fma32(w2, y2, a)
                            a = fma32(w3, y3, a)
                            acc[1, n] = a
                else:
                    for j in range(16):
                        for n in range(NT):
                            dl = sd[s, n]
                            q0 = qs[g, b, s, j, n]
                            wb[2 * j, n] = dl * kvf(q0 & 15)
                            wb[2 * j + 1, n] = dl * kvf(q0 >> 4)
                    _use(wb, xp, acc, T, kb, 32, out, perm, (g - g0) * NT)
        _store(acc, out, g, T)


@njit(cache=True)
def _r_iq4_xs(qs, sc, d, rows, out):
    nb = qs.shape[1]
    kv = _KV
    for r in range(rows.shape[0]):
        g, n = divmod(rows[r], NT)
        for b in range(nb):
            dd = h2f(d[g, b, n])
            for s in range(8):
                dl = dd * i2f(sc[g, b, s, n])
                k0 = b * 256 + s * 32
                for j in range(16):
                    q = qs[g, b, s, j, n]
                    out[r, k0 + j] = dl * kv[q & 15]
                    out[r, k0 + 16 + j] = dl * kv[q >> 4]


# ---------------------------------------------------------------------------------------------------------
# F32 / F16 / BF16: w [tiles, nb, 32, NT] (float32, or uint16 bits), K zero-padded to a multiple of 32
def _k_f32(p0, p1, p2, p3, p4, p5, nt, nb, pxp, T, Kp, g0, g1, pout, N):
    w = carray(_pf32(p0), (nt, nb, 32, NT))
    xp, perm, out, acc, wb, sd, sm = _scratch(pxp, T, Kp, pout, N)
    for g in range(g0, g1):
        acc[:, :] = 0.0
        for b in range(nb):
            _use(w[g, b], xp, acc, T, b * 32, 32, out, perm, (g - g0) * NT)
        _store(acc, out, g, T)


@njit(cache=True)
def _r_f32(w, rows, out):
    K = out.shape[1]
    for r in range(rows.shape[0]):
        g, n = divmod(rows[r], NT)
        for k in range(K):
            out[r, k] = w[g, k // 32, k % 32, n]


def _k_f16(p0, p1, p2, p3, p4, p5, nt, nb, pxp, T, Kp, g0, g1, pout, N):
    w = carray(_pu16(p0), (nt, nb, 32, NT))
    xp, perm, out, acc, wb, sd, sm = _scratch(pxp, T, Kp, pout, N)
    for g in range(g0, g1):
        acc[:, :] = 0.0
        for b in range(nb):
            for u in range(32):
                for n in range(NT):
                    wb[u, n] = h2f(w[g, b, u, n])
            _use(wb, xp, acc, T, b * 32, 32, out, perm, (g - g0) * NT)
        _store(acc, out, g, T)


@njit(cache=True)
def _r_f16(w, rows, out):
    K = out.shape[1]
    for r in range(rows.shape[0]):
        g, n = divmod(rows[r], NT)
        for k in range(K):
            out[r, k] = h2f(w[g, k // 32, k % 32, n])


def _k_bf16(p0, p1, p2, p3, p4, p5, nt, nb, pxp, T, Kp, g0, g1, pout, N):
    w = carray(_pu16(p0), (nt, nb, 32, NT))
    xp, perm, out, acc, wb, sd, sm = _scratch(pxp, T, Kp, pout, N)
    for g in range(g0, g1):
        acc[:, :] = 0.0
        for b in range(nb):
            for u in range(32):
                for n in range(NT):
                    wb[u, n] = bf2f(w[g, b, u, n])
            _use(wb, xp, acc, T, b * 32, 32, out, perm, (g - g0) * NT)
        _store(acc, out, g, T)


@njit(cache=True)
def _r_bf16(w, rows, out):
    K = out.shape[1]
    for r in range(rows.shape[0]):
        g, n = divmod(rows[r], NT)
        for k in range(K):
            out[r, k] = bf2f(w[g, k // 32, k % 32, n])


# ---------------------------------------------------------------------------------------------------------
# packing (NumPy, once per matrix at load)
def _tiles(a: np.ndarray, n_rows: int) -> np.ndarray:
    """[N, ...] → [tiles, ..., NT]: rows padded to a multiple of NT with zeros, feature axis last."""
    ntiles = -(-n_rows // NT)
    pad = ntiles * NT - n_rows
    if pad:
        a = np.concatenate([a, np.zeros((pad,) + a.shape[1:], a.dtype)], axis=0)
    a = a.reshape((ntiles, NT) + a.shape[1:])
    return np.ascontiguousarray(np.moveaxis(a, 1, -1))


def _u16(b: np.ndarray) -> np.ndarray:
    """[..., 2] bytes → uint16 [...]."""
    return np.ascontiguousarray(b).view(np.uint16)[..., 0]


def _perm_pairs(K: int, unit: int) -> np.ndarray:
    """Canonical order of nibble-pair units: byte j of a unit of `unit` elements holds elements j and
    j + unit/2, visited as j, j + unit/2, j + 1, ..."""
    half = unit // 2
    j = np.arange(half)
    one = np.stack([j, j + half], axis=1).reshape(-1)
    return (np.arange(0, K, unit)[:, None] + one[None, :]).reshape(-1)


def _perm_q6_k(K: int) -> np.ndarray:
    ll = np.arange(32)
    one = np.stack([ll, ll + 32, ll + 64, ll + 96], axis=1).reshape(-1)  # one half of a super-block
    return (np.arange(0, K, 128)[:, None] + one[None, :]).reshape(-1)


_EMPTY = np.zeros(0, np.uint8)


class PackedMatrix:
    """Weights of one linear layer, repacked for the kernels; built once at model load.

    qtype, n_rows (N output features), n_cols (K input features). `arrays`: the packed arrays (typed, tiled,
    see the layout notes above each kernel), `flat`: the same memory as six flat uint8 arrays (unused slots
    empty) handed to the drivers, `dims` = (tiles, blocks per row), `perm`: the canonical activation order
    (int64 [Kp], -1 = zero padding)."""

    __slots__ = ("qtype", "n_rows", "n_cols", "arrays", "flat", "dims", "perm", "kind", "nbytes")

    def __init__(self, qtype: int, n_rows: int, n_cols: int, arrays: tuple, perm: np.ndarray, n_blocks: int):
        self.qtype = int(qtype)
        self.n_rows = int(n_rows)
        self.n_cols = int(n_cols)
        self.kind = _KIND[self.qtype]
        self.arrays = arrays
        flat = [np.ascontiguousarray(a).reshape(-1).view(np.uint8) for a in arrays]
        self.flat = tuple(flat + [_EMPTY] * (6 - len(flat)))
        self.dims = np.array([arrays[0].shape[0], n_blocks], np.int64)
        self.perm = np.ascontiguousarray(perm, dtype=np.int64)
        self.nbytes = int(sum(a.nbytes for a in arrays))

    def __repr__(self) -> str:
        return f"PackedMatrix({Q(self.qtype).name}, {self.n_rows}x{self.n_cols}, {self.nbytes} bytes)"


def pack(qtype: int, raw: np.ndarray, n_rows: int, n_cols: int) -> PackedMatrix:
    """Repack raw GGUF data of an [n_rows, n_cols] matrix into the tiled layout (quantized, same bits)."""
    qt = Q(int(qtype))
    if int(qt) not in _KIND:
        raise NotImplementedError(f"no CPU kernel for quant type {qt.name}")
    N, K = int(n_rows), int(n_cols)
    rb = row_bytes(qt, K)
    b = np.ascontiguousarray(raw).view(np.uint8).reshape(N, rb)
    bs, ts = BLOCK[qt]
    if qt in (Q.F32, Q.F16, Q.BF16):
        Kp = -(-K // 32) * 32
        dt = np.float32 if qt == Q.F32 else np.uint16
        w = np.zeros((N, Kp), dt)
        w[:, :K] = b.view(dt)
        arrays = (_tiles(w.reshape(N, Kp // 32, 32), N),)
        perm = np.full(Kp, -1, np.int64)
        perm[:K] = np.arange(K)
        return PackedMatrix(qt, N, K, arrays, perm, Kp // 32)
    blk = b.reshape(N, K // bs, ts)
    if qt == Q.Q8_0:
        arrays = (_tiles(blk[..., 2:34].view(np.int8), N), _tiles(_u16(blk[..., 0:2]), N))
        perm = np.arange(K, dtype=np.int64)
    elif qt in (Q.Q4_0, Q.IQ4_NL):
        arrays = (_tiles(blk[..., 2:18], N), _tiles(_u16(blk[..., 0:2]), N))
        perm = _perm_pairs(K, 32)
    elif qt == Q.Q4_1:
        arrays = (_tiles(blk[..., 4:20], N), _tiles(_u16(blk[..., 0:2]), N), _tiles(_u16(blk[..., 2:4]), N))
        perm = _perm_pairs(K, 32)
    elif qt == Q.Q5_0:
        qh = np.ascontiguousarray(blk[..., 2:6]).view(np.uint32)[..., 0]
        arrays = (_tiles(blk[..., 6:22], N), _tiles(qh, N), _tiles(_u16(blk[..., 0:2]), N))
        perm = _perm_pairs(K, 32)
    elif qt in (Q.Q4_K, Q.Q5_K):
        nsb = K // 256
        d, dmin = _tiles(_u16(blk[..., 0:2]), N), _tiles(_u16(blk[..., 2:4]), N)
        sc, mn = k_scale_min(blk[..., 4:16])
        sc, mn = _tiles(sc, N), _tiles(mn, N)
        if qt == Q.Q4_K:
            qs = _tiles(blk[..., 16:144].reshape(N, nsb, 4, 32), N)
            arrays = (qs, d, dmin, sc, mn)
        else:
            qh = _tiles(blk[..., 16:48], N)
            qs = _tiles(blk[..., 48:176].reshape(N, nsb, 4, 32), N)
            arrays = (qs, qh, d, dmin, sc, mn)
        perm = _perm_pairs(K, 64)
    elif qt == Q.Q6_K:
        nsb = K // 256
        ql = _tiles(blk[..., 0:128].reshape(N, nsb, 2, 64), N)
        qh = _tiles(blk[..., 128:192].reshape(N, nsb, 2, 32), N)
        sc = _tiles(blk[..., 192:208].view(np.int8), N)
        arrays = (ql, qh, sc, _tiles(_u16(blk[..., 208:210]), N))
        perm = _perm_q6_k(K)
    elif qt == Q.IQ4_XS:
        nsb = K // 256
        sh = _u16(blk[..., 2:4])
        sc = iq4xs_scales(sh, blk[..., 4:8]).astype(np.int8)
        qs = _tiles(blk[..., 8:136].reshape(N, nsb, 8, 16), N)
        arrays = (qs, _tiles(sc, N), _tiles(_u16(blk[..., 0:2]), N))
        perm = _perm_pairs(K, 32)
    else:  # pragma: no cover
        raise NotImplementedError(qt.name)
    return PackedMatrix(qt, N, K, arrays, perm, K // bs)


KINDS = (Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.IQ4_NL, Q.IQ4_XS)
_KIND = {int(q): i for i, q in enumerate(KINDS)}


# ---------------------------------------------------------------------------------------------------------
# dispatch: GEMV kernels are cfuncs called by address from one parallel launcher (so that each kernel is
# compiled once, lazily, and never re-optimised inside another function); get_rows are plain njit functions.
_KPY = (_k_f32, _k_f16, _k_bf16, _k_q8_0, _k_q4_0, _k_q4_1, _k_q5_0, _k_q4_k, _k_q5_k, _k_q6_k, _k_iq4_nl, _k_iq4_xs)
_ROWS = (_r_f32, _r_f16, _r_bf16, _r_q8_0, _r_q4_0, _r_q4_1, _r_q5_0, _r_q4_k, _r_q5_k, _r_q6_k, _r_iq4_nl, _r_iq4_xs)
_KFUNC: dict[int, object] = {}  # kind → compiled cfunc (kept alive: the launcher only sees its address)
_KADDR: dict[int, int] = {}


def _kernel(kind: int):
    cf = _KFUNC.get(kind)
    if cf is None:
        cf = cfunc(_KSIG, cache=True)(_KPY[kind])
        _KFUNC[kind] = cf
        _KADDR[kind] = cf.address
    return cf


def _kernel_address(kind: int) -> int:
    addr = _KADDR.get(kind)
    if addr is None:
        _kernel(kind)
        addr = _KADDR[kind]
    return addr


# one chunk of tiles per launched Numba thread (asking numba for the current thread count from Python costs
# ~3 µs a call); with fewer threads in use, prange hands each thread several chunks
_N_CHUNKS = max(1, int(numba.config.NUMBA_NUM_THREADS))


@njit(parallel=True, cache=True)
def _launch(fn, a0, a1, a2, a3, a4, a5, dims, perm, x, xp, out, nchunks):
    """out [T, N] = W x for T <= _GEMV_PATH_ROWS: one parallel region; each thread runs the kernel `fn` (an
    address) on its own contiguous range of tiles. xp [T, Kp] is the caller's buffer for the permuted
    activations (owned by the caller, so that it outlives the kernels, which only see addresses)."""
    T = x.shape[0]
    N = out.shape[1]
    nt, nb = dims[0], dims[1]
    Kp = perm.shape[0]
    _permute_x(x, perm, xp)
    nc = min(nchunks, nt)
    p0 = a0.ctypes.data
    p1 = a1.ctypes.data
    p2 = a2.ctypes.data
    p3 = a3.ctypes.data
    p4 = a4.ctypes.data
    p5 = a5.ctypes.data
    pxp = xp.ctypes.data
    pout = out.ctypes.data
    for c in prange(nc):
        _call_kernel(fn, p0, p1, p2, p3, p4, p5, nt, nb, pxp, T, Kp, c * nt // nc, (c + 1) * nt // nc, pout, N)


# ---------------------------------------------------------------------------------------------------------
# public API
def matmul(w: PackedMatrix, x: np.ndarray, out: np.ndarray) -> None:
    """out[t, n] = sum_k W[n, k] * x[t, k]. x float32 [T, K] (C-contiguous), out float32 [T, N]."""
    T = x.shape[0]
    if x.ndim != 2 or x.shape[1] != w.n_cols or out.shape != (T, w.n_rows):
        raise ValueError(
            f"matmul: W is {w.n_rows}x{w.n_cols}, x {tuple(x.shape)}, out {tuple(out.shape)} "
            f"(want x [T, {w.n_cols}], out [T, {w.n_rows}])"
        )
    if T == 0:
        return
    if x.dtype != np.float32 or not x.flags.c_contiguous:
        x = np.ascontiguousarray(x, dtype=np.float32)
    if T <= _GEMV_PATH_ROWS:
        fn = _KADDR.get(w.kind) or _kernel_address(w.kind)
        xp = np.empty((T, w.perm.shape[0]), np.float32)
        if out.flags.c_contiguous and out.dtype == np.float32:
            _launch(fn, *w.flat, w.dims, w.perm, x, xp, out, _N_CHUNKS)
        else:
            tmp = np.empty((T, w.n_rows), np.float32)
            _launch(fn, *w.flat, w.dims, w.perm, x, xp, tmp, _N_CHUNKS)
            out[...] = tmp
        return
    # prefill: the same kernels dequantise chunks of tiles to float32 [K, cols] (mode T = 0), BLAS multiplies;
    # each worker thread takes a contiguous share of the tiles with its own scratch and single-threaded BLAS
    cf = _KFUNC.get(w.kind) or _kernel(w.kind)
    nt = int(w.dims[0])
    n_workers = min(numba.get_num_threads(), nt)
    if out.flags.c_contiguous and out.dtype == np.float32:
        dst = out
    else:
        dst = np.empty((T, w.n_rows), np.float32)
    if n_workers == 1:
        _prefill_part(cf, w, x, dst, 0, nt)
    else:
        jobs = [
            _pool(n_workers).submit(_prefill_part, cf, w, x, dst, c * nt // n_workers, (c + 1) * nt // n_workers)
            for c in range(n_workers)
        ]
        for j in jobs:
            j.result()
    if dst is not out:
        out[...] = dst


def _prefill_part(cf, w: PackedMatrix, x: np.ndarray, out: np.ndarray, t0: int, t1: int) -> None:
    """Tiles t0..t1 of the prefill product: dequantise up to _PREFILL_ROWS features, then x @ chunk (BLAS).
    The cfunc is called through ctypes and numpy's matmul runs in C: both release the GIL."""
    nt, nb = int(w.dims[0]), int(w.dims[1])
    Kp = w.perm.shape[0]
    step = max(1, _PREFILL_ROWS // NT)
    buf = np.empty((Kp, min(step, t1 - t0) * NT), np.float32)
    ptrs = [a.ctypes.data for a in w.flat]
    for g0 in range(t0, t1, step):
        g1 = min(g0 + step, t1)
        cf.ctypes(*ptrs, nt, nb, w.perm.ctypes.data, 0, Kp, g0, g1, buf.ctypes.data, buf.shape[1])
        n0, n1 = g0 * NT, min(g1 * NT, w.n_rows)
        np.matmul(x, buf[: w.n_cols, : n1 - n0], out=out[:, n0:n1])


_POOL: list = [None, 0]


def _pool(n: int):
    """Worker threads for the prefill path (BLAS is kept single-threaded, see _limit_blas)."""
    if _POOL[1] < n:
        from concurrent.futures import ThreadPoolExecutor

        _POOL[0] = ThreadPoolExecutor(max_workers=n, thread_name_prefix="guild-prefill")
        _POOL[1] = n
    return _POOL[0]


def _limit_blas() -> None:
    """One BLAS thread: OpenBLAS's own threads spin after each call and, on a machine with as many threads as
    cores, stall the next Numba parallel region by a scheduler slice (measured: +5 ms per region here)."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover
        return
    threadpool_limits(1, user_api="blas")


_limit_blas()


def dequantize_rows(w: PackedMatrix, rows: np.ndarray, out: np.ndarray) -> None:
    """out[r] = W[rows[r]] as float32 (embedding lookup), bit-exact with gguf.quants.dequantize."""
    rows = np.ascontiguousarray(rows, dtype=np.int64).reshape(-1)
    if out.shape != (rows.size, w.n_cols):
        raise ValueError(f"dequantize_rows: out is {tuple(out.shape)}, want ({rows.size}, {w.n_cols})")
    if rows.size and (rows.min() < 0 or rows.max() >= w.n_rows):
        raise IndexError(f"row index out of range for a matrix of {w.n_rows} rows")
    if out.flags.c_contiguous and out.dtype == np.float32:
        _ROWS[w.kind](*w.arrays, rows, out)
    else:
        tmp = np.empty((rows.size, w.n_cols), np.float32)
        _ROWS[w.kind](*w.arrays, rows, tmp)
        out[...] = tmp


def dequantize(w: PackedMatrix) -> np.ndarray:
    """The whole matrix as float32 [N, K] (tests / reference)."""
    out = np.empty((w.n_rows, w.n_cols), np.float32)
    _ROWS[w.kind](*w.arrays, np.arange(w.n_rows, dtype=np.int64), out)
    return out
