"""The attention kernels (kernels/cpu/ops/gqa.py) held to their NumPy twins (guild.kernels.ref), and their row
invariance over every stored KV type."""

import numba
import numpy as np
import pytest

from guild.kernels import ref
from guild.kernels.cpu import ops
from guild.kernels.cpu.ops import gqa
from tests.helpers.kv import kv_layer

rng = np.random.default_rng(0)


def _attn_inputs(T, pos0, H=6, Hkv=2, hd=16, ctx=40):
    q = rng.standard_normal((T, H, hd)).astype(np.float32)
    k = rng.standard_normal((ctx, Hkv, hd)).astype(np.float32)
    v = rng.standard_normal((ctx, Hkv, hd)).astype(np.float32)
    kc = ops.tile_keys(k.transpose(1, 2, 0))  # the cache's layout: keys in tiles of positions
    vc = np.ascontiguousarray(v.transpose(1, 0, 2))
    return q, k, v, kc, vc


THREAD_COUNTS = (1, min(2, numba.config.NUMBA_NUM_THREADS))  # row invariance on one thread and on two


def _attn(q, kc, vc, pos0):
    T, H, hd = q.shape
    out = np.empty_like(q)
    ops.attention(q, kc, vc, pos0, np.float32(hd**-0.5), out, np.empty((T * H, pos0 + T), np.float32))
    return out


