"""Integer dot products of 16-lane vectors by ISA: four u8 x s8 products summed into each 32-bit lane (VNNI's
vpdpbusd; AVX2's vpmaddubsw + vpmaddwd within i16 ranges the callers guarantee; exact portable IR elsewhere)."""

from __future__ import annotations

from llvmlite import ir
from numba.core import cgutils
from numba.extending import intrinsic

from .isa import _VI, AVX2, I32, VNNI512, _b8x32, _i16x16, _i32, _i32x8, _simple, _splat


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


# ---------------------------------------------------------------------------------------------------------
# integer dot products by ISA: VNNI's vpdpbusd sums four u8 x s8 products into each 32-bit lane without
# intermediate saturation; AVX2 has vpmaddubsw (pairs into saturating i16) then vpmaddwd (pairs into i32), exact
# while a pair's sum stays within i16, which the callers guarantee by the weights' range (u <= 127 for dot4).


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


def _dot32s_ir(b, acc, sc, pairs, paired=False):
    """acc + sc · Σ over the eight (u, s) pairs of dot4(u, s), for u <= 15 and 0 <= sc < 2^15 (a block of 32
    4-bit quants with its scale; `paired`: sc given in both i16 halves): dot_nib's on a host without VNNI,
    dot32u's everywhere. AVX2: the eight pairs' i16 sums (<= 8 · 2 · 15 · 127) widened by vpmaddwd against (sc,
    sc), the scale's multiply folded into the widening (as ggml's Q4_K dot); VNNI's products or portable IR
    elsewhere; exact everywhere."""
    if VNNI512 or not AVX2:
        if paired:
            sc = b.and_(sc, _splat(b, ir.Constant(_i32, 0xFFFF), _VI))
        return b.add(acc, b.mul(sc, _dot_isa(b, _splat(b, ir.Constant(_i32, 0), _VI), pairs)))
    sc2 = sc if paired else b.or_(sc, b.shl(sc, _splat(b, ir.Constant(_i32, 16), _VI)))
    sc2 = b.bitcast(sc2, ir.VectorType(ir.IntType(16), 32))
    halves = []
    for h in (0, 1):
        sch = b.shuffle_vector(sc2, ir.Constant(sc2.type, None),
                               ir.Constant(ir.VectorType(_i32, 16), list(range(16 * h, 16 * h + 16))))
        halves.append(_madd(b, _i16_sums(b, pairs, h), sch))
    return b.add(acc, _join(b, *halves))


@intrinsic
def dot_nib(typingctx, acc, sc, w0, w1, w2, w3, x0, x1, x2, x3, x4, x5, x6, x7):
    """acc + sc · Σ lo4(w_i)·x_i + hi4(w_i)·x_(4+i) (_dot32s_ir's pairs): a block of 32 nibbles (w0..w3: 8 a
    lane each, low nibbles with x0..x3, high with x4..x7) times its scale sc. VNNI: the high nibbles are taken in
    place (w & 0xF0, 16 times the nibble, still a u8) and the sum shifted back once (exact: a multiple of 16), so
    a block costs one shift instead of four, in two product chains of four instead of one of eight."""

    def body(b, a):
        acc, sc, ws, xs = a[0], a[1], a[2:6], a[6:14]
        lo_m, hi_m = (ir.Constant(_VI, [m] * 16) for m in (0x0F0F0F0F, 0xF0F0F0F0))
        if not VNNI512:
            pairs = []
            for i, w in enumerate(ws):
                pairs += [(b.and_(w, lo_m), xs[i]), (b.and_(b.lshr(w, ir.Constant(_VI, [4] * 16)), lo_m), xs[4 + i])]
            return _dot32s_ir(b, acc, sc, pairs)
        zero = _splat(b, ir.Constant(_i32, 0), _VI)
        lo = hi = zero
        for i, w in enumerate(ws):
            lo = _vnni(b, lo, b.and_(w, lo_m), xs[i])
            hi = _vnni(b, hi, b.and_(w, hi_m), xs[4 + i])
        dot = b.add(lo, b.ashr(hi, ir.Constant(_VI, [4] * 16)))
        return b.add(acc, b.mul(sc, dot))

    return _simple(I32(*[I32] * 14), body)(typingctx, acc, sc, w0, w1, w2, w3, x0, x1, x2, x3, x4, x5, x6, x7)


