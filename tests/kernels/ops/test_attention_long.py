"""Attention past 1K positions against an independent float64 oracle.

guild's side is what a model layer runs: its rope kernel (kernels/cpu/ops/rows.py) on queries and keys with its
cos/sin tables (kernels/rope.py), the keys and values written window by window into the engine's KVCache (which
grows past its first 256 rows), and attention_kv over that cache: one row (the one-pass `attention`) and windows
of 8 and 40 rows (the score, softmax and value passes, 40 > PREFILL_ROWS). The oracle shares none of it: its own
rope from theta_i = base^(-2i/n_rot) in float64 (adjacent pairs and NEOX halves), and causal GQA softmax
attention in float64 over the unrounded float32 inputs.

The typed caches (f16, q8_0) are held to float64 attention over the cache's stored values read back with NumPy,
and their stored values to NumPy's float16 and gguf-py's Q8_0 quantiser (tests/kernels/ops/test_kv.py holds the
quantiser's rounding rule).
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize, quantize

from guild.engine.state import KVCache
from guild.kernels.cpu import ops
from guild.kernels.cpu.ops import gqa
from guild.kernels.rope import rope_tables
from guild.kvtypes import KVTypes

N = 2600  # cache positions
H, HKV, HD = 8, 2, 64  # four query heads per KV head; hd 64: the 16-lane vector code
BASE = 10000.0
# (first position, rows): straddling 1024; one row (the one-pass kernel) at 2047 and at the last position; 40
# rows (two PREFILL_ROWS blocks) ending at the last position
WINDOWS = ((1020, 8), (2047, 1), (N - 1, 1), (N - 40, 40))
U = 2.0**-24  # float32 unit roundoff


def _inputs(seed: int):
    rng = np.random.default_rng(seed)
    # queries x4: peaked attention, as trained heads have; unit-scale random ones average ~2600 values to near zero,
    # where a rope slip hardly shows
    q = (4 * rng.standard_normal((N, H, HD))).astype(np.float32)
    k = rng.standard_normal((N, HKV, HD)).astype(np.float32)
    v = rng.standard_normal((N, HKV, HD)).astype(np.float32)
    return q, k, v


def oracle_rope(x: np.ndarray, pos: np.ndarray, neox: bool) -> np.ndarray:
    """x [T, heads, hd] rotated by position in float64: pairs (2i, 2i+1), or (i, i + hd/2) under NEOX."""
    half = x.shape[-1] // 2
    ang = pos[:, None].astype(np.float64) * BASE ** (-2.0 * np.arange(half) / x.shape[-1])[None, :]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    x = x.astype(np.float64)
    lo, hi = (slice(0, half), slice(half, None)) if neox else (slice(0, None, 2), slice(1, None, 2))
    out = np.empty_like(x)
    out[..., lo] = x[..., lo] * c - x[..., hi] * s
    out[..., hi] = x[..., lo] * s + x[..., hi] * c
    return out


def oracle_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, pos0: int) -> np.ndarray:
    """Causal GQA softmax attention in float64: q [T, H, hd] at positions pos0.., k, v [>= pos0 + T, Hkv, hd]."""
    T = q.shape[0]
    group = q.shape[1] // k.shape[1]
    L = pos0 + T
    kk = np.repeat(k[:L].astype(np.float64), group, axis=1)  # [L, H, hd]: query head h reads KV head h // group
    vv = np.repeat(v[:L].astype(np.float64), group, axis=1)
    s = np.einsum("thd,jhd->thj", q.astype(np.float64), kk) / np.sqrt(q.shape[-1])
    s = np.where(np.arange(L)[None, None, :] > (pos0 + np.arange(T))[:, None, None], -np.inf, s)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("thj,jhd->thd", p, vv)


def error_bound(q: np.ndarray, k: np.ndarray, v: np.ndarray, L: int) -> float:
    """A worst-case bound on |guild - oracle| for one output element, from float32 rounding (u = 2^-24):
    rope: table entries and the two products and sum, <= 4u (|a| + |b|) per element; a score is an fma chain of
    hd steps over those, |Δs| <= (hd + 8) u S with S = scale Σ_i |q_i k_i| (at most S_max over every pair);
    softmax: exp (a few u) and the fixed-order sum of L terms, relative error of each weight <= 2|Δs| + (L + 4) u;
    the output, a float32 chain of L weighted values, adds L u Σ p_j |v_j|. So
    |Δo| <= max|v| (2 (hd + 8) u S_max + (2L + 4) u)."""
    scale = q.shape[-1] ** -0.5
    s_max = scale * np.einsum("thd,jgd->thjg", np.abs(q), np.abs(k[:L])).max()
    return float(np.abs(v).max() * (2 * (q.shape[-1] + 8) * U * s_max + (2 * L + 4) * U))


def guild_attention(q, k, v, windows, neox: bool, kv: KVTypes = KVTypes()):
    """guild's rope on q and k, k and v written to a KVCache in windows, then attention_kv over each window."""
    cos, sin = rope_tables(N, HD, BASE)
    kr = k.copy()
    ops.rope(kr, np.arange(N, dtype=np.int64), cos, sin, HD, neox)
    cache = KVCache(1, HKV, HD, N, kv)
    for lo, hi in ((0, 1000), (1000, 1024), (1024, 2048), (2048, N)):  # grows 256 -> 2048 -> N
        cache.begin(hi - lo)
        cache.write(0, kr[lo:hi], v[lo:hi])
        cache.commit(hi - lo)
    out = []
    for pos0, T in windows:
        qr = q[pos0 : pos0 + T].copy()
        ops.rope(qr, np.arange(pos0, pos0 + T, dtype=np.int64), cos, sin, HD, neox)
        o = np.empty_like(qr)
        ops.attention_kv(qr, *cache.kv_layer(0), pos0, np.float32(HD**-0.5), o, np.empty((T * H, pos0 + T), np.float32))
        out.append(o)
    return out, cache