def test_attention_matches_ref():
    q, k, v, kc, vc = _attn_inputs(5, 11)
    np.testing.assert_allclose(_attn(q, kc, vc, 11), ref.attention(q, k, v, 11, 16**-0.5), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("pos0,H,Hkv,hd,ctx", [(9, 6, 2, 16, 40), (33, 9, 3, 32, 90), (70, 8, 2, 16, 90)])
def test_attention_row_invariance(pos0, H, Hkv, hd, ctx, threads):
    # contexts past 64 positions reach the 64-wide score blocks and the 16-wide and lane-by-lane tails
    q, _, _, kc, vc = _attn_inputs(8, pos0, H, Hkv, hd, ctx)
    for n in THREAD_COUNTS:
        threads(n)
        full = _attn(q, kc, vc, pos0)
        for T in range(1, 8):
            for start in range(0, 8 - T + 1):
                part = _attn(np.ascontiguousarray(q[start : start + T]), kc, vc, pos0 + start)
                assert np.array_equal(part, full[start : start + T]), (n, T, start)
    np.testing.assert_allclose(full, ref.attention_kv(q, kc, vc, pos0, hd**-0.5), rtol=1e-4, atol=1e-5)


# f32 and f16 windows: 16 and 80 (a 64-feature value task and a 16-feature one) vectorised, 24 the scalar loops; groups
# of 2, 3 and 4 heads (the value kernel's three-head steps and their remainders)
KV_PAIRS = [("f16", "f16", 16, 6), ("f16", "f16", 64, 6), ("q8_0", "q8_0", 64, 6), ("f32", "q8_0", 64, 6),
            ("q8_0", "f16", 32, 6), ("q8_0", "f32", 128, 8), ("f16", "q8_0", 64, 4), ("f16", "f32", 64, 6),
            ("f32", "f32", 16, 8), ("f32", "f32", 80, 4), ("f32", "f32", 24, 6), ("f16", "f16", 24, 6),
            # groups of 4 and 8 heads with head_dim 64 and 128: one row takes gqa_row.attention_row on AVX-512
            ("f32", "f32", 64, 8), ("f16", "f16", 64, 8), ("q8_0", "q8_0", 64, 8), ("f16", "q8_0", 128, 16)]
Q8_PAIRS = [(a, b) for a in ("f32", "f16", "q8_0") for b in ("f32", "f16", "q8_0") if "q8_0" in (a, b)]


def test_f32_windows_take_the_window_passes(monkeypatch):
    """A float32 window of two rows or more reads the cache once (scores_kv, values_kv); one row, or operands
    that are not stride-1, run the one-pass kernel."""
    pos0, H, hd = 40, 4, 16
    q, k, v, _, _ = _attn_inputs(4, pos0, H, 2, hd, 50)
    kop, vop = kv_layer("f32", "f32", k, v)
    calls = []
    for name in ("attention", "scores_kv", "values_kv"):
        monkeypatch.setattr(gqa, name, lambda *a, f=getattr(gqa, name), n=name: calls.append((n, a[0].shape)) or f(*a))
    scale = np.float32(hd**-0.5)
    ops.attention_kv(q, kop, vop, pos0, scale, np.empty_like(q), np.empty((4 * H, 50), np.float32))
    assert [c[0] for c in calls] == ["scores_kv", "values_kv"]
    calls.clear()
    ops.attention_kv(q[:1], kop, vop, pos0, scale, np.empty_like(q[:1]), np.empty((H, 50), np.float32))
    assert [c[0] for c in calls] == ["attention"]
    calls.clear()
    qs = np.empty((4, H, 2 * hd), np.float32)[:, :, ::2]  # every other float: stride 8
    qs[...] = q
    # the choice is under test, not the kernel: recorded, not run (its non-contiguous specialisation would
    # cost ~23 s of compiling in a fresh clone; the engine always passes contiguous operands)
    monkeypatch.setattr(gqa, "attention", lambda *a: calls.append(("attention", a[0].strides)))
    ops.attention_kv(qs, kop, vop, pos0, scale, np.empty_like(q), np.empty((4 * H, 50), np.float32))
    assert calls == [("attention", qs.strides)]


def _f32_layer(kop, vop):
    """The float32 operands holding exactly the values a stored layer holds (q * d and halves are exact)."""
    k = ref.kv_values(kop, True).astype(np.float32)  # [ctx, Hkv, hd]
    v = ref.kv_values(vop, False).astype(np.float32)
    return ops.tile_keys(k.transpose(1, 2, 0)), np.ascontiguousarray(v.transpose(1, 0, 2))


@pytest.mark.parametrize("kt,vt", Q8_PAIRS)
def test_q8_0_attention_is_f32_attention_over_the_stored_values(kt, vt, threads):
    """The vectorised q8_0 passes dequantise 16 quants per load (q * d, exact in float32) and then run the f32
    passes' chains: every row is bitwise float32 attention over the dequantised cache, and bitwise the same
    whatever the window (T = 1 .. 8, a 20-row chunk) and the thread count. Groups of 3 heads (one row: three
    pairs per K/V load) and 4 (windows: six-pair steps and their remainders)."""
    ctx, Hkv, hd = 150, 2, 64
    for H in (6, 8):
        q, k, v, _, _ = _attn_inputs(20, ctx - 20, H, Hkv, hd, ctx)
        kop, vop = kv_layer(kt, vt, k, v)
        kf, vf = _f32_layer(kop, vop)
        def run(kk, vv, qq, p0):
            out = np.empty_like(qq)
            scores = np.empty((qq.shape[0] * qq.shape[1], ctx), np.float32)
            ops.attention_kv(qq, kk, vv, p0, np.float32(hd**-0.5), out, scores)
            return out

        for n in THREAD_COUNTS:
            threads(n)
            chunk = run(kop, vop, q, ctx - 20)
            assert np.array_equal(chunk, run(kf, vf, q, ctx - 20)), n
            alone = [run(kop, vop, q[t : t + 1], ctx - 20 + t) for t in range(20)]
            for T in range(1, 9):
                t0 = 12 - T // 2  # windows in the middle of the chunk
                win = run(kop, vop, np.ascontiguousarray(q[t0 : t0 + T]), ctx - 20 + t0)
                assert np.array_equal(win, run(kf, vf, np.ascontiguousarray(q[t0 : t0 + T]), ctx - 20 + t0))
                for t in range(T):
                    assert np.array_equal(win[t], alone[t0 + t][0]), (n, H, T, t)
                    assert np.array_equal(chunk[t0 + t], alone[t0 + t][0]), (n, H, T, t)
        np.testing.assert_allclose(chunk, ref.attention_kv(q, kop, vop, ctx - 20, hd**-0.5), rtol=1e-4, atol=1e-5)


def test_q8_0_attention_rejects_a_head_size_that_is_not_whole_blocks():
    q = np.zeros((2, 2, 48), np.float32)
    kq, vq = np.zeros((1, 1, 48, ops.KV_TILE), np.int8), np.zeros((1, 8, 48), np.int8)
    ks, vs = np.zeros((1, 1, 1, ops.KV_TILE), np.uint16), np.zeros((1, 8, 1), np.uint16)
    with pytest.raises(ValueError, match="multiple of 32, got 48"):
        ops.attention_kv(q, (kq, ks), (vq, vs), 6, np.float32(1.0), np.empty_like(q), np.empty((4, 8), np.float32))


def _strided(a):
    """a copied into every other element of its last axis: the same values, no longer stride-1."""
    s = np.zeros((*a.shape[:-1], 2 * a.shape[-1]), a.dtype)[..., ::2]
    s[...] = a
    return s


@pytest.mark.parametrize("kt,vt", [("q8_0", "q8_0"), ("q8_0", "f16"), ("f32", "q8_0")])
def test_q8_0_operands_that_are_not_stride_1_take_the_scalar_loops(kt, vt, threads):
    """Stored K/V that are not stride-1 along their last axis cannot be loaded 16 lanes at a time: the scalar
    loops give rows close to the twin and still row invariant (other bits than the vector chains: they multiply
    then add, as `attention`'s scalar path). The q8_0 side is the strided one; a float side stays stride-1, so
    one call mixes a scalar pass with a vector one (a strided float side would compile one more specialisation
    per type, ~10 s each: the float types' scalar loops are held by the head size 24 cases of KV_PAIRS)."""
    ctx, Hkv, hd, H, pos0 = 90, 2, 32, 6, 82
    q, k, v, _, _ = _attn_inputs(8, pos0, H, Hkv, hd, ctx)
    kop, vop = kv_layer(kt, vt, k, v)
    ks = tuple(_strided(a) for a in kop) if kt == "q8_0" else kop
    vs = tuple(_strided(a) for a in vop) if vt == "q8_0" else vop

    def run(kk, vv, qq, p0):
        out = np.empty_like(qq)
        ops.attention_kv(qq, kk, vv, p0, np.float32(hd**-0.5), out, np.empty((qq.shape[0] * H, ctx), np.float32))
        return out

    for n in THREAD_COUNTS:
        threads(n)
        full = run(ks, vs, q, pos0)
        for t in (0, 3, 7):
            assert np.array_equal(run(ks, vs, q[t : t + 1], pos0 + t)[0], full[t]), (n, t)
        assert np.array_equal(run(ks, vs, q[2:6], pos0 + 2), full[2:6]), n
    np.testing.assert_allclose(full, ref.attention_kv(q, kop, vop, pos0, hd**-0.5), rtol=1e-4, atol=1e-5)
    assert not np.array_equal(full, run(kop, vop, q, pos0))  # the scalar chains ran, not the vector ones


@pytest.mark.parametrize("vt", ["f32", "f16", "q8_0"])
def test_the_value_pass_in_halves_is_the_value_pass(vt, threads):
    """A head's (row, head) pairs split in two tasks (three KV heads on two threads) give every output bitwise
    what one task per head gives: windows past six pairs a head, rows ending inside a tile and past it."""
    H, Hkv, hd, ctx = 9, 3, 64, 150
    _, k, v, _, _ = _attn_inputs(1, 0, H, Hkv, hd, ctx)
    _, vop = kv_layer("f32", vt, k, v)
    for n in THREAD_COUNTS:
        threads(n)
        for T, pos0 in ((3, 60), (4, 124), (8, 142), (5, 0)):
            scores = rng.random((T * H, ctx)).astype(np.float32)
            inv = rng.random(T * H).astype(np.float32)
            whole, halves = np.empty((T, H, hd), np.float32), np.empty((T, H, hd), np.float32)
            ops.values_kv(scores, inv, vop, pos0, whole, False)
            ops.values_kv(scores, inv, vop, pos0, halves, True)
            assert np.array_equal(whole, halves), (n, T, pos0)
            one = np.empty((1, H, hd), np.float32)  # and each row is what it is alone
            ops.values_kv(np.ascontiguousarray(scores[(T - 1) * H :]), inv[(T - 1) * H :], vop, pos0 + T - 1, one)
            assert np.array_equal(one[0], halves[T - 1]), (n, T, pos0)


@pytest.mark.parametrize("kt,vt,hd,H", KV_PAIRS)
def test_typed_attention_matches_ref_and_is_row_invariant(kt, vt, hd, H, threads):
    """The window kernels read each K and V block once for all the rows of a call; every row still gets bitwise
    what it gets alone (any T, any neighbours, any thread count)."""
    # 90 positions: score tiles of 64 and a partial one
    pos0, Hkv, ctx = 70, 2, 90
    q, k, v, _, _ = _attn_inputs(8, pos0, H, Hkv, hd, ctx)
    kop, vop = kv_layer(kt, vt, k, v)
    assert (isinstance(kop, tuple), isinstance(vop, tuple)) == (kt == "q8_0", vt == "q8_0")

    def run(qq, p0):
        out = np.empty_like(qq)
        ops.attention_kv(qq, kop, vop, p0, np.float32(hd**-0.5), out, np.empty((qq.shape[0] * H, ctx), np.float32))
        return out

    for n in THREAD_COUNTS:
        threads(n)
        full = run(q, pos0)
        for T in (1, 3, 5):
            for start in (0, 8 - T):
                part = run(np.ascontiguousarray(q[start : start + T]), pos0 + start)
                assert np.array_equal(part, full[start : start + T]), (n, T, start)
        q20 = rng.standard_normal((20, H, hd)).astype(np.float32)  # a prefill chunk: two blocks of KV_ROWS
        chunk = run(q20, 60)
        for t in (0, 7, 15, 16, 19):
            assert np.array_equal(run(q20[t : t + 1], 60 + t), chunk[t : t + 1]), (n, t)
    np.testing.assert_allclose(full, ref.attention_kv(q, kop, vop, pos0, hd**-0.5), rtol=1e-4, atol=1e-5)
    if kt == vt == "f32":  # the window passes compute the one-pass kernel's chains
        scores = np.empty((8 * H, ctx), np.float32)
        out = np.empty_like(q)
        ops.attention(q, kop, vop, pos0, np.float32(hd**-0.5), out, scores)
        assert np.array_equal(full, out)
        return
    # the stored types are what was read: close to float32 attention, not equal to it
    f32 = ref.attention(q, k, v, pos0, hd**-0.5)
    assert 0 < np.abs(full - f32).max() < (0.02 if "q8_0" in (kt, vt) else 2e-3)


@pytest.mark.parametrize("kt,T", [("f32", 70), ("f16", 41), ("q8_0", 70)])
def test_a_prefill_chunk_from_position_0_gives_each_row_its_own_bits(kt, T):
    """A chunk of T rows from position 0 (every 16 positions hold rows that end inside them; pairs in blocks of
    six that straddle rows; scratch exactly pos0 + T wide): each row bitwise what it gets alone."""
    H, Hkv, hd = 8, 2, 32
    q, k, v, _, _ = _attn_inputs(T, 0, H, Hkv, hd, T)
    kop, vop = kv_layer(kt, kt, k, v)

    def run(qq, p0):
        out = np.empty_like(qq)
        n = qq.shape[0]
        ops.attention_kv(qq, kop, vop, p0, np.float32(hd**-0.5), out, np.empty((n * H, p0 + n), np.float32))
        return out

    full = run(q, 0)
    for t in range(T):
        assert np.array_equal(run(q[t : t + 1], t), full[t : t + 1]), t


@pytest.mark.parametrize("kt,vt", [("f32", "f32"), ("f16", "q8_0")])
def test_one_row_in_fours_takes_the_row_kernel_on_avx512(kt, vt, monkeypatch):
    """The shapes above with heads in fours reach attention_row where the host has AVX-512 (so the row
    invariance they assert is the row kernel's against the window passes), and never elsewhere."""
    from guild.kernels.cpu.ops import gqa_row

    calls = []
    monkeypatch.setattr(gqa, "attention_row", lambda *a: calls.append(a) or gqa_row.attention_row(*a))
    H, Hkv, hd, pos0 = 8, 2, 64, 70
    q, k, v, _, _ = _attn_inputs(1, pos0, H, Hkv, hd, 90)
    kop, vop = kv_layer(kt, vt, k, v)
    out = np.empty_like(q)
    ops.attention_kv(q, kop, vop, pos0, np.float32(hd**-0.5), out, np.empty((H, 90), np.float32))
    assert len(calls) == (1 if gqa_row.WIDE_ROW else 0)
    np.testing.assert_allclose(out, ref.attention_kv(q, kop, vop, pos0, hd**-0.5), rtol=1e-4, atol=1e-5)
    q3, k3, v3, _, _ = _attn_inputs(1, pos0, 6, Hkv, hd, 90)  # groups of 3: the general loops
    kop, vop = kv_layer(kt, vt, k3, v3)
    ops.attention_kv(q3, kop, vop, pos0, np.float32(hd**-0.5), np.empty_like(q3), np.empty((6, 90), np.float32))
    assert len(calls) == (1 if gqa_row.WIDE_ROW else 0)
