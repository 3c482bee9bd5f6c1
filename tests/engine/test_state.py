"""The host KV cache holds the positions used, growing by doubling up to the context: a first prompt at a large
context touches only what it writes, the rows survive each growth bitwise, and `nbytes` stays the full-context
bound a session pool budgets for. Every stored type (f16, q8_0) takes llama.cpp's bytes per value and keeps
the commit(keep) semantics."""

import numpy as np
import pytest

from guild.engine.kvtypes import KVTypes
from guild.engine.state import KV_FIRST_ROWS, KVCache, padded_rows
from guild.errors import BadFlagError, ContextOverflowError


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


# llama.cpp's bytes per value: ggml_type_size / ggml_blck_size of F32, F16, Q8_0
LLAMA_CPP_BYTES = {"f32": 4.0, "f16": 2.0, "q8_0": 34 / 32}


@pytest.mark.parametrize("kt,vt", [("f16", "f16"), ("q8_0", "q8_0"), ("f16", "q8_0"), ("q8_0", "f32")])
def test_typed_cache_bytes_growth_and_bound(kt, vt):
    L, Hkv, hd, n_ctx = 2, 3, 64, 1000
    c = KVCache(L, Hkv, hd, n_ctx, KVTypes(kt, vt))
    per_token = L * Hkv * hd * (LLAMA_CPP_BYTES[kt] + LLAMA_CPP_BYTES[vt])
    first, full = padded_rows(KV_FIRST_ROWS, c.k.itemsize), padded_rows(n_ctx, c.k.itemsize)
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
        assert c.resident_bytes == per_token * c.k.shape[3] >= per_token * c.pos
    # bounded by --context, its rows padded by less than two 64-byte lines of keys
    assert seen == sorted(seen) and seen[0] < c.nbytes and seen[-1] == c.nbytes
    assert c.k.shape[3] - n_ctx < 2 * 64 // c.k.itemsize


@pytest.mark.parametrize("kt", ["f32", "f16", "q8_0"])
def test_f16_and_q8_0_key_rows_span_an_odd_number_of_lines(kt):
    """At a power-of-two context a row of transposed keys would be a power-of-two stride: every dimension's row of
    a K tile in one L1 set. f16 and q8_0 rows are padded to an odd number of 64-byte lines; f32 rows are not."""
    c = KVCache(1, 2, 64, 4096, KVTypes(kt, kt))
    rng = np.random.default_rng(0)
    for _ in range(12):  # 3,072 rows a prefill chunk at a time: grown by doubling to the whole context
        _fill(c, rng, 256, hd=64)
    lines, rest = divmod(c.k.strides[2], 64)
    if kt == "f32":
        assert c.k.shape[3] == 4096 and (lines, rest) == (256, 0)
    else:
        assert rest == 0 and lines % 2 == 1 and 4096 <= c.k.shape[3] < 4096 + 2 * 64 // c.k.itemsize
    assert c.k.strides[3] == c.k.itemsize  # positions stay stride-1: the kernels' vector path


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
        assert a[..., 5:7].any() and not a[..., 7:].any()
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
    assert c.k.shape[3] == padded_rows(1024, c.k.itemsize)
    c.fill_copies(4096)
    assert c.pos == 4096 and c.k.shape[3] >= 4096
    for name, tr in c._arrays():
        a = getattr(c, name)
        assert np.array_equal(KVCache._rows(a, tr, 3072, 4096), KVCache._rows(a, tr, 0, 1024)), name
    c.begin(8)  # and a window still opens after them
