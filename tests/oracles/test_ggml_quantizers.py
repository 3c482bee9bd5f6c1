"""guild's int8 quantisers against ggml's own, called in llama-cpp-python's libggml (ctypes): what llama.cpp runs
on the rows of a q8_0 KV cache and on the activations of its quantised matmuls (the CPU backend's from_float).

What is true (ggml of llama-cpp-python 0.3.36, x86):
- Q8_0. d = max|x| / 127 (float32), stored as f16, on all sides. ggml's CPU quantize_row_q8_0 (the SIMD one)
  takes q = x * (127 / max|x|) rounded half to even; its reference quantize_row_q8_0_ref, which gguf-py
  reproduces, q = roundf(x * (1 / d)), half away from zero; guild's two Q8_0 quantisers (the KV cache's,
  kernels/cpu/ops/kv.py; the activations', kernels/cpu/qdot/activations.py) q = rint(x * (1 / d)): the reference's
  multiplier, the CPU's rounding. So guild equals gguf-py except at exact ties (tests/kernels/ops/test_kv.py,
  tests/kernels/test_qdot.py), and ggml's CPU quantiser except where 127 / max|x| and 1 / d (one float32 ulp
  apart in some blocks) put x on either side of a half: one step apart there (1 element in 655,360 random ones
  measured); the scales are equal.
- Q8_K (the activations of the super-block types). ggml scales by -127 / m, m the block's largest-magnitude value
  with its sign, rounds half to even and stores d = 1 / (-127 / m) (negative when m > 0); guild scales by
  1 / (max|x| / 127) and stores d = max|x| / 127. The quants are the same up to that sign except, as for Q8_0,
  where the two multipliers round x differently; |d| is guild's d within one float32 ulp.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import q8
from tests.helpers.optional import installed

pytestmark = pytest.mark.oracle


@pytest.fixture(scope="module")
def ggml():
    """ggml's quantisers from llama-cpp-python's shared libraries (a failure to load them fails the tests)."""
    lib = Path(installed("llama_cpp").__file__).parent / "lib"
    cpu, base = ctypes.CDLL(str(lib / "libggml-cpu.so")), ctypes.CDLL(str(lib / "libggml-base.so"))
    cpu.ggml_cpu_init()  # the CPU backend's tables (f16 conversion) before its row quantisers run
    fns = {"q8_0": cpu.quantize_row_q8_0, "q8_0_ref": base.quantize_row_q8_0_ref, "q8_K": cpu.quantize_row_q8_K}
    for f in fns.values():
        f.argtypes, f.restype = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64], None
    return fns


def ggml_q8_0(fn, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """block_q8_0 rows (f16 d, 32 int8) from ggml: (quants [n, k], scales [n, k/32] float16)."""
    x = np.ascontiguousarray(x, np.float32)
    out = np.zeros(x.size // 32 * 34, np.uint8)
    fn(x.ctypes.data, out.ctypes.data, x.size)
    b = out.reshape(-1, 34)
    return b[:, 2:].view(np.int8).reshape(x.shape), b[:, :2].copy().view(np.float16).reshape(x.shape[0], -1)


def ggml_q8_K(fn, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """block_q8_K rows (f32 d, 256 int8, 16 int16 sums) from ggml: (quants [n, k], scales [n, k/256] float32)."""
    x = np.ascontiguousarray(x, np.float32)
    out = np.zeros(x.size // 256 * 292, np.uint8)
    fn(x.ctypes.data, out.ctypes.data, x.size)
    b = out.reshape(-1, 292)
    return b[:, 4:260].view(np.int8).reshape(x.shape), b[:, :4].copy().view(np.float32).reshape(x.shape[0], -1)


def multiplier_split(x: np.ndarray, a: np.ndarray, b: np.ndarray, block: int) -> np.ndarray:
    """Where rint(x * a) != rint(x * b) (float32; a, b one multiplier per block of `block` per row)."""
    a, b = np.repeat(a, block, axis=1), np.repeat(b, block, axis=1)
    return np.rint(x * a) != np.rint(x * b)


@pytest.mark.parametrize("which", ["kv", "activations"])
def test_q8_0_is_ggml_cpu_quantize_row_q8_0(ggml, which):
    for x in (q8.rows(6), q8.rows(7), q8.ties()):
        qs, d = q8.kv_q8_0(x) if which == "kv" else q8.act_q8(x, 1)
        gq, gd = ggml_q8_0(ggml["q8_0"], x)
        assert np.array_equal(d.astype(np.float16), gd), f"{which}: scales differ from ggml's"
        amax = np.abs(x.reshape(x.shape[0], -1, 32)).max(-1)
        d32 = amax / np.float32(127)
        inv = np.divide(np.float32(1), d32, out=np.zeros_like(d32), where=d32 > 0)
        # ggml's own rule, reproduced: the premise of the exception below
        assert np.array_equal(
            gq,
            np.rint(
                x * np.repeat(np.divide(np.float32(127), amax, out=np.zeros_like(amax), where=amax > 0), 32, axis=1)
            ),
        )
        split = multiplier_split(x, inv, np.divide(np.float32(127), amax, out=np.zeros_like(amax), where=amax > 0), 32)
        assert np.array_equal(qs[~split], gq[~split]), f"{which}: {(qs[~split] != gq[~split]).sum()} quants differ"
        assert (np.abs(qs[split].astype(int) - gq[split]) == 1).all() and split.sum() <= 2


def test_ggml_reference_q8_0_rounds_ties_away_from_zero(ggml):
    """The premise of the gguf-py tests: ggml's reference quantiser is gguf-py's, and at exact ties it rounds half
    away from zero where its CPU quantiser rounds half to even."""
    x = q8.rows(7)
    assert all(np.array_equal(a, b) for a, b in zip(ggml_q8_0(ggml["q8_0_ref"], x), q8.gguf_q8_0(x), strict=True))
    t = q8.ties()
    (cq, _), (rq, _) = ggml_q8_0(ggml["q8_0"], t), ggml_q8_0(ggml["q8_0_ref"], t)
    assert np.array_equal(cq, np.rint(t)) and np.array_equal(rq, q8.half_away(t))
    assert np.array_equal(q8.gguf_q8_0(t)[0], rq)


def test_q8_K_activations_are_ggml_quantize_row_q8_K_up_to_sign(ggml):
    for x in (q8.rows(8), q8.rows(9), q8.ties()):
        qs, d = q8.act_q8(x, 8)
        gq, gd = ggml_q8_K(ggml["q8_K"], x)
        blocks = x.reshape(x.shape[0], -1, 256)
        m = np.take_along_axis(blocks, np.abs(blocks).argmax(-1)[..., None], -1)[..., 0]  # signed, per block
        assert np.array_equal(np.sign(gd), -np.sign(m)), "ggml's d has the opposite sign of the block's extreme"
        d8 = d[:, ::8]  # the group's scale, recorded in each of its 8 blocks
        assert np.array_equal(np.repeat(d8, 8, axis=1), d)
        assert (np.abs(np.abs(gd) - d8) <= np.spacing(d8)).all(), "|d| within one float32 ulp of guild's"
        iscale = np.divide(np.float32(-127), m, out=np.zeros_like(m), where=m != 0)
        assert np.array_equal(gq, np.minimum(127, np.rint(x * np.repeat(iscale, 256, axis=1)))), "ggml's rule"
        inv = np.divide(np.float32(1), d8, out=np.zeros_like(d8), where=d8 > 0)
        split = multiplier_split(x, inv, np.abs(iscale), 256)  # rint is odd: the sign does not move a tie
        signed = np.repeat(np.where(m == 0, 1, -np.sign(m)), 256, axis=1) * gq
        assert np.array_equal(qs[~split], signed[~split]), "quants, up to ggml's sign"
        assert (np.abs(qs[split].astype(int) - signed[split]) == 1).all() and split.sum() <= 2
