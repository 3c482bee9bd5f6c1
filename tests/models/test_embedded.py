"""The embedded SmolLM2-135M (dense) and its upcycled MoE: oracle agreement, exact windows, row invariance."""

import numpy as np
import pytest

from guild.kernels.cpu import quant
from guild.models import load_model
from tests.helpers.reference import reference_forward

# "The capital of France is Paris. The answer is" in SmolLM2's vocabulary, plus a few more ids
PROMPT = np.array([504, 3575, 282, 4649, 314, 7042, 30, 378, 3164, 314], np.int64)


@pytest.mark.parametrize("numerics, bound", [("f32", 2e-3), ("i8", 0.1)])
def test_dense_matches_float64_reference(dense_model, dense_path, numerics, bound):
    """Stated bounds vs float64 on the same dequantised weights: fp32 dequant-dot 2e-3 x max|logit|; int8
    activations (the reference quantises them alike, but 30 layers of rounding decisions diverge at the level
    of the quantisation noise itself) 0.1 x max|logit|, measured 0.058."""
    with quant.numerics(numerics):
        model = load_model(dense_path) if numerics != "i8" else dense_model
        want = reference_forward(dense_path, PROMPT)
    got = model.forward(PROMPT, model.new_state(64))
    assert np.array_equal(got.argmax(1), want.argmax(1))
    assert np.abs(got - want).max() < bound * np.abs(want).max()


def test_dense_greedy_says_paris(dense_model):
    st = dense_model.new_state(64)
    logits = dense_model.forward(PROMPT[:5], st)
    assert int(logits[-1].argmax()) == 7042  # " Paris"


@pytest.mark.slow  # over 20 s here; tests/models/test_model.py checks the same contract on tiny models
@pytest.mark.parametrize("which", ["dense_model", "moe_model"])
def test_windows_equal_plain_steps(which, request, threads):
    model = request.getfixturevalue(which)
    P = 3
    st = model.new_state(64)
    plain = []
    for t in PROMPT:
        plain.append(model.forward([t], st)[0])
        st.commit(1)
    plain = np.stack(plain)
    for n_threads in (2, 1):
        threads(n_threads)
        for T in range(1, 8):
            st = model.new_state(64)
            model.forward(PROMPT[:P], st)
            st.commit(P)
            win = model.forward(PROMPT[P : P + T], st)
            assert np.array_equal(win, plain[P : P + T]), f"{which} T={T} threads={n_threads}"
            keep = max(1, T // 2)
            st.commit(keep)
            nxt = model.forward(PROMPT[P + keep : P + keep + 1], st)
            assert np.array_equal(nxt[0], plain[P + keep]), f"{which} T={T} keep={keep}"


def test_moe_experts_are_used(moe_model):
    d = moe_model.forward_batch([(PROMPT[:8], moe_model.new_state(64))])[0].distinct_experts
    assert d.shape == (30,) and d.min() >= 2 and d.max() <= 8
    assert d.mean() > 3  # the router spreads 8 rows over several experts


def test_no_dequantised_copy_in_ram(dense_model, dense_path):
    """Packed weights stay quantized: about the GGUF's own bytes, far from a float32 copy (4.4x larger)."""
    import os

    m = dense_model
    packed = {id(m.embed): m.embed, id(m.output): m.output}
    for L in m.layers:
        for lin in (L.qkv, L.wo, L.gu, L.down):
            packed.update({id(p): p for p in lin.parts})
    total = sum(p.nbytes for p in packed.values())
    size = os.path.getsize(dense_path)
    assert 0.9 * size < total < 1.1 * size
