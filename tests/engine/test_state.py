"""The host KV cache holds the positions used, growing by doubling up to the context: a first prompt at a large
context touches only what it writes, the rows survive each growth bitwise, and `nbytes` stays the full-context
bound a session pool budgets for. Every stored type (f16, q8_0) takes llama.cpp's bytes per value and keeps
the commit(keep) semantics."""

import numpy as np
import pytest

from guild.engine.state import KV_FIRST_ROWS, KVCache, tile_rows
from guild.errors import BadFlagError, ContextOverflowError
from guild.kernels.cpu.ops import KV_TILE, get_keys
from guild.kvtypes import KVTypes


def _rows(c):
    """Positions the arrays hold."""
    assert c.k.shape[2] * KV_TILE == c.v.shape[2]
    return c.v.shape[2]


def _fill(c, rng, T, hd=8):
    c.begin(T)
    for layer in range(c.k.shape[0]):
        c.write(layer, rng.standard_normal((T, 2, hd)).astype(np.float32),
                rng.standard_normal((T, 2, hd)).astype(np.float32))
    c.commit(T)


def test_cache_grows_with_the_positions_used():
    c = KVCache(3, 2, 8, 8192)
    full = 2 * 3 * 2 * 8 * 8192 * 4
    assert c.nbytes == full and c.resident_bytes == full * KV_FIRST_ROWS // 8192
    rng = np.random.default_rng(0)
    _fill(c, rng, 44)
    k44, v44 = get_keys(c.k, 0, 44), c.v[:, :, :44].copy()
    assert _rows(c) == KV_FIRST_ROWS
    _fill(c, rng, 300)  # 344 rows: one doubling
    assert _rows(c) == 2 * KV_FIRST_ROWS
    assert np.array_equal(get_keys(c.k, 0, 44), k44) and np.array_equal(c.v[:, :, :44], v44)
    assert not get_keys(c.k, 344, _rows(c)).any() and not c.v[:, :, 344:].any()
    assert c.nbytes == full


def test_cache_stops_at_the_context():
    c = KVCache(1, 1, 4, 300)
    assert _rows(c) == KV_FIRST_ROWS
    c.begin(290)  # a doubling would pass the context: the context it is, in whole key tiles
    assert _rows(c) == tile_rows(300) == 320
    c.commit(290)
    c.begin(10)
    c.commit(10)
    with pytest.raises(ContextOverflowError):
        c.begin(1)


def test_a_prompt_near_the_context_takes_the_rest_at_once():
    """A doubling that leaves under a quarter of the context takes it all: the first decoded row after a
    power-of-two prompt would otherwise copy the whole cache for the few rows left (0.6 s at 16K positions)."""
    c = KVCache(1, 1, 4, 1100)
    for T in (512, 512):  # prefill chunks: 1,024 rows, 76 short of the context
        c.begin(T)
        c.commit(T)
    assert _rows(c) == tile_rows(1100)
    v = c.v
    c.begin(1)
    assert c.v is v  # no new arrays, no copy
    wide = KVCache(1, 1, 4, 4096)
    wide.begin(1024)
    assert _rows(wide) == 1024  # three quarters left: memory still follows the positions used


# llama.cpp's bytes per value: ggml_type_size / ggml_blck_size of F32, F16, Q8_0
LLAMA_CPP_BYTES = {"f32": 4.0, "f16": 2.0, "q8_0": 34 / 32}


@pytest.mark.parametrize("kt,vt", [("f16", "f16"), ("q8_0", "q8_0"), ("f16", "q8_0"), ("q8_0", "f32")])
def test_typed_cache_bytes_growth_and_bound(kt, vt):
    L, Hkv, hd, n_ctx = 2, 3, 64, 1000
    c = KVCache(L, Hkv, hd, n_ctx, KVTypes(kt, vt))
    per_token = L * Hkv * hd * (LLAMA_CPP_BYTES[kt] + LLAMA_CPP_BYTES[vt])
    first, full = tile_rows(KV_FIRST_ROWS), tile_rows(n_ctx)
    assert c.nbytes == per_token * full and c.resident_bytes == per_token * first
    rng = np.random.default_rng(0)
    seen = []
    for T in (100, 200, 300, 399):  # 999 rows: grows by doubling, then stops at the context
        c.begin(T)
        for layer in range(L):
            c.write(layer, rng.standard_normal((T, Hkv, hd)).astype(np.float32),
                    rng.standard_normal((T, Hkv, hd)).astype(np.float32))
        c.commit(T)
        seen.append(c.resident_bytes)
        assert c.resident_bytes == per_token * _rows(c) >= per_token * c.pos
    # bounded by --context, rounded up to whole key tiles
    assert seen == sorted(seen) and seen[0] < c.nbytes and seen[-1] == c.nbytes
    assert 0 <= _rows(c) - n_ctx < KV_TILE


