"""Concurrent sessions rely on matmul rows being bitwise independent up to ROW_INVARIANT_ROWS rows per call."""

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from guild.kernels.cpu.quant import ROW_INVARIANT_ROWS, matmul, pack
from guild.kernels.ref_quant import random_raw


@pytest.mark.parametrize("qt", [Q.Q4_1, Q.Q8_0, Q.Q4_K, Q.Q6_K, Q.F32])
def test_rows_invariant_up_to_the_batch_limit(qt):
    rng = np.random.default_rng(0)
    w = pack(qt, random_raw(qt, 96, 512, rng), 96, 512)
    x = rng.standard_normal((ROW_INVARIANT_ROWS, 512)).astype(np.float32)
    full = np.empty((ROW_INVARIANT_ROWS, 96), np.float32)
    matmul(w, x, full)
    for T in (1, 3, 8, 9, 17, 33, ROW_INVARIANT_ROWS):
        part = np.empty((T, 96), np.float32)
        matmul(w, np.ascontiguousarray(x[ROW_INVARIANT_ROWS - T :]), part)
        assert np.array_equal(part, full[ROW_INVARIANT_ROWS - T :]), f"{qt.name} T={T}"
