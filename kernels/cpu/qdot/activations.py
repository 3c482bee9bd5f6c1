"""The int8 path's activations: rows of float32 quantised per block of 32 (one scale per 32 or per 256), with
each block's Σq and half sums, into one buffer the kernels read (twin: kernels/ref_quant.py quantize_act_q8)."""

from __future__ import annotations

import numpy as np
from numba import njit

from ...quant_types import act_block
from ..simd import abs_f, hmax_f, hsum_i, ld_f32, max_f, mul_f, rint_i, splat_f, st_i8
from .types import ACT_EXTRA, QB


# ---------------------------------------------------------------------------------------------------------
# activations: [T, K] float32 → one buffer holding q [T, Kp] i8, scale [T, nb] f32, Σq [T, nb] i32,
# scale·Σq [T, nb] f32 and the half sums [T, nb, 2] i32 (Kp = nb · 32, zero padded)
def act_bytes(T: int, n_cols: int) -> int:
    nb = -(-n_cols // QB)
    return T * nb * (QB + ACT_EXTRA)


def act_group(qtype: int) -> int:
    """Activation blocks of 32 that share one scale for a weight type: 8 for the 256-element super-block types
    (ggml's Q8_K activations), else 1 (Q8_0's)."""
    return act_block(qtype) // QB


@njit(cache=True)
def quantize_acts(x, buf, sg):
    """Quantise the rows of x [T, K] into buf (layout above), one scale per `sg` blocks of 32 (1 or 8, K a
    multiple of 32·sg; every block of the group records the group's scale); the twin is ref.quantize_act_q8.
    Whole blocks of 32 in two 16-lane vectors where the row is stride-1 and K a multiple of 32, else element by
    element."""
    T, K = x.shape
    nb = -(-K // QB)
    Kp = nb * QB
    xq = buf[: T * Kp].view(np.int8).reshape(T, Kp)
    o = T * Kp
    xd = buf[o : o + 4 * T * nb].view(np.float32).reshape(T, nb)
    sx = buf[o + 4 * T * nb : o + 8 * T * nb].view(np.int32).reshape(T, nb)
    xs = buf[o + 8 * T * nb : o + 12 * T * nb].view(np.float32).reshape(T, nb)
    sh = buf[o + 12 * T * nb : o + 20 * T * nb].view(np.int32).reshape(T, nb, 2)
    vec = K % QB == 0 and x.strides[1] == 4
    pq = buf.ctypes.data
    for t in range(T):
        px0 = x.ctypes.data + t * x.strides[0]
        for b0 in range(0, nb, sg):
            b1 = min(b0 + sg, nb)
            amax = np.float32(0.0)
            for b in range(b0, b1):
                k0 = b * QB
                if vec:
                    amax = max(amax, hmax_f(max_f(abs_f(ld_f32(px0 + 4 * k0)), abs_f(ld_f32(px0 + 4 * k0 + 64)))))
                else:
                    for k in range(k0, min(k0 + QB, K)):
                        amax = max(amax, abs(x[t, k]))
            d = amax / np.float32(127.0)
            inv = np.float32(1.0) / d if d > np.float32(0.0) else np.float32(0.0)
            for b in range(b0, b1):
                k0 = b * QB
                if vec:
                    q0 = rint_i(mul_f(ld_f32(px0 + 4 * k0), splat_f(inv)))
                    q1 = rint_i(mul_f(ld_f32(px0 + 4 * k0 + 64), splat_f(inv)))
                    st_i8(pq + t * Kp + k0, q0)
                    st_i8(pq + t * Kp + k0 + 16, q1)
                    s0 = hsum_i(q0)
                    s1 = hsum_i(q1)
                else:
                    s0 = 0
                    s1 = 0
                    for k in range(k0, k0 + QB):
                        v = np.int32(np.rint(x[t, k] * inv)) if k < K else np.int32(0)
                        xq[t, k] = v
                        if k < k0 + 16:
                            s0 += v
                        else:
                            s1 += v
                xd[t, b] = d
                sx[t, b] = s0 + s1
                xs[t, b] = d * np.float32(s0 + s1)
                sh[t, b, 0] = s0
                sh[t, b, 1] = s1


@njit(cache=True)
def quantize_groups(x, offs, buf, sg):
    """quantize_acts of each row group x[offs[g]:offs[g+1]] into its own region of buf, group after group (the
    region of group g starts at act_bytes(offs[g], K))."""
    K = x.shape[1]
    per_row = -(-K // QB) * (QB + ACT_EXTRA)
    for g in range(offs.shape[0] - 1):
        a, b = offs[g], offs[g + 1]
        quantize_acts(x[a:b], buf[a * per_row : b * per_row], sg)