@pytest.mark.parametrize("neox", [False, True])
def test_f32_attention_past_1k_matches_float64_oracle(neox):
    q, k, v = _inputs(1)
    got, _ = guild_attention(q, k, v, WINDOWS, neox)
    kr = oracle_rope(k, np.arange(N), neox)
    for (pos0, T), o in zip(WINDOWS, got, strict=True):
        qr = oracle_rope(q[pos0 : pos0 + T], np.arange(pos0, pos0 + T), neox)
        want = oracle_attention(qr, kr, v, pos0)
        tol = error_bound(qr, kr, v, pos0 + T)
        d = np.abs(o - want).max()
        # measured max |Δ| 1.8e-6 .. 7.3e-6 (outputs up to 3.3) against bounds of 1.9e-3 .. 2.8e-3
        assert d <= tol, f"rows {pos0}..{pos0 + T - 1}: max |Δ| {d:.3g} > {tol:.3g}"


def test_the_one_pass_kernel_past_1k_matches_float64_oracle():
    """One row on an AVX-512 host with heads in fours takes gqa_row.attention_row; the one-pass gqa.attention
    (other hosts, other head groups) is held to the oracle past 1K positions here on every host."""
    q, k, v = _inputs(1)
    _, cache = guild_attention(q, k, v, (), False)
    cos, sin = rope_tables(N, HD, BASE)
    kr = oracle_rope(k, np.arange(N), False)
    for pos0 in (2047, N - 1):
        qr = q[pos0 : pos0 + 1].copy()
        ops.rope(qr, np.array([pos0], np.int64), cos, sin, HD, False)
        o = np.empty_like(qr)
        gqa.attention(qr, *cache.kv_layer(0), pos0, np.float32(HD**-0.5), o, np.empty((H, pos0 + 1), np.float32))
        qo = oracle_rope(q[pos0 : pos0 + 1], np.array([pos0]), False)
        d = np.abs(o - oracle_attention(qo, kr, v, pos0)).max()
        assert d <= error_bound(qo, kr, v, pos0 + 1), f"row {pos0}: max |Δ| {d:.3g}"


