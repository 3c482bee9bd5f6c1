"""The fp32 kernels (`--numerics f32`) of every quant type against the NumPy twin (kernels/ref_quant.py): the
matrices of tests/kernels/test_quant.py are packed under the default int8 numerics, which leaves these kernels
to this file. Bound (docs/numerics.md): |Δ| <= 1e-4 * (|W| @ |x|) elementwise, vs float64 accumulation."""

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from guild.kernels import ref_quant
from guild.kernels.cpu import quant as kq

RTOL = 1e-4
TYPES = [Q(q) for q in kq.KINDS]
K = 256  # one 256-element super-block of the K- and IQ-quants, eight 32-element blocks of the others


def _check(w, W, x):
    got = np.empty((x.shape[0], w.n_rows), np.float32)
    kq.matmul(w, x, got)
    ref = ref_quant.matmul_ref(W, x).astype(np.float64)  # float64 products of the twin's weights
    bound = RTOL * (np.abs(x).astype(np.float64) @ np.abs(W).T.astype(np.float64)) + 1e-30
    err = np.abs(got.astype(np.float64) - ref)
    assert np.all(err <= bound), f"worst {np.max(err / bound):.3g} x tolerance"


@pytest.mark.parametrize("qt", TYPES, ids=lambda q: q.name)
def test_f32_gemv_matches_the_twin(qt):
    """T = 1 and 2 dequantise in registers, T >= 3 through the scratch: every path of each type's kernel."""
    rng = np.random.default_rng(int(qt))
    raw = ref_quant.random_raw(qt, 80, K, rng)
    with kq.numerics("f32"):
        w = kq.pack(qt, raw, 80, K)
    assert w.numerics == "f32"
    W = ref_quant.dequantize(qt, raw, (80, K))
    for T in (1, 2, 3, 5):
        _check(w, W, rng.standard_normal((T, K)).astype(np.float32))


@pytest.mark.parametrize("qt", [Q.Q8_0, Q.Q4_K, Q.Q6_K, Q.IQ4_XS, Q.F16], ids=lambda q: q.name)
def test_f32_prefill_reaches_blas_and_matches_the_twin(qt, monkeypatch):
    """A call of more than ROW_INVARIANT_ROWS rows on a matrix wider than a router dequantises through the kernel
    (its T = 0 mode) and multiplies with BLAS: held to the same bound, and the path checked, not assumed."""
    rng = np.random.default_rng(int(qt) + 100)
    n = kq.NARROW_ROWS + 64
    raw = ref_quant.random_raw(qt, n, K, rng)
    with kq.numerics("f32"):
        w = kq.pack(qt, raw, n, K)
    calls, real = [], kq._prefill_part
    monkeypatch.setattr(kq, "_prefill_part", lambda *a: calls.append(1) or real(*a))
    _check(w, ref_quant.dequantize(qt, raw, (n, K)), rng.standard_normal((kq.ROW_INVARIANT_ROWS + 1, K)).astype(
        np.float32))
    assert calls
