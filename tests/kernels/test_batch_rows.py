"""Concurrent sessions rely on matmul rows being bitwise independent up to ROW_INVARIANT_ROWS rows per call."""

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from guild.kernels.cpu import quant as kq
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


# -- the limit itself: a wrong ROW_INVARIANT_ROWS (or comparison against it) passes every test above, since the
# int8 kernels are row-invariant at any count; under f32 the limit is where the path changes, so hold it there
WIDE = kq.NARROW_ROWS + 64  # wider than a router: calls above the limit go through BLAS


@pytest.fixture(scope="module")
def wide_f32():
    rng = np.random.default_rng(1)
    with kq.numerics("f32"):
        w = pack(Q.Q4_K, random_raw(Q.Q4_K, WIDE, 256, rng), WIDE, 256)
    assert w.numerics == "f32" and not w.row_invariant
    return w, rng.standard_normal((ROW_INVARIANT_ROWS + 1, 256)).astype(np.float32)


def _path_taken(monkeypatch, w, x):
    """(output, whether the BLAS prefill path ran) of matmul(w, x)."""
    calls = []
    real = kq._prefill_part
    monkeypatch.setattr(kq, "_prefill_part", lambda *a: calls.append(1) or real(*a))
    out = np.empty((x.shape[0], w.n_rows), np.float32)
    matmul(w, x, out)
    return out, bool(calls)


def test_f32_calls_up_to_the_limit_are_row_invariant_and_one_more_row_takes_blas(wide_f32, monkeypatch):
    w, x = wide_f32
    alone = np.concatenate([_path_taken(monkeypatch, w, x[t : t + 1])[0] for t in range(ROW_INVARIANT_ROWS)])
    at, blas_at = _path_taken(monkeypatch, w, np.ascontiguousarray(x[:ROW_INVARIANT_ROWS]))
    assert not blas_at and np.array_equal(at.view(np.uint32), alone.view(np.uint32))
    _, blas_above = _path_taken(monkeypatch, w, x)
    assert blas_above  # so the limit is the largest row-invariant call, not below it


def test_session_rounds_never_put_more_than_the_limit_in_one_call():
    """run_round packs consecutive windows into one forward while their rows fit the limit (the batched
    sessions' logits equal their solo runs' only then), as many as fit."""
    from types import SimpleNamespace

    from guild.engine.session import run_round

    L = ROW_INVARIANT_ROWS
    sizes = [L // 2, L - L // 2, 1, L - 1, 2, L, 1]  # exact fits: an off-by-one splits or merges them
    calls = []

    def forward_batch(batch):
        calls.append([len(w) for w, _ in batch])
        return [None] * len(batch)

    gens = [SimpleNamespace(window=lambda n=n: list(range(n)), s=SimpleNamespace(state=None),
                            finish=lambda out, t: None) for n in sizes]
    run_round(SimpleNamespace(forward_batch=forward_batch), gens)
    assert calls == [[L // 2, L - L // 2], [1, L - 1], [2], [L], [1]]


def test_the_server_pool_reuses_any_prefix_only_up_to_the_limit():
    from guild.serve.batcher import SessionPool

    def pool(batch):
        return SessionPool(lambda: None, lambda s: None, prefill_batch=batch, max_bytes=1 << 20)

    assert pool(ROW_INVARIANT_ROWS).row_invariant and not pool(ROW_INVARIANT_ROWS + 1).row_invariant
