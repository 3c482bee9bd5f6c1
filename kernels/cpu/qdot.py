"""The int8-activation path ("i8" numerics): llama.cpp-style GEMV with integer dot products.

Each row of activations is quantised in blocks of 32 (Q8_0's rule: d = max|x| / 127, q = rint(x / d) computed as
x * (1 / d) in float32), and every weight block is dotted with it in 32-bit integers (`simd.dpbusd`: vpdpbusd on
AVX-512 VNNI, four u8 × s8 products per lane, 64 per instruction); the block's integer sum is then scaled in
float32. One decoded weight group serves every row of the window at the integer multiply rate, which is what
makes the extra rows of a verification window cheap (issue 21; seed 001 "window cost").

Layout ("quad tiles"). Features in tiles of NT = 64 like the f32 path, but the four bytes of consecutive k of one
feature are adjacent, `qs[tile, block, quad, feature, 4]`, so one 64-byte load holds 16 features × 4 k: the
operand shape of vpdpbusd. Q4_0/Q4_1 bytes keep their nibble pairing (low nibble → element j, high → j + 16);
Q8_0 bytes are stored as q + 128 (vpdpbusd multiplies an unsigned byte by a signed one), undone in the sum with
the activation block's own Σx̂; a packed matrix holds exactly the GGUF bytes.

Arithmetic per output feature n of row t, block b (x̂ = the row's quantised block, dx its scale, s = Σ x̂):
  Q4_0: y = fma(float(Σ q·x̂ − 8 s), d·dx, y)
  Q4_1: y = fma(float(Σ q·x̂), d·dx, y); y = fma(m, dx·s, y)
  Q8_0: y = fma(float(Σ (q+128)·x̂ − 128 s), d·dx, y)
The integer sums are exact; the float chain over b is fixed per (row, feature), the same whichever path (one row
× 64 features, two rows × 64 features) computes it and however many rows or threads there are: row
invariance holds for any T. Twin: kernels/ref.py `quantize_act_q8`, `matmul_q8act`.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as Q
from numba import carray, njit

from .drivers import NT
from .intrinsics import _pf32, _pi32, h2f, i2f
from .simd import (
    abs_f,
    add_i,
    bc_i32,
    cvt,
    dpbusd,
    fma_f,
    hi4,
    hmax_f,
    hsum_i,
    lane,
    ld_f32,
    ld_h2f,
    ld_i32,
    lo4,
    max_f,
    mul_f,
    rint_i,
    splat_f,
    splat_i,
    st_f32,
    st_i8,
    sub_i,
    zero_f,
    zero_i,
)

QB = 32  # activation block (elements)
Q4_0, Q4_1, Q8_0 = 0, 1, 2  # kernel kinds


# ---------------------------------------------------------------------------------------------------------
# the table: which types have an int8 kernel, and their packed fields (name, dtype, per-block dims)
I8_TYPES = {
    int(Q.Q4_0): (Q4_0, (("qs", np.uint8, (4,)), ("d", np.uint16, ()))),
    int(Q.Q4_1): (Q4_1, (("qs", np.uint8, (4,)), ("d", np.uint16, ()), ("m", np.uint16, ()))),
    int(Q.Q8_0): (Q8_0, (("qs", np.uint8, (8,)), ("d", np.uint16, ()))),
}


def layout(qtype: int, n_rows: int, n_cols: int) -> tuple:
    """(dtype, shape) of each packed array; quad fields are [tiles, blocks, quads, NT, 4]."""
    nt, nb = -(-int(n_rows) // NT), -(-int(n_cols) // QB)
    out = []
    for _, dt, dims in I8_TYPES[int(qtype)][1]:
        shape = (nt, nb, dims[0], NT, 4) if dims else (nt, nb, NT)
        out.append((np.dtype(dt), shape))
    return tuple(out)


def pack(qtype: int, blk: np.ndarray, n_rows: int) -> tuple:
    """Packed arrays from the raw blocks [N, nb, block bytes] of a Q4_0 / Q4_1 / Q8_0 matrix, written tile by
    tile (no whole-matrix temporaries: the loader's peak memory stays near the file's size)."""
    q = int(qtype)
    N, nb = blk.shape[:2]
    qs_at = {int(Q.Q8_0): 2, int(Q.Q4_1): 4, int(Q.Q4_0): 2}[q]
    nq = 8 if q == int(Q.Q8_0) else 4
    nt = -(-N // NT)
    qs = np.zeros((nt, nb, nq, NT, 4), np.uint8)
    scales = [np.zeros((nt, nb, NT), np.uint16) for _ in range(2 if q == int(Q.Q4_1) else 1)]
    for g in range(nt):
        n0, n1 = g * NT, min(g * NT + NT, N)
        b = blk[n0:n1]  # [rows, nb, bytes]
        qs[g, :, :, : n1 - n0] = b[..., qs_at : qs_at + 4 * nq].reshape(n1 - n0, nb, nq, 4).transpose(1, 2, 0, 3)
        for i, sc in enumerate(scales):  # d at byte 0, Q4_1's m at byte 2
            sc[g, :, : n1 - n0] = np.ascontiguousarray(b[..., 2 * i : 2 * i + 2]).view(np.uint16)[..., 0].T
    if q == int(Q.Q8_0):
        qs ^= np.uint8(0x80)  # q + 128 as u8 (the padding rows' zeros become 128 with d = 0: no contribution)
    return (qs, *scales)


# ---------------------------------------------------------------------------------------------------------
# activations: [T, K] float32 → one buffer holding q [T, Kp] i8, scale [T, nb] f32, Σq [T, nb] i32 and
# scale·Σq [T, nb] f32 (Kp = nb · 32, zero padded)
def act_bytes(T: int, n_cols: int) -> int:
    nb = -(-n_cols // QB)
    return T * (nb * QB + 12 * nb)


@njit(cache=True)
def quantize_acts(x, buf):
    """Quantise the rows of x [T, K] into buf (layout above); the twin is ref.quantize_act_q8. Whole blocks of
    32 in two 16-lane vectors where the row is stride-1 and K a multiple of 32, else element by element."""
    T, K = x.shape
    nb = -(-K // QB)
    Kp = nb * QB
    xq = buf[: T * Kp].view(np.int8).reshape(T, Kp)
    o = T * Kp
    xd = buf[o : o + 4 * T * nb].view(np.float32).reshape(T, nb)
    sx = buf[o + 4 * T * nb : o + 8 * T * nb].view(np.int32).reshape(T, nb)
    xs = buf[o + 8 * T * nb : o + 12 * T * nb].view(np.float32).reshape(T, nb)
    vec = K % QB == 0 and x.strides[1] == 4
    pq = buf.ctypes.data
    for t in range(T):
        for b in range(nb):
            k0 = b * QB
            if vec:
                px = x.ctypes.data + t * x.strides[0] + 4 * k0
                v0 = ld_f32(px)
                v1 = ld_f32(px + 64)
                amax = hmax_f(max_f(abs_f(v0), abs_f(v1)))
            else:
                amax = np.float32(0.0)
                for k in range(k0, min(k0 + QB, K)):
                    amax = max(amax, abs(x[t, k]))
            d = amax / np.float32(127.0)
            inv = np.float32(1.0) / d if d > np.float32(0.0) else np.float32(0.0)
            if vec:
                q0 = rint_i(mul_f(v0, splat_f(inv)))
                q1 = rint_i(mul_f(v1, splat_f(inv)))
                st_i8(pq + t * Kp + k0, q0)
                st_i8(pq + t * Kp + k0 + 16, q1)
                s = hsum_i(add_i(q0, q1))
            else:
                s = 0
                for k in range(k0, k0 + QB):
                    v = np.int32(np.rint(x[t, k] * inv)) if k < K else np.int32(0)
                    xq[t, k] = v
                    s += v
            xd[t, b] = d
            sx[t, b] = s
            xs[t, b] = d * np.float32(s)


@njit(cache=True)
def quantize_groups(x, offs, buf):
    """quantize_acts of each row group x[offs[g]:offs[g+1]] into its own region of buf, group after group (the
    region of group g starts at act_bytes(offs[g], K))."""
    K = x.shape[1]
    per_row = -(-K // QB) * (QB + 12)
    for g in range(offs.shape[0] - 1):
        a, b = offs[g], offs[g + 1]
        quantize_acts(x[a:b], buf[a * per_row : b * per_row])


# ---------------------------------------------------------------------------------------------------------
# kernels
@njit(cache=True, inline="always")
def _blk(kind, p0, p1, p2, bq, off, xa, xd, sx, xs, y):
    """y + the contribution of one block to 16 features (quad bytes from p0 + bq, scales at index off) for one
    row (its quantised block at xa, scale xd, Σq sx, xd·Σq xs)."""
    a0 = zero_i()
    a1 = zero_i()
    if kind == Q8_0:
        for q in range(0, 8, 2):
            a0 = dpbusd(a0, ld_i32(p0 + bq + q * NT * 4), bc_i32(xa + 4 * q))
            a1 = dpbusd(a1, ld_i32(p0 + bq + (q + 1) * NT * 4), bc_i32(xa + 4 * q + 4))
        acc = sub_i(add_i(a0, a1), splat_i(128 * sx))
        return fma_f(cvt(acc), mul_f(ld_h2f(p1 + 2 * off), splat_f(xd)), y)
    for q in range(4):
        w = ld_i32(p0 + bq + q * NT * 4)
        a0 = dpbusd(a0, lo4(w), bc_i32(xa + 4 * q))
        a1 = dpbusd(a1, hi4(w), bc_i32(xa + 16 + 4 * q))
    acc = add_i(a0, a1)
    if kind == Q4_0:
        acc = sub_i(acc, splat_i(8 * sx))
        return fma_f(cvt(acc), mul_f(ld_h2f(p1 + 2 * off), splat_f(xd)), y)
    y = fma_f(cvt(acc), mul_f(ld_h2f(p1 + 2 * off), splat_f(xd)), y)
    return fma_f(ld_h2f(p2 + 2 * off), splat_f(xs), y)


@njit(cache=True, inline="always")
def _put(pout, out, t, N, n0, y):
    """out[t, n0:n0 + 16] = y, clipped at N."""
    if n0 + 16 <= N:
        st_f32(pout + 4 * (t * N + n0), y)
    else:
        for i in range(N - n0):
            out[t, n0 + i] = lane(y, i)


@njit(cache=True, inline="always")
def _drive(kind, p0, p1, p2, nt, nb, pxp, T, Kp, g0, g1, pout, N):
    """Tiles g0..g1 of out [T, N]: rows two at a time, then a last one alone, each over the tile's 64 features
    with the blocks in memory order (a sequential stream the prefetchers follow; a second pair re-reads the tile
    from L2). Wider row groups measured no faster in the model and compiled two to three times slower."""
    nq = 8 if kind == Q8_0 else 4
    o = pxp + T * Kp
    xd = carray(_pf32(o), (T, nb))
    sx = carray(_pi32(o + 4 * T * nb), (T, nb))
    xs = carray(_pf32(o + 8 * T * nb), (T, nb))
    out = carray(_pf32(pout), (T, N))
    for g in range(g0, g1):
        for t in range(0, T - 1, 2):  # pairs of rows over the tile's 64 features (one weight load for both)
            y0 = y1 = y2 = y3 = z0 = z1 = z2 = z3 = zero_f()
            for b in range(nb):
                bq = (g * nb + b) * nq * NT * 4
                off = (g * nb + b) * NT
                xa = pxp + t * Kp + b * QB
                y0, y1, y2, y3 = _blk4(kind, p0, p1, p2, bq, off, xa, xd[t, b], sx[t, b], xs[t, b], y0, y1, y2, y3)
                z0, z1, z2, z3 = _blk4(kind, p0, p1, p2, bq, off, xa + Kp, xd[t + 1, b], sx[t + 1, b], xs[t + 1, b],
                                       z0, z1, z2, z3)
            _put4(pout, out, t, N, g * NT, y0, y1, y2, y3)
            _put4(pout, out, t + 1, N, g * NT, z0, z1, z2, z3)
        if T % 2 == 1:  # the last row alone
            t = T - 1
            y0 = y1 = y2 = y3 = zero_f()
            for b in range(nb):
                bq = (g * nb + b) * nq * NT * 4
                off = (g * nb + b) * NT
                y0, y1, y2, y3 = _blk4(kind, p0, p1, p2, bq, off, pxp + t * Kp + b * QB, xd[t, b], sx[t, b],
                                       xs[t, b], y0, y1, y2, y3)
            _put4(pout, out, t, N, g * NT, y0, y1, y2, y3)


@njit(cache=True, inline="always")
def _blk4(kind, p0, p1, p2, bq, off, xa, xd, sx, xs, y0, y1, y2, y3):
    """_blk for the four 16-feature groups of a tile (one row)."""
    return (_blk(kind, p0, p1, p2, bq, off, xa, xd, sx, xs, y0),
            _blk(kind, p0, p1, p2, bq + 64, off + 16, xa, xd, sx, xs, y1),
            _blk(kind, p0, p1, p2, bq + 128, off + 32, xa, xd, sx, xs, y2),
            _blk(kind, p0, p1, p2, bq + 192, off + 48, xa, xd, sx, xs, y3))


@njit(cache=True, inline="always")
def _put4(pout, out, t, N, n0, y0, y1, y2, y3):
    """out[t, n0:n0 + 64] = y0..y3, clipped at N."""
    _put(pout, out, t, N, n0, y0)
    if n0 + 16 < N:
        _put(pout, out, t, N, n0 + 16, y1)
    if n0 + 32 < N:
        _put(pout, out, t, N, n0 + 32, y2)
    if n0 + 48 < N:
        _put(pout, out, t, N, n0 + 48, y3)


# C entry points (signature intrinsics._KSIG: the f32 kernels' arguments, xp → the activation buffer)
def _k_q4_0(p0, p1, p2, p3, p4, p5, nt, nb, pxp, T, Kp, g0, g1, pout, N):
    _drive(Q4_0, p0, p1, p2, nt, nb, pxp, T, Kp, g0, g1, pout, N)


def _k_q4_1(p0, p1, p2, p3, p4, p5, nt, nb, pxp, T, Kp, g0, g1, pout, N):
    _drive(Q4_1, p0, p1, p2, nt, nb, pxp, T, Kp, g0, g1, pout, N)


def _k_q8_0(p0, p1, p2, p3, p4, p5, nt, nb, pxp, T, Kp, g0, g1, pout, N):
    _drive(Q8_0, p0, p1, p2, nt, nb, pxp, T, Kp, g0, g1, pout, N)


KERNELS = {Q4_0: _k_q4_0, Q4_1: _k_q4_1, Q8_0: _k_q8_0}


# ---------------------------------------------------------------------------------------------------------
# get_rows (bit-exact with gguf.quants.dequantize: ggml's dequantize_row_* arithmetic)
@njit(cache=True)
def _rows_q4(qs, d, m, has_m, rows, out):
    nb = qs.shape[1]
    for r in range(rows.shape[0]):
        g, n = divmod(rows[r], NT)
        for b in range(nb):
            dd = h2f(d[g, b, n])
            mm = h2f(m[g, b, n])
            for q in range(4):
                for i in range(4):
                    v = qs[g, b, q, n, i]
                    k = b * QB + 4 * q + i
                    if has_m:
                        out[r, k] = dd * i2f(v & 15) + mm
                        out[r, k + 16] = dd * i2f(v >> 4) + mm
                    else:
                        out[r, k] = dd * i2f((v & 15) - 8)
                        out[r, k + 16] = dd * i2f((v >> 4) - 8)


@njit(cache=True)
def _rows_q8(qs, d, rows, out):
    nb = qs.shape[1]
    for r in range(rows.shape[0]):
        g, n = divmod(rows[r], NT)
        for b in range(nb):
            dd = h2f(d[g, b, n])
            for q in range(8):
                for i in range(4):
                    out[r, b * QB + 4 * q + i] = dd * i2f(np.int32(qs[g, b, q, n, i]) - 128)


def get_rows(kind: int, arrays: tuple, rows: np.ndarray, out: np.ndarray) -> None:
    if kind == Q8_0:
        _rows_q8(arrays[0], arrays[1], rows, out)
    else:
        m = arrays[2] if kind == Q4_1 else arrays[1]
        _rows_q4(arrays[0], arrays[1], m, kind == Q4_1, rows, out)
