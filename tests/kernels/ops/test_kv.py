"""The KV cache's stored forms (kernels/cpu/ops/kv.py): key tiles and the q8_0 quantiser against its twin."""

import numpy as np

from guild.kernels import ref
from guild.kernels.cpu import ops
from tests.helpers import q8

rng = np.random.default_rng(0)


def test_key_tiles_hold_positions_in_order():
    """Keys [.., hd, ctx] in tiles [.., ctx/KV_TILE, hd, KV_TILE]: a run of positions written across a tile
    boundary reads back as written, the rest stays zero, and tile_keys pads the last tile with zeros."""
    T = ops.KV_TILE
    kt = rng.standard_normal((2, 3, 5, 2 * T + 7)).astype(np.float32)  # [L, Hkv, hd, ctx]
    tiles = ops.tile_keys(kt)
    assert tiles.shape == (2, 3, 3, 5, T) and not tiles[..., 2, :, 7:].any()
    assert np.array_equal(tiles[..., 1, 4, :], kt[..., 4, T : 2 * T])  # dimension 4 of positions T .. 2T - 1
    assert np.array_equal(ops.get_keys(tiles, 0, 2 * T + 7), kt)
    z = np.zeros_like(tiles)
    ops.put_keys(z, T - 3, kt[..., : T + 9])
    assert np.array_equal(ops.get_keys(z, T - 3, 2 * T + 6), kt[..., : T + 9])
    assert not ops.get_keys(z, 0, T - 3).any() and not ops.get_keys(z, 2 * T + 6, 3 * T).any()


def test_kv_quantize_q8_0_matches_its_twin():
    x = rng.standard_normal((7, 64)).astype(np.float32) * rng.uniform(0.01, 30, (7, 1)).astype(np.float32)
    x[3, :32] = 0.0  # an all-zero block: scale 0, quants 0
    qs, d = np.empty((7, 64), np.int8), np.empty((7, 2), np.float32)
    ops.kv_quantize_q8_0(x, qs, d)
    rq, rd = ref.kv_quantize_q8_0(x)
    assert np.array_equal(qs, rq) and np.array_equal(d.astype(np.float16), rd)
    assert not qs[3, :32].any() and np.abs(qs).max() == 127



def test_kv_quantize_q8_0_matches_gguf_py_but_at_exact_ties():
    """gguf-py's Q8_0 (bitwise ggml's quantize_row_q8_0_ref: d = max|x| / 127, q = roundf(x * (1 / d)), d stored
    as f16) gives the same quants and scales, except where x * (1 / d) is exactly a half-integer: there guild
    rounds half to even (np.rint, as ggml's x86 quantize_row_q8_0 that llama.cpp runs for its KV cache does:
    tests/oracles/test_ggml_quantizers.py) and gguf-py half away from zero, one step apart."""
    x = q8.rows(4)
    assert all(np.array_equal(a, b) for a, b in zip(q8.kv_q8_0(x), q8.gguf_q8_0(x), strict=True))
    t = q8.ties()
    (qs, d), (gq, gd) = q8.kv_q8_0(t), q8.gguf_q8_0(t)
    assert np.array_equal(d, gd) and (d == 1).all()
    tie = q8.exact_ties(t, d.astype(np.float32))
    assert tie.sum() == t.size // 2
    assert np.array_equal(qs[~tie], gq[~tie])
    assert np.array_equal(qs[tie], np.rint(t[tie])) and np.array_equal(gq[tie], q8.half_away(t[tie]))
    # they differ at ±0.5, ±2.5 and 126.5; ±1.5 and -3.5 round to the even integer away from zero on both
    assert (qs[tie] != gq[tie]).sum() == t.size // 2 * 5 // 8
