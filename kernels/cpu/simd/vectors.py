"""16-lane vector intrinsics: loads and stores at int64 addresses, broadcasts, lane-wise integer and float
arithmetic, nibble and bit-field extraction, and reductions."""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from .isa import _VF, _VI, F32, I32, _at, _i32, _simple, _splat


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
def bc_f32(typingctx, addr):
    """The float32 at addr in every lane (vbroadcastss from memory)."""
    fp = ir.FloatType().as_pointer()
    return _simple(F32(types.int64), lambda b, a: _splat(b, b.load(b.inttoptr(a[0], fp), align=4), _VF))(typingctx,
                                                                                                           addr)


@intrinsic
def ld_f32(typingctx, addr):
    return _simple(F32(types.int64), lambda b, a: b.load(_at(b, a[0], _VF), align=4))(typingctx, addr)


def _store(b, a):
    b.store(a[1], _at(b, a[0], a[1].type), align=4)
    return ir.Constant(ir.IntType(8), 0)


@intrinsic
def st_f32(typingctx, addr, v):
    """Store all 16 lanes at addr."""
    return _simple(types.uint8(types.int64, F32), _store)(typingctx, addr, v)


@intrinsic
def st_i32(typingctx, addr, v):
    """Store all 16 i32 lanes at addr."""
    return _simple(types.uint8(types.int64, I32), _store)(typingctx, addr, v)


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


def _ld_bytes(signed: bool):
    @intrinsic
    def ld(typingctx, addr):
        def body(b, a):
            vb = ir.VectorType(ir.IntType(8), 16)
            v = b.load(_at(b, a[0], vb), align=1)
            return b.sext(v, _VI) if signed else b.zext(v, _VI)

        return _simple(I32(types.int64), body)(typingctx, addr)

    return ld


ld_u8 = _ld_bytes(False)
"""16 bytes at addr, zero-extended to the 16 i32 lanes."""
ld_s8 = _ld_bytes(True)
"""16 bytes at addr, sign-extended to the 16 i32 lanes."""


@intrinsic
def mul_i(typingctx, x, y):
    return _simple(I32(I32, I32), lambda b, a: b.mul(a[0], a[1]))(typingctx, x, y)


@intrinsic
def mul_w(typingctx, x, y):
    """Lane-wise products of the 16-bit halves of each 32-bit lane (vpmullw: one µop where vpmulld takes two);
    equals mul_i where each half's product fits 16 bits and y's lanes hold the multiplier in both halves."""
    def body(b, a):
        w = ir.VectorType(ir.IntType(16), 32)
        return b.bitcast(b.mul(b.bitcast(a[0], w), b.bitcast(a[1], w)), _VI)

    return _simple(I32(I32, I32), body)(typingctx, x, y)


@intrinsic
def sra_w(typingctx, v, n):
    """Each 16-bit half of each lane shifted right by the constant n, its sign kept (vpsraw)."""
    if not isinstance(n, types.IntegerLiteral):
        return None

    def body(b, a):
        w = ir.VectorType(ir.IntType(16), 32)
        return b.bitcast(b.ashr(b.bitcast(a[0], w), ir.Constant(w, [n.literal_value] * 32)), _VI)

    return _simple(I32(I32, n), body)(typingctx, v, n)


@intrinsic
def bits_i(typingctx, v, shift, mask, up):
    """((v >> shift) & mask) << up, lane-wise (shift, up: integers; mask: a 32-bit pattern)."""
    if not all(isinstance(t, types.Integer) for t in (shift, mask, up)):
        return None

    def body(b, a):
        def lanes(x):
            x = b.trunc(x, _i32) if x.type.width > 32 else (b.zext(x, _i32) if x.type.width < 32 else x)
            return _splat(b, x, _VI)

        return b.shl(b.and_(b.lshr(a[0], lanes(a[1])), lanes(a[2])), lanes(a[3]))

    return _simple(I32(I32, shift, mask, up), body)(typingctx, v, shift, mask, up)


@intrinsic
def or_i(typingctx, x, y):
    return _simple(I32(I32, I32), lambda b, a: b.or_(a[0], a[1]))(typingctx, x, y)


@intrinsic
def xor80(typingctx, v):
    """Every byte XOR 0x80 (u8 q + 128 ↔ s8 q)."""
    return _simple(I32(I32), lambda b, a: b.xor(a[0], ir.Constant(_VI, [0x80808080 - (1 << 32)] * 16)))(typingctx, v)


@intrinsic
def neg_i(typingctx, v):
    return _simple(I32(I32), lambda b, a: b.neg(a[0]))(typingctx, v)


@intrinsic
def e8m0_f(typingctx, v):
    """MXFP4's block scale: the e8m0 exponent byte e in each lane → 2^(e − 128) as f32 (ggml's
    e8m0_to_fp32_half: subnormal for e < 2)."""

    def body(b, a):
        e = a[0]
        small = b.shl(ir.Constant(_VI, [0x00200000] * 16), e)
        big = b.shl(b.sub(e, ir.Constant(_VI, [1] * 16)), ir.Constant(_VI, [23] * 16))
        bits = b.select(b.icmp_unsigned("<", e, ir.Constant(_VI, [2] * 16)), small, big)
        return b.bitcast(bits, _VF)

    return _simple(F32(I32), body)(typingctx, v)


@intrinsic
def neg_bytes(typingctx, x, word, shift):
    """x with byte i of each lane negated where bit 8i + shift of that lane's `word` is set (the IQ types'
    signs, applied to the activations: the weights' magnitudes stay unsigned for the u8 × s8 dots)."""
    if not isinstance(shift, types.Integer):
        return None

    def body(b, a):
        b8 = ir.VectorType(ir.IntType(8), 64)
        sh = a[2]
        sh = b.trunc(sh, _i32) if sh.type.width > 32 else (b.zext(sh, _i32) if sh.type.width < 32 else sh)
        t = b.and_(b.lshr(a[1], _splat(b, sh, _VI)), ir.Constant(_VI, [0x01010101] * 16))
        m = b.sext(b.icmp_unsigned("!=", b.bitcast(t, b8), ir.Constant(b8, [0] * 64)), b8)
        xb = b.bitcast(a[0], b8)
        return b.bitcast(b.sub(b.xor(xb, m), m), _VI)

    return _simple(I32(I32, I32, shift), body)(typingctx, x, word, shift)


def _ld_u16_ir(b, addr):
    vh = ir.VectorType(ir.IntType(16), 16)
    return b.zext(b.load(_at(b, addr, vh), align=1), _VI)


@intrinsic
def ld_u16(typingctx, addr):
    """16 u16 at addr, zero-extended to the 16 i32 lanes."""
    return _simple(I32(types.int64), lambda b, a: _ld_u16_ir(b, a[0]))(typingctx, addr)



@intrinsic
def prefetch(typingctx, addr):
    """Bring the cache line at addr into L1 ahead of its load (prefetcht0): a hint that never faults and changes
    no value, so it cannot change a result."""

    def body(b, a):
        p8 = ir.IntType(8).as_pointer()
        fn = cgutils.get_or_insert_function(b.module, ir.FunctionType(ir.VoidType(), [p8, _i32, _i32, _i32]),
                                            "llvm.prefetch.p0")
        b.call(fn, [b.inttoptr(a[0], p8), ir.Constant(_i32, 0), ir.Constant(_i32, 3), ir.Constant(_i32, 1)])
        return ir.Constant(ir.IntType(8), 0)

    return _simple(types.uint8(types.int64), body)(typingctx, addr)
