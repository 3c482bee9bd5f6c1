"""The host KV cache holds the positions used, growing by doubling up to the context: a first prompt at a large
context touches only what it writes, the rows survive each growth bitwise, and `nbytes` stays the full-context
bound a session pool budgets for."""

import numpy as np
import pytest

from guild.engine.state import KV_FIRST_ROWS, KVCache
from guild.errors import ContextOverflowError


def _fill(c, rng, T):
    c.begin(T)
    for layer in range(c.k.shape[0]):
        c.write(layer, rng.standard_normal((T, 2, 8)).astype(np.float32),
                rng.standard_normal((T, 2, 8)).astype(np.float32))
    c.commit(T)


def test_cache_grows_with_the_positions_used():
    c = KVCache(3, 2, 8, 8192)
    full = 2 * 3 * 2 * 8 * 8192 * 4
    assert c.nbytes == full and c.resident_bytes == full * KV_FIRST_ROWS // 8192
    rng = np.random.default_rng(0)
    _fill(c, rng, 44)
    k44, v44 = c.k[..., :44].copy(), c.v[:, :, :44].copy()
    assert c.k.shape[3] == KV_FIRST_ROWS
    _fill(c, rng, 300)  # 344 rows: one doubling
    assert c.k.shape[3] == 2 * KV_FIRST_ROWS and c.v.shape[2] == 2 * KV_FIRST_ROWS
    assert np.array_equal(c.k[..., :44], k44) and np.array_equal(c.v[:, :, :44], v44)
    assert not c.k[..., 344:].any() and not c.v[:, :, 344:].any()
    assert c.nbytes == full


def test_cache_stops_at_the_context():
    c = KVCache(1, 1, 4, 300)
    assert c.k.shape[3] == KV_FIRST_ROWS
    c.begin(290)  # a doubling would pass the context: the context it is
    assert c.k.shape[3] == 300
    c.commit(290)
    c.begin(10)
    c.commit(10)
    with pytest.raises(ContextOverflowError):
        c.begin(1)
