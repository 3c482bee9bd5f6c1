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


def _dpbusd_ir(b, acc, u, s):
    """Portable form: acc + sum over the 4 bytes of each lane of zext(u) * sext(s)."""
    b8 = ir.VectorType(ir.IntType(8), 64)
    w = ir.VectorType(_i32, 64)
    return _sum4(b, acc, b.mul(b.zext(b.bitcast(u, b8), w), b.sext(b.bitcast(s, b8), w)))


def _sum4(b, acc, p):
    """acc + the sums of each four consecutive lanes of the <64 x i32> products p."""
    out = acc
    undef = ir.Constant(p.type, None)
    for i in range(4):
        out = b.add(out, b.shuffle_vector(p, undef, ir.Constant(_VI, [4 * j + i for j in range(16)])))
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


# ---------------------------------------------------------------------------------------------------------
# integer dot products by ISA: VNNI's vpdpbusd sums four u8 x s8 products into each 32-bit lane without
# intermediate saturation; AVX2 has vpmaddubsw (pairs into saturating i16) then vpmaddwd (pairs into i32), exact
# while a pair's sum stays within i16, which the callers guarantee by the weights' range (u <= 127 for dot4).
AVX2 = "+avx2" in _host_features() and os.environ.get("GUILD_NO_AVX2", "") in ("", "0")
_b8x32 = ir.VectorType(ir.IntType(8), 32)
_i16x16 = ir.VectorType(ir.IntType(16), 16)
_i32x8 = ir.VectorType(_i32, 8)


def _halves(b, v):
    """<16 x i32> → its two 256-bit halves as <32 x i8>."""
    v8 = b.bitcast(v, ir.VectorType(ir.IntType(8), 64))
    undef = ir.Constant(v8.type, None)
    return [b.shuffle_vector(v8, undef, ir.Constant(ir.VectorType(_i32, 32), list(range(32 * h, 32 * h + 32))))
            for h in (0, 1)]


def _join(b, lo, hi):
    """Two <8 x i32> → <16 x i32>."""
    return b.shuffle_vector(lo, hi, ir.Constant(_VI, list(range(16))))


def _maddubs(b, u, s):
    fn = cgutils.get_or_insert_function(b.module, ir.FunctionType(_i16x16, [_b8x32, _b8x32]),
                                        "llvm.x86.avx2.pmadd.ub.sw")
    return b.call(fn, [u, s])


def _madd(b, p, q):
    fn = cgutils.get_or_insert_function(b.module, ir.FunctionType(_i32x8, [_i16x16, _i16x16]),
                                        "llvm.x86.avx2.pmadd.wd")
    return b.call(fn, [p, q])


def _madd_ones(b, p):
    return _madd(b, p, ir.Constant(_i16x16, [1] * 16))


def _abs8(b, v):
    fn = cgutils.get_or_insert_function(b.module, ir.FunctionType(_b8x32, [_b8x32, ir.IntType(1)]), "llvm.abs.v32i8")
    return b.call(fn, [v, ir.Constant(ir.IntType(1), 0)])


def _sign8(b, v, s):
    fn = cgutils.get_or_insert_function(b.module, ir.FunctionType(_b8x32, [_b8x32, _b8x32]), "llvm.x86.avx2.psign.b")
    return b.call(fn, [v, s])


def _dot_avx2(b, acc, pairs):
    """acc + Σ over (u, s) pairs of the 4-byte dot products per lane, the pairs' i16 partial sums added before
    the widening (exact while each i16 sum fits: the callers' contract)."""
    return b.add(acc, _join(b, *(_madd_ones(b, _i16_sums(b, pairs, h)) for h in (0, 1))))


def _i16_sums(b, pairs, h):
    """Half h (256 bits) of Σ over the (u, s) pairs of vpmaddubsw(u, s): i16 sums of byte-pair products."""
    p = None
    for u, s in pairs:
        m = _maddubs(b, _halves(b, u)[h], _halves(b, s)[h])
        p = m if p is None else b.add(p, m)
    return p


def _dot_portable(b, acc, pairs):
    for u, s in pairs:
        acc = _dpbusd_ir(b, acc, u, s)
    return acc


def _vnni(b, acc, u, s):
    fn = cgutils.get_or_insert_function(b.module, ir.FunctionType(_VI, [_VI] * 3), "llvm.x86.avx512.vpdpbusd.512")
    return b.call(fn, [acc, u, s])


