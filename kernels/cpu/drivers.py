"""The shared pieces of every generated GEMV kernel (kernels/cpu/quant_gen.py): per-thread scratch, the
T >= 3 consumer of a dequantised unit (`_use` / `_accum`), the tile store and the activation permutation."""

from __future__ import annotations

import llvmlite.binding as ll
import numpy as np
from llvmlite import ir
from numba import carray, cfunc, njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from .intrinsics import _pf32, _pi64, fma32

NT = 64  # features per tile


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


def _use_c(pwb, pxp, pacc, T, kb, U, pout, Kp, N, col):
    """_use over addresses (the views _scratch makes, wb [U, NT] and acc [T, NT]): the C entry point that every
    generated kernel calls by name instead of inlining _use, so that _use and _accum compile once."""
    wb = carray(_pf32(pwb), (U, NT))
    xp = carray(_pf32(pxp), (T, Kp))
    perm = carray(_pi64(pxp), (Kp if T == 0 else 0,))
    out = carray(_pf32(pout), (T if T > 0 else Kp, N))
    acc = carray(_pf32(pacc), (T, NT))
    _use(wb, xp, acc, T, kb, U, out, perm, col)


# the symbol the kernels call, resolved by LLVM's JIT linker (cached kernels too) to the compiled _use_c; the
# version names the argument list, which a cached kernel was compiled against
_USE_SYMBOL = "guild_f32_use_v1"
_USE_ARGS = 10
_USE = cfunc(types.void(*([types.int64] * _USE_ARGS)), cache=True)(_use_c)
ll.add_symbol(_USE_SYMBOL, _USE.address)


@intrinsic
def _use_at(typingctx, pwb, pxp, pacc, T, kb, U, pout, Kp, N, col):
    """_use_c(...) through its symbol: a call, not a copy of _use in every kernel."""
    argtys = (pwb, pxp, pacc, T, kb, U, pout, Kp, N, col)
    if not all(isinstance(a, types.Integer) for a in argtys):
        return None
    sig = types.void(*([types.int64] * _USE_ARGS))

    def codegen(context, builder, signature, args):
        i64 = ir.IntType(64)
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [i64] * _USE_ARGS),
                                            _USE_SYMBOL)
        builder.call(fn, [context.cast(builder, v, t, types.int64) for v, t in zip(args, signature.args,
                                                                                     strict=True)])
        return context.get_dummy_value()

    return sig, codegen
