"""Table reads from 16-lane vectors: 16-entry byte tables looked up with vpshufb, grid entries gathered by index,
and one row's grid block with its elements in lanes (the IQ types)."""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from .dots import _halves, _join, _madd, _maddubs
from .isa import _VI, AVX2, AVX512BW, I32, _b8x32, _i16x16, _i32, _i32x8, _simple

# ---------------------------------------------------------------------------------------------------------
# 16-entry byte tables (IQ4_NL's non-linear levels, MXFP4's e2m1 values): vpshufb looks up every byte of a
# vector of nibbles in one instruction; the table is repeated in each 128-bit lane, as vpshufb indexes per lane.


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