@intrinsic
def dot32u(typingctx, acc, sc, u0, u1, u2, u3, u4, u5, u6, u7, x0, x1, x2, x3, x4, x5, x6, x7):
    """acc + sc · Σ u_i · x_i (dot4 per pair) for u <= 15 and 0 <= sc < 2^15 given in both i16 halves of each lane
    (sc · 65537): dot_nib's integer with the nibbles already apart (a block expanded once for many rows); on AVX2
    its i16 sums widened against the scale pairs."""

    def body(b, a):
        return _dot32s_ir(b, a[0], a[1], list(zip(a[2:10], a[10:18], strict=True)), paired=True)

    return _simple(I32(*[I32] * 18), body)(typingctx, acc, sc, u0, u1, u2, u3, u4, u5, u6, u7, x0, x1, x2, x3, x4,
                                           x5, x6, x7)


def _h16(b, v, h):
    """Half h (256 bits) of a 16-lane vector as <16 x i16>."""
    return b.bitcast(b.shuffle_vector(v, ir.Constant(_VI, None), ir.Constant(_i32x8, list(range(8 * h, 8 * h + 8)))),
                     _i16x16)


def _madd_w_ir(b, x, y):
    """vpmaddwd: each lane's two i16 products x_lo·y_lo + x_hi·y_hi (AVX-512, AVX2 by halves, portable IR)."""
    if VNNI512:
        w = ir.VectorType(ir.IntType(16), 32)
        fn = cgutils.get_or_insert_function(b.module, ir.FunctionType(_VI, [w, w]), "llvm.x86.avx512.pmaddw.d.512")
        return b.call(fn, [b.bitcast(x, w), b.bitcast(y, w)])
    if AVX2:
        return _join(b, *(_madd(b, _h16(b, x, h), _h16(b, y, h)) for h in (0, 1)))
    sixteen = _splat(b, ir.Constant(_i32, 16), _VI)
    lo = [b.ashr(b.shl(v, sixteen), sixteen) for v in (x, y)]
    hi = [b.ashr(v, sixteen) for v in (x, y)]
    return b.add(b.mul(*lo), b.mul(*hi))


@intrinsic
def madd_w(typingctx, x, y):
    """Each lane's two signed 16-bit halves times y's, summed: x_lo·y_lo + x_hi·y_hi (vpmaddwd)."""
    return _simple(I32(I32, I32), lambda b, a: _madd_w_ir(b, *a))(typingctx, x, y)


@intrinsic
def madd16(typingctx, x, y):
    """x · y lane-wise where x's lanes are 0..32767 and y's lie in i16: vpmaddwd where the host has it (on
    AVX-512 one µop where vpmulld takes two; exact: the high halves' product is 0 · y_hi), else vpmulld."""

    def body(b, a):
        return _madd_w_ir(b, *a) if VNNI512 or AVX2 else b.mul(a[0], a[1])

    return _simple(I32(I32, I32), body)(typingctx, x, y)


def _dot32h(run: int):
    def dot32h(typingctx, acc, sa, sb, u0, u1, u2, u3, u4, u5, u6, u7, x0, x1, x2, x3, x4, x5, x6, x7):
        def body(b, a):
            acc, sa, sb, pairs = a[0], a[1], a[2], list(zip(a[3:11], a[11:19], strict=True))
            if VNNI512 or not AVX2:
                zero = _splat(b, ir.Constant(_i32, 0), _VI)
                sixteen = _splat(b, ir.Constant(_i32, 16), _VI)
                A, B = _dot_isa(b, zero, pairs[:4]), _dot_isa(b, zero, pairs[4:])
                return b.add(acc, b.add(b.mul(b.ashr(sa, sixteen), A), b.mul(b.ashr(sb, sixteen), B)))
            halves = []
            for h in (0, 1):
                p = None
                for k in range(0, 8, run):
                    m = _madd(b, _i16_sums(b, pairs[k:k + run], h), _h16(b, sa if k < 4 else sb, h))
                    p = m if p is None else b.add(p, m)
                halves.append(p)
            return b.add(acc, _join(b, *halves))

        return _simple(I32(*[I32] * 19), body)(typingctx, acc, sa, sb, u0, u1, u2, u3, u4, u5, u6, u7, x0, x1, x2,
                                               x3, x4, x5, x6, x7)

    return intrinsic(dot32h)


dot32h = _dot32h(2)
"""acc + sa · Σ_{i<4} dot4(u_i, x_i) + sb · Σ_{i>=4} dot4(u_i, x_i) for u <= 63, the scales signed 16-bit values in
both halves of each lane (a block's two halves with their scales, expanded once for many rows; on AVX2 the i16
sums of two pairs widened against the scale pairs)."""
dot32h4 = _dot32h(4)
"""dot32h for u <= 31: on AVX2 the i16 sums of each half's four pairs (<= 8 · 31 · 127) widened at once."""


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

