"""A prompt's rows do not depend on how prefill chunks it: with the int8 kernels every op of a block is computed
row by row in a fixed order on the CPU, so logits and the cache are bitwise the same for chunks of 1, 7, 64, 72
(beyond the GEMV-sized calls) or the whole prompt at once, and any cached prefix serves a later prompt."""

import numpy as np

from guild.kernels.cpu import quant
from guild.models import load_model

# 100 rows: past every row threshold of the kernels (8, 16, 64 rows a call) and across two 64-position KV tiles
TOKENS = (np.arange(100, dtype=np.int64) * 37 + 11) % 4000


def _prefill(model, chunk):
    st = model.new_state(256)
    parts = []
    for i in range(0, len(TOKENS), chunk):
        parts.append(model.forward(TOKENS[i : i + chunk], st))
        st.commit(st.pending)
    return np.concatenate(parts), st


def test_prefill_rows_do_not_depend_on_the_chunking(moe_model):
    assert moe_model.prefill_row_invariant()
    whole, st = _prefill(moe_model, len(TOKENS))
    for chunk in (1, 7, 64, 72):
        logits, st_c = _prefill(moe_model, chunk)
        assert np.array_equal(logits, whole), chunk
        assert np.array_equal(st_c.k, st.k) and np.array_equal(st_c.v, st.v), chunk


def test_blas_prefill_is_not_claimed_row_invariant(moe_path):
    with quant.numerics("f32"):  # chunks over 64 rows multiply through BLAS
        model = load_model(moe_path)
    assert not model.prefill_row_invariant()