def _dot_isa(b, acc, pairs):
    if VNNI512:
        for u, s in pairs:
            acc = _vnni(b, acc, u, s)
        return acc
    return _dot_avx2(b, acc, pairs) if AVX2 else _dot_portable(b, acc, pairs)


@intrinsic
def dot4(typingctx, acc, u, s):
    """acc + Σ_{4 bytes of each lane} u8(u) · s8(s) for u <= 127 (exact on every ISA)."""
    return _simple(I32(I32, I32, I32), lambda b, a: _dot_isa(b, a[0], [(a[1], a[2])]))(typingctx, acc, u, s)


@intrinsic
def dot8(typingctx, acc, u1, s1, u2, s2):
    """dot4(dot4(acc, u1, s1), u2, s2) for u <= 63 (two products per pair, summed in i16 on AVX2: exact)."""
    return _simple(I32(I32, I32, I32, I32, I32), lambda b, a: _dot_isa(b, a[0], [(a[1], a[2]), (a[3], a[4])]))(
        typingctx, acc, u1, s1, u2, s2)


@intrinsic
def dot32s(typingctx, acc, sc, u1, s1, u2, s2, u3, s3, u4, s4, u5, s5, u6, s6, u7, s7, u8, s8):
    """acc + sc · Σ over the eight (u, s) pairs of dot4(u, s), for u <= 15 and 0 <= sc < 2^15 (a block of 32
    4-bit quants with its scale). AVX2: the eight pairs' i16 sums (<= 8 · 2 · 15 · 127) widened by vpmaddwd
    against (sc, sc), the scale's multiply folded into the widening (as ggml's Q4_K dot); exact everywhere."""

    def body(b, a):
        acc, sc, pairs = a[0], a[1], [(a[i], a[i + 1]) for i in range(2, 18, 2)]
        if VNNI512 or not AVX2:
            return b.add(acc, b.mul(sc, _dot_isa(b, _splat(b, ir.Constant(_i32, 0), _VI), pairs)))
        sc2 = b.bitcast(b.or_(sc, b.shl(sc, _splat(b, ir.Constant(_i32, 16), _VI))), ir.VectorType(ir.IntType(16), 32))
        halves = []
        for h in (0, 1):
            sch = b.shuffle_vector(sc2, ir.Constant(sc2.type, None),
                                   ir.Constant(ir.VectorType(_i32, 16), list(range(16 * h, 16 * h + 16))))
            halves.append(_madd(b, _i16_sums(b, pairs, h), sch))
        return b.add(acc, _join(b, *halves))

    return _simple(I32(*[I32] * 18), body)(typingctx, acc, sc, u1, s1, u2, s2, u3, s3, u4, s4, u5, s5, u6, s6, u7,
                                           s7, u8, s8)


@intrinsic
def dot4ss(typingctx, acc, w, s):
    """acc + Σ_{4 bytes of each lane} s8(w) · s8(s), for s != -128 (AVX2: |w| · sign(s, w), products <= 128·127
    per byte, exact in the i16 pairs; elsewhere sign-extended products)."""

    def body(b, a):
        acc, w, s = a
        if AVX2 and not VNNI512:
            halves = []
            for h in (0, 1):
                wh, sh = _halves(b, w)[h], _halves(b, s)[h]
                halves.append(_madd_ones(b, _maddubs(b, _abs8(b, wh), _sign8(b, sh, wh))))
            return b.add(acc, _join(b, *halves))
        b8 = ir.VectorType(ir.IntType(8), 64)
        wv = ir.VectorType(_i32, 64)
        return _sum4(b, acc, b.mul(b.sext(b.bitcast(w, b8), wv), b.sext(b.bitcast(s, b8), wv)))

    return _simple(I32(I32, I32, I32), body)(typingctx, acc, w, s)


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
def inline_here(typingctx):
    """Marks the calling function `alwaysinline` for LLVM: helpers stay separate Numba functions (Numba's own
    inliner copies their IR at every call site and made the kernels compile ten times slower) yet are inlined
    into the kernel, where their vectors stay in registers."""

    def body(b, a):
        b.function.attributes.add("alwaysinline")
        return ir.Constant(ir.IntType(8), 0)

    return _simple(types.uint8(), body)(typingctx)


# ---------------------------------------------------------------------------------------------------------
# 16-entry byte tables (IQ4_NL's non-linear levels, MXFP4's e2m1 values): vpshufb looks up every byte of a
# vector of nibbles in one instruction; the table is repeated in each 128-bit lane, as vpshufb indexes per lane.
AVX512BW = "+avx512bw" in _host_features() and os.environ.get("GUILD_NO_VNNI", "") in ("", "0")