def test_bound_rejects_rope_position_off_by_one_past_1024():
    """The bound above is tight enough: the keys rotated one position late from 1024 on (the bug a rope table or
    position slip past 1K makes) move the output of a row at 2599 hundreds of times past it."""
    q, k, v = _inputs(1)
    pos = np.arange(N)
    bad = oracle_rope(k, np.where(pos >= 1024, pos - 1, pos), False)
    kr = oracle_rope(k, pos, False)
    qr = oracle_rope(q[N - 1 :], np.array([N - 1]), False)
    d = np.abs(oracle_attention(qr, bad, v, N - 1) - oracle_attention(qr, kr, v, N - 1)).max()
    assert d > 100 * error_bound(qr, kr, v, N), d  # measured 3.33, 1200x the bound


@pytest.mark.parametrize("kt, vt", [("f16", "f16"), ("q8_0", "q8_0"), ("f32", "q8_0"), ("q8_0", "f16")])
def test_typed_cache_past_1k_matches_float64_over_its_stored_values(kt, vt):
    """f16 and q8_0 caches over 2600 positions: attention equals float64 attention over the stored values (read
    back with NumPy), and those values are NumPy's float16 / gguf-py's Q8_0 of the rows written."""
    q, k, v = _inputs(2)
    got, cache = guild_attention(q, k, v, WINDOWS, False, KVTypes(kt, vt))
    cos, sin = rope_tables(N, HD, BASE)
    kr = k.copy()
    ops.rope(kr, np.arange(N, dtype=np.int64), cos, sin, HD, False)  # the float32 rows guild stored
    stored = {"k": _read_back(cache, "k", kt, N), "v": _read_back(cache, "v", vt, N)}
    for name, typ, rows in (("k", kt, kr), ("v", vt, v)):
        assert np.array_equal(stored[name], _store(rows, typ)), f"{name} ({typ}) stored values"
    for (pos0, T), o in zip(WINDOWS, got, strict=True):
        qr = q[pos0 : pos0 + T].copy()
        ops.rope(qr, np.arange(pos0, pos0 + T, dtype=np.int64), cos, sin, HD, False)
        want = oracle_attention(qr, stored["k"], stored["v"], pos0)
        # the same derivation as error_bound without the rope term (the stored values are the inputs)
        tol = error_bound(qr, stored["k"], stored["v"], pos0 + T)
        d = np.abs(o - want).max()
        assert d <= tol, f"{kt}/{vt} rows {pos0}..{pos0 + T - 1}: max |Δ| {d:.3g} > {tol:.3g}"


def _store(rows: np.ndarray, typ: str) -> np.ndarray:
    """rows [N, Hkv, hd] float32 as a cache of `typ` holds them, by NumPy (f16) or gguf-py (q8_0), as float64."""
    if typ == "f32":
        return rows.astype(np.float64)
    if typ == "f16":
        return rows.astype(np.float16).astype(np.float64)
    return dequantize(quantize(rows, Q.Q8_0), Q.Q8_0).astype(np.float64)


def _read_back(cache: KVCache, name: str, typ: str, n: int) -> np.ndarray:
    """A layer's stored keys or values [n, Hkv, hd] as float64, read from the cache's arrays with NumPy."""
    a = getattr(cache, name)[0]
    if name == "k":  # tiles [Hkv, n_tiles, hd, KV_TILE] -> [Hkv, positions, hd]
        a = a.transpose(0, 1, 3, 2).reshape(HKV, -1, HD)
    x = a[:, :n].astype(np.float64)
    if typ == "q8_0":
        d = getattr(cache, name + "_scale")[0]
        if name == "k":
            d = d.transpose(0, 1, 3, 2).reshape(HKV, -1, HD // 32)
        x = (x.reshape(HKV, n, HD // 32, 32) * d[:, :n, :, None].astype(np.float64)).reshape(HKV, n, HD)
    return x.transpose(1, 0, 2)