@pytest.mark.parametrize("kt", ["f32", "f16", "q8_0"])
def test_keys_are_stored_in_contiguous_tiles_of_positions(kt):
    """A score pass streams keys from memory: each tile of KV_TILE positions is one contiguous block, each
    dimension's positions adjacent in it (the kernels' vector path), and a window's keys read back as written."""
    c = KVCache(1, 2, 64, 4096, KVTypes(kt, kt))
    rng = np.random.default_rng(0)
    for _ in range(3):
        _fill(c, rng, 106, hd=64)
    c.begin(5)
    k = rng.standard_normal((5, 2, 64)).astype(np.float32)
    c.write(0, k, k)
    n = c.k.itemsize
    assert c.k.strides[4] == n and c.k.strides[3] == KV_TILE * n and c.k.strides[2] == 64 * KV_TILE * n
    got = get_keys(c.k[0], 318, 323)  # [Hkv, hd, 5], across the tile boundary at 320
    if kt == "q8_0":
        got = got * np.repeat(get_keys(c.k_scale[0], 318, 323).astype(np.float32), 32, axis=1)
        np.testing.assert_allclose(got, k.transpose(1, 2, 0), atol=np.abs(k).max() / 127)
    else:
        assert np.array_equal(got, k.transpose(1, 2, 0).astype(c.k.dtype))


@pytest.mark.parametrize("kt,vt", [("f16", "q8_0"), ("q8_0", "f16")])
def test_typed_cache_commit_clears_rejected_rows(kt, vt):
    c = KVCache(1, 2, 32, 64, KVTypes(kt, vt))
    rng = np.random.default_rng(1)
    _fill(c, rng, 5, hd=32)
    kept = [a.copy() for a in (c.k, c.v, c.k_scale if kt == "q8_0" else c.v_scale)]
    c.begin(6)
    c.write(0, rng.standard_normal((6, 2, 32)).astype(np.float32), rng.standard_normal((6, 2, 32)).astype(np.float32))
    c.commit(2)
    assert c.pos == 7
    for a in (c.k, c.k_scale) if kt == "q8_0" else (c.k,):
        assert get_keys(a, 5, 7).any() and not get_keys(a, 7, _rows(c)).any()
    for a in (c.v, c.v_scale) if vt == "q8_0" else (c.v,):
        assert a[:, :, 5:7].any() and not a[:, :, 7:].any()
    c.truncate(5)
    now = [c.k, c.v, c.k_scale if kt == "q8_0" else c.v_scale]
    assert all(np.array_equal(a, b) for a, b in zip(now, kept, strict=True))


def test_q8_0_needs_whole_blocks():
    with pytest.raises(BadFlagError, match="--cache-type-v q8_0 needs a head size that is a multiple of 32"):
        KVCache(1, 2, 16, 64, KVTypes("f16", "q8_0"))
    with pytest.raises(BadFlagError, match="--cache-type-k must be one of f32, f16, q8_0, got 'q4_0'"):
        KVTypes("q4_0")


@pytest.mark.parametrize("kv", [KVTypes(), KVTypes("q8_0", "f16")], ids=["f32", "q8_0-f16"])
def test_fill_copies_grows_the_cache(kv):
    """Calibration extends a filled cache by copies up to its target context, past what the cache had grown to."""
    c = KVCache(1, 2, 32, 4105, kv)
    rng = np.random.default_rng(3)
    for _ in range(2):
        _fill(c, rng, 512, hd=32)
    assert _rows(c) == 1024
    c.fill_copies(4096)
    assert c.pos == 4096 and _rows(c) >= 4096
    for name, tiled in c._arrays():
        a = getattr(c, name)
        assert np.array_equal(KVCache._get(a, tiled, 3072, 4096), KVCache._get(a, tiled, 0, 1024)), name
    c.begin(8)  # and a window still opens after them