def _lookup_ir(b, v, table, portable):
    """Every byte of v (values 0..15) replaced by table[v]."""
    if (AVX512BW or AVX2) and not portable:
        width = 64 if AVX512BW else 32
        vt = ir.VectorType(ir.IntType(8), width)
        name = "llvm.x86.avx512.pshuf.b.512" if AVX512BW else "llvm.x86.avx2.pshuf.b"
        fn = cgutils.get_or_insert_function(b.module, ir.FunctionType(vt, [vt, vt]), name)
        tab = ir.Constant(vt, [int(x) & 0xFF for x in table] * (width // 16))
        parts = [b.bitcast(v, vt)] if AVX512BW else _halves(b, v)
        out = [b.call(fn, [tab, p]) for p in parts]
        if AVX512BW:
            return b.bitcast(out[0], _VI)
        return _join(b, b.bitcast(out[0], _i32x8), b.bitcast(out[1], _i32x8))
    b8 = ir.VectorType(ir.IntType(8), 64)
    src = b.bitcast(v, b8)
    arr = ir.Constant(ir.ArrayType(ir.IntType(8), 16), [int(x) & 0xFF for x in table])
    gv = cgutils.global_constant(b, "guild_lut", arr)
    out = ir.Constant(b8, None)
    for i in range(64):  # portable: one extract, one table read, one insert per byte
        idx = b.zext(b.extract_element(src, ir.Constant(_i32, i)), ir.IntType(64))
        val = b.load(b.gep(gv, [ir.Constant(ir.IntType(64), 0), idx]))
        out = b.insert_element(out, val, ir.Constant(_i32, i))
    return b.bitcast(out, _VI)


def lookup16(table, portable=False):
    """An intrinsic mapping every byte (a nibble value) of an i32 vector to table[byte] (vpshufb where the host
    has it; `portable`: element by element everywhere, for tests)."""
    table = tuple(int(x) for x in table)
    assert len(table) == 16

    @intrinsic
    def lut(typingctx, v):
        return _simple(I32(I32), lambda b, a: _lookup_ir(b, a[0], table, portable))(typingctx, v)

    return lut


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
def gather_u32(typingctx, base, idx, scale, off):
    """Lane i: the u32 at base + scale · idx[i] + off (16 scalar loads: grid tables of the IQ types, read by
    index; AVX2's vpgatherdd is no faster on the hosts measured and needs an aligned table)."""
    if not all(isinstance(t, types.Integer) for t in (base, scale, off)):
        return None

    def body(b, a):
        i64 = ir.IntType(64)

        def wide(x):
            return b.sext(x, i64) if x.type.width < 64 else x

        base_, idx_, scale_, off_ = wide(a[0]), a[1], wide(a[2]), wide(a[3])
        out = ir.Constant(_VI, None)
        for i in range(16):
            k = b.zext(b.extract_element(idx_, ir.Constant(_i32, i)), i64)
            addr = b.add(b.add(base_, b.mul(k, scale_)), off_)
            out = b.insert_element(out, b.load(b.inttoptr(addr, _i32.as_pointer()), align=1), ir.Constant(_i32, i))
        return out

    return _simple(I32(base, I32, scale, off), body)(typingctx, base, idx, scale, off)


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


# ---------------------------------------------------------------------------------------------------------
# one row's 32-element block with its elements in lanes (the grid types at T = 1): a row's grid entries cover
# adjacent elements, so each entry loads once into place, where 16 features in lanes gather lane by lane
_SIGN_BITS = ir.Constant(_b8x32, [1 << (e // 4) for e in range(32)])  # element e's sign: bit 8(e % 4) + e // 4


def _splat_n(b, val, vt):
    v = b.insert_element(ir.Constant(vt, None), val, ir.Constant(_i32, 0))
    return b.shuffle_vector(v, ir.Constant(vt, None), ir.Constant(ir.VectorType(_i32, vt.count), [0] * vt.count))


def _grid_row(b, base, ia, sa, ca, xa, ent, avx2):
    """<8 x i32> summing to sc · Σ_e |g_e| · (±x̂_e) over one row's block (see grid_rows2)."""
    i64, i8 = ir.IntType(64), ir.IntType(8)
    et = ir.IntType(8 * ent)
    v = ir.Constant(ir.VectorType(et, 32 // ent), None)
    for q in range(32 // ent):  # entry q's index: this row's byte of the packed field's lane row q (stride 16)
        k = b.zext(b.load(b.inttoptr(b.add(ia, ir.Constant(i64, 16 * q)), i8.as_pointer()), align=1), i64)
        e = b.load(b.inttoptr(b.add(base, b.mul(k, ir.Constant(i64, ent))), et.as_pointer()), align=1)
        v = b.insert_element(v, e, ir.Constant(_i32, q))
    mags = b.bitcast(v, _b8x32)
    sw = b.load(b.inttoptr(sa, _i32.as_pointer()), align=1)
    bc = b.bitcast(_splat_n(b, sw, _i32x8), _b8x32)  # byte e holds byte e % 4 of the sign word
    m = b.sext(b.icmp_unsigned("==", b.and_(bc, _SIGN_BITS), _SIGN_BITS), _b8x32)
    xs = b.sub(b.xor(b.load(b.inttoptr(xa, _b8x32.as_pointer()), align=1), m), m)
    sc = b.zext(b.load(b.inttoptr(ca, i8.as_pointer()), align=1), ir.IntType(16))
    if avx2:  # magnitudes <= 62: the pairs' i16 sums are exact; the scale multiplies in the widening
        return _madd(b, _maddubs(b, mags, xs), _splat_n(b, sc, _i16x16))
    w32 = ir.VectorType(_i32, 32)
    p = b.mul(b.zext(mags, w32), b.sext(xs, w32))
    for n in (16, 8):
        p = b.add(*[b.shuffle_vector(p, p, ir.Constant(ir.VectorType(_i32, n), list(range(h * n, h * n + n))))
                    for h in (0, 1)])
    return b.mul(p, _splat_n(b, b.zext(sc, _i32), _i32x8))


def _grid_rows(avx2: bool):
    @intrinsic
    def grid_rows(typingctx, base, ia, sa, ca, xa, ent):
        if not isinstance(ent, types.IntegerLiteral):
            return None
        n = ent.literal_value
        i64 = ir.IntType(64)

        def body(b, a):
            # the index address as one opaque base: loop strength reduction would otherwise keep a pointer per
            # entry and row (16 for IQ3_XXS) and spill them
            ia = b.asm(ir.FunctionType(i64, [i64]), "", "=r,0", [a[1]], False, "opaque")
            r0 = _grid_row(b, a[0], ia, a[2], a[3], a[4], n, avx2)
            one = ir.Constant(i64, 1)
            r1 = _grid_row(b, a[0], b.add(ia, one), b.add(a[2], ir.Constant(i64, 4)), b.add(a[3], one), a[4], n,
                           avx2)
            return _join(b, r0, r1)

        return _simple(I32(*[types.int64] * 5, ent), body)(typingctx, base, ia, sa, ca, xa, ent)

    return grid_rows


grid_rows2 = _grid_rows(AVX2)
"""grid_rows2(base, ia, sa, ca, xa, ent): rows r and r + 1 of a grid type's block, elements in lanes; lanes 0..7
sum to row r's sc · Σ |g|·(±x̂), lanes 8..15 to row r + 1's (hsum2 takes the two sums). base: the grid table;
ia: row r's first index byte (entry q's at ia + 16 q); sa: its sign word (bit 8i + q: element 4q + i); ca: its
scale byte; row r + 1's at ia + 1, sa + 4, ca + 1; xa: the block's 32 activation bytes; ent: bytes per entry
(8: IQ2_XXS, 4: IQ3_XXS). vpmaddubsw + vpmaddwd on AVX2, exact portable IR elsewhere."""
grid_rows2_portable = _grid_rows(False)  # the portable form everywhere (tests)


@intrinsic
def hsum2(typingctx, v, addr):
    """Store the sum of lanes 0..7 at addr and of lanes 8..15 at addr + 4 (i32)."""

    def body(b, a):
        fn = cgutils.get_or_insert_function(b.module, ir.FunctionType(_i32, [_i32x8]), "llvm.vector.reduce.add.v8i32")
        for h in (0, 1):
            half = b.shuffle_vector(a[0], a[0], ir.Constant(_i32x8, list(range(8 * h, 8 * h + 8))))
            b.store(b.call(fn, [half]), b.inttoptr(b.add(a[1], ir.Constant(ir.IntType(64), 4 * h)), _i32.as_pointer()),
                    align=4)
        return ir.Constant(ir.IntType(8), 0)

    return _simple(types.uint8(I32, types.int64), body)(typingctx, v, addr)
