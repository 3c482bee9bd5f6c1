"""16-lane vector values for Numba kernels (the int8-activation path, kernels/cpu/qdot.py).

Numba has no vector types and its loop vectoriser does not form integer dot products, so these intrinsics give
the kernels explicit `<16 x i32>` / `<16 x float>` values: loads from addresses, broadcasts, nibble masks,
`dpbusd` (four u8 × s8 products summed into each 32-bit lane) and fma. Each is a few lines of LLVM IR that the
optimiser sees whole, so values stay in registers across a kernel's loops. `dpbusd` is the AVX-512 VNNI
instruction `vpdpbusd` where the host has it (chosen at compile time from the host's features, like the rest of
Numba's code generation) and exact portable IR elsewhere (zero/sign extension, multiply, add), which LLVM
lowers with the host's best integer multiplies.
"""

from __future__ import annotations

import os

import llvmlite.binding as llvm
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.core.datamodel import models
from numba.extending import intrinsic, register_model


def _host_features() -> str:
    try:
        return llvm.get_host_cpu_features().flatten()
    except Exception:  # pragma: no cover - feature query unavailable
        return ""


# GUILD_NO_VNNI=1 forces the portable IR (tests compare the two on a VNNI host)
VNNI512 = ("+avx512vnni" in _host_features() and "+avx512bw" in _host_features()
           and os.environ.get("GUILD_NO_VNNI", "") in ("", "0"))


class Vec(types.Type):
    """A 16-lane SIMD value: kind 'i32' or 'f32'."""

    def __init__(self, kind: str):
        self.kind = kind
        super().__init__(name=f"vec16_{kind}")


I32 = Vec("i32")
F32 = Vec("f32")
_i32 = ir.IntType(32)
_VI = ir.VectorType(_i32, 16)
_VF = ir.VectorType(ir.FloatType(), 16)


@register_model(Vec)
class _VecModel(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, _VI if fe_type.kind == "i32" else _VF)


def _at(builder, addr, ty):
    return builder.inttoptr(addr, ty.as_pointer())


def _splat(builder, val, vt):
    undef = ir.Constant(vt, None)
    v = builder.insert_element(undef, val, ir.Constant(_i32, 0))
    return builder.shuffle_vector(v, undef, ir.Constant(_VI, [0] * 16))


def _simple(sig, body):
    """An intrinsic of fixed signature whose codegen is body(builder, args)."""

    def typer(typingctx, *args):
        return sig, lambda context, builder, s, a: body(builder, a)

    return typer


# loads and stores at int64 addresses (unaligned)
@intrinsic
def ld_i32(typingctx, addr):
    """16 x i32 (64 bytes) at addr."""
    return _simple(I32(types.int64), lambda b, a: b.load(_at(b, a[0], _VI), align=1))(typingctx, addr)


@intrinsic
def ld_h2f(typingctx, addr):
    """16 IEEE halves at addr, converted to f32 (vcvtph2ps)."""
    vh = ir.VectorType(ir.HalfType(), 16)
    return _simple(F32(types.int64), lambda b, a: b.fpext(b.load(_at(b, a[0], vh), align=1), _VF))(typingctx, addr)


@intrinsic
def ld_f32(typingctx, addr):
    return _simple(F32(types.int64), lambda b, a: b.load(_at(b, a[0], _VF), align=4))(typingctx, addr)


@intrinsic
def st_f32(typingctx, addr, v):
    """Store all 16 lanes at addr."""

    def body(b, a):
        b.store(a[1], _at(b, a[0], _VF), align=4)
        return ir.Constant(ir.IntType(8), 0)

    return _simple(types.uint8(types.int64, F32), body)(typingctx, addr, v)


@intrinsic
def lane(typingctx, v, i):
    """Lane i of an f32 vector."""
    if v != F32 or not isinstance(i, types.Integer):
        return None
    return _simple(types.float32(F32, i), lambda b, a: b.extract_element(a[0], b.trunc(a[1], _i32)
                                                                         if a[1].type.width > 32 else a[1]))(
        typingctx, v, i)


@intrinsic
def bc_i32(typingctx, addr):
    """The int32 at addr (four packed bytes) in every lane (folds into the consumer as {1to16})."""

    def body(b, a):
        return _splat(b, b.load(_at(b, a[0], _i32), align=1), _VI)

    return _simple(I32(types.int64), body)(typingctx, addr)


@intrinsic
def splat_f(typingctx, x):
    return _simple(F32(types.float32), lambda b, a: _splat(b, a[0], _VF))(typingctx, x)


@intrinsic
def splat_i(typingctx, x):
    if not isinstance(x, types.Integer):
        return None
    return _simple(I32(x), lambda b, a: _splat(b, b.trunc(a[0], _i32) if a[0].type.width > 32 else a[0], _VI))(
        typingctx, x)


@intrinsic
def zero_i(typingctx):
    return _simple(I32(), lambda b, a: ir.Constant(_VI, [0] * 16))(typingctx)


@intrinsic
def zero_f(typingctx):
    return _simple(F32(), lambda b, a: ir.Constant(_VF, [0.0] * 16))(typingctx)


# integer lanes
@intrinsic
def lo4(typingctx, v):
    """Low nibble of every byte."""
    return _simple(I32(I32), lambda b, a: b.and_(a[0], ir.Constant(_VI, [0x0F0F0F0F] * 16)))(typingctx, v)


