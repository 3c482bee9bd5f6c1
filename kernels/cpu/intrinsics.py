"""Numba intrinsics of the quantized CPU kernels: scalar float/int conversions that stay in 32-bit lanes (the
loop vectoriser widens them; Numba would widen int arithmetic to int64 and lose packed code), the IQ4 grid
without a gather, typed pointers from addresses, and the indirect call of a kernel cfunc."""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from ..blocks import KVALUES_IQ4NL


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
def f2h(typingctx, x):
    """float32 → IEEE half bits (uint16), rounded to nearest even (vcvtps2ph): NumPy's astype(np.float16)."""
    if x != types.float32:
        return None
    sig = types.uint16(types.float32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(builder.fptrunc(args[0], ir.HalfType()), ir.IntType(16))

    return sig, codegen


@intrinsic
def floorf(typingctx, x):
    """floor(x) for float32 (llvm.floor.f32: vroundps in vector loops, where np.floor is a library call)."""
    if x != types.float32:
        return None
    sig = types.float32(types.float32)

    def codegen(context, builder, signature, args):
        f = ir.FloatType()
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(f, [f]), "llvm.floor.f32")
        return builder.call(fn, args)

    return sig, codegen


@intrinsic
def pow2f(typingctx, n):
    """2^n as float32 for an integral float32 n in -126..127 (built from the exponent bits; vectorises)."""
    if n != types.float32:
        return None
    sig = types.float32(types.float32)

    def codegen(context, builder, signature, args):
        i32 = ir.IntType(32)
        e = builder.add(builder.fptosi(args[0], i32), ir.Constant(i32, 127))
        return builder.bitcast(builder.shl(e, ir.Constant(i32, 23)), ir.FloatType())

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
_pi32 = _ptr_intrinsic(types.int32)
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

KV = KVALUES_IQ4NL.astype(np.float32)


@njit(cache=True, inline="always")
def sgnf(bits, m):
    """-1.0 where bit m of the sign byte is set (kmask_iq2xs[m]), else +1.0, as float32."""
    return np.float32(1.0) - np.float32(2.0) * i2f((bits >> m) & 1)


@intrinsic
def e8m0h(typingctx, e):
    """MXFP4 exponent byte → 2^(e - 128) as float32 (ggml_e8m0_to_fp32_half: a subnormal for e < 2)."""
    if e != types.uint8:
        return None
    sig = types.float32(types.uint8)

    def codegen(context, builder, signature, args):
        i32 = ir.IntType(32)
        v = builder.zext(args[0], i32)
        small = builder.shl(ir.Constant(i32, 0x00200000), v)
        big = builder.shl(builder.sub(v, ir.Constant(i32, 1)), ir.Constant(i32, 23))
        bits = builder.select(builder.icmp_unsigned("<", v, ir.Constant(i32, 2)), small, big)
        return builder.bitcast(bits, ir.FloatType())

    return sig, codegen


@njit(cache=True, inline="always")
def mxf(q):
    """kvalues_mxfp4[q] (q = 0..15) as float32 without a table gather: |v| = m for m < 4, else (2 + m % 2)
    << (m // 2 - 1); 0 - v for the sign so that q = 8 gives +0 like the table."""
    m = q & 7
    v = i2f(m) if m < 4 else i2f((2 + (m & 1)) << ((m >> 1) - 1))
    return v if q < 8 else np.float32(0.0) - v


@intrinsic
def fetch_add(typingctx, addr, v):
    """Atomically add v to the int64 at address addr; returns the value before (work handed out on demand)."""
    if not isinstance(addr, types.Integer) or not isinstance(v, types.Integer):
        return None
    sig = types.int64(addr, v)

    def codegen(context, builder, signature, args):
        i64 = ir.IntType(64)
        ptr = builder.inttoptr(context.cast(builder, args[0], signature.args[0], types.int64), i64.as_pointer())
        return builder.atomic_rmw("add", ptr, context.cast(builder, args[1], signature.args[1], types.int64),
                                  "monotonic")

    return sig, codegen


@intrinsic
def cycles(typingctx):
    """The CPU's cycle counter (rdtsc on x86: a constant rate where the CPU has constant_tsc), to time a part of
    a compiled call from inside it."""
    sig = types.int64()

    def codegen(context, builder, signature, args):
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.IntType(64), []),
                                            "llvm.readcyclecounter")
        return builder.call(fn, [])

    return sig, codegen


@njit(cache=True)
def read_cycles():
    return cycles()