@intrinsic
def hi4(typingctx, v):
    """High nibble of every byte, moved to the low nibble."""

    def body(b, a):
        return b.and_(b.lshr(a[0], ir.Constant(_VI, [4] * 16)), ir.Constant(_VI, [0x0F0F0F0F] * 16))

    return _simple(I32(I32), body)(typingctx, v)


@intrinsic
def add_i(typingctx, x, y):
    return _simple(I32(I32, I32), lambda b, a: b.add(a[0], a[1]))(typingctx, x, y)


@intrinsic
def sub_i(typingctx, x, y):
    return _simple(I32(I32, I32), lambda b, a: b.sub(a[0], a[1]))(typingctx, x, y)


def _dpbusd_ir(b, acc, u, s):
    """Portable form: acc + sum over the 4 bytes of each lane of zext(u) * sext(s)."""
    b8 = ir.VectorType(ir.IntType(8), 64)
    w = ir.VectorType(_i32, 64)
    p = b.mul(b.zext(b.bitcast(u, b8), w), b.sext(b.bitcast(s, b8), w))
    out = acc
    for i in range(4):
        out = b.add(out, b.shuffle_vector(p, ir.Constant(w, None), ir.Constant(_VI, [4 * j + i for j in range(16)])))
    return out


def _dpbusd(vnni: bool):
    @intrinsic
    def dp(typingctx, acc, u, s):
        def body(b, a):
            if not vnni:
                return _dpbusd_ir(b, *a)
            fn = cgutils.get_or_insert_function(b.module, ir.FunctionType(_VI, [_VI] * 3),
                                                "llvm.x86.avx512.vpdpbusd.512")
            return b.call(fn, a)

        return _simple(I32(I32, I32, I32), body)(typingctx, acc, u, s)

    return dp


dpbusd = _dpbusd(VNNI512)
"""acc + Σ_{4 bytes of each lane} u8(u) · s8(s): vpdpbusd on AVX-512 VNNI hosts, portable IR elsewhere."""
dpbusd_portable = _dpbusd(False)  # the portable form everywhere (tests)


# float lanes
@intrinsic
def cvt(typingctx, v):
    """i32 lanes → f32 (exact for |v| < 2^24)."""
    return _simple(F32(I32), lambda b, a: b.sitofp(a[0], _VF))(typingctx, v)


@intrinsic
def add_f(typingctx, x, y):
    return _simple(F32(F32, F32), lambda b, a: b.fadd(a[0], a[1]))(typingctx, x, y)


@intrinsic
def abs_f(typingctx, x):
    def body(b, a):
        fn = cgutils.get_or_insert_function(b.module, ir.FunctionType(_VF, [_VF]), "llvm.fabs.v16f32")
        return b.call(fn, a)

    return _simple(F32(F32), body)(typingctx, x)


@intrinsic
def rint_i(typingctx, x):
    """Round to nearest, ties to even (the default rounding mode, as np.rint), then to i32 lanes."""

    def body(b, a):
        fn = cgutils.get_or_insert_function(b.module, ir.FunctionType(_VF, [_VF]), "llvm.rint.v16f32")
        return b.fptosi(b.call(fn, a), _VI)

    return _simple(I32(F32), body)(typingctx, x)


@intrinsic
def st_i8(typingctx, addr, v):
    """Store the 16 lanes truncated to bytes at addr."""

    def body(b, a):
        vb = ir.VectorType(ir.IntType(8), 16)
        b.store(b.trunc(a[1], vb), _at(b, a[0], vb), align=1)
        return ir.Constant(ir.IntType(8), 0)

    return _simple(types.uint8(types.int64, I32), body)(typingctx, addr, v)


@intrinsic
def hsum_i(typingctx, v):
    """Sum of the 16 lanes (exact)."""

    def body(b, a):
        fn = cgutils.get_or_insert_function(b.module, ir.FunctionType(_i32, [_VI]), "llvm.vector.reduce.add.v16i32")
        return b.sext(b.call(fn, a), ir.IntType(64))

    return _simple(types.int64(I32), body)(typingctx, v)


@intrinsic
def hmax_f(typingctx, v):
    """Max of the 16 lanes (exact in any order; for data without NaN)."""

    def body(b, a):
        out = b.extract_element(a[0], ir.Constant(_i32, 0))
        for i in range(1, 16):
            e = b.extract_element(a[0], ir.Constant(_i32, i))
            out = b.select(b.fcmp_ordered(">", e, out), e, out)
        return out

    return _simple(types.float32(F32), body)(typingctx, v)


@intrinsic
def max_f(typingctx, x, y):
    """Lane-wise max (for data without NaN)."""
    return _simple(F32(F32, F32), lambda b, a: b.select(b.fcmp_ordered(">", a[0], a[1]), a[0], a[1]))(typingctx, x, y)


@intrinsic
def mul_f(typingctx, x, y):
    return _simple(F32(F32, F32), lambda b, a: b.fmul(a[0], a[1]))(typingctx, x, y)


@intrinsic
def fma_f(typingctx, x, y, z):
    """x * y + z with one rounding per lane (llvm.fma)."""

    def body(b, a):
        fn = cgutils.get_or_insert_function(b.module, ir.FunctionType(_VF, [_VF] * 3), "llvm.fma.v16f32")
        return b.call(fn, a)

    return _simple(F32(F32, F32, F32), body)(typingctx, x, y, z)
