"""Models whose matrices use the quant types of the files users download (Q5_1, the K-quants below 4 bits, IQ4,
the IQ2/IQ3/IQ1 grids, MXFP4): the engine loads them, matches the float64 reference on the dequantised
weights, and speculative decoding keeps token parity with plain decoding."""

import numpy as np
import pytest

from guild.engine.session import GuildSession
from guild.kernels.cpu import quant
from guild.models import load_model
from guild.speculative.build import make_drafter
from guild.tools.tiny import write_tiny_model
from tests.helpers.drafters import RandomDrafter
from tests.helpers.reference import reference_forward

SMALL = dict(dim=64, ffn=128, n_heads=4, n_kv_heads=2)
KQ = dict(dim=256, ffn=256, n_heads=4, n_kv_heads=2)  # rows of 256-weight blocks
TYPES = [("Q5_1", SMALL), ("MXFP4", SMALL), ("IQ4_NL", SMALL), ("IQ4_XS", KQ), ("Q2_K", KQ), ("Q3_K", KQ),
         ("IQ2_XXS", KQ), ("IQ2_XS", KQ), ("IQ2_S", KQ), ("IQ3_XXS", KQ), ("IQ3_S", KQ), ("IQ1_S", KQ)]
SEQ = np.array([5, 77, 12, 200, 31, 9, 150, 64, 3, 99, 18, 250, 42, 7, 120, 33], np.int64)


@pytest.fixture(scope="module", params=TYPES, ids=[t for t, _ in TYPES])
def moe(request, tmp_path_factory):
    qtype, kw = request.param
    path = tmp_path_factory.mktemp("q") / f"{qtype}.gguf"
    write_tiny_model(path, "llama", qtype=qtype, n_experts=4, top_k=2, seed=7, **kw)
    return str(path), load_model(str(path))


def test_matches_reference(moe):
    """The reference quantises the activations as the kernels do (int8 path; each matrix is held to its twin
    at 1e-6 in tests of the kernels), so logits agree to float32 rounding unless a value the two compute a
    rounding apart sits on a quantisation tie: then one activation moves by a step (1/127 of its block's
    range), and through the KV cache every later row moves a little (seen: 7e-3 on one seed of Q2_K)."""
    path, model = moe
    got = model.forward(SEQ[:10], model.new_state(64))
    want = reference_forward(path, SEQ[:10])
    assert np.array_equal(got.argmax(1), want.argmax(1))
    assert np.abs(got - want).max() <= 2e-2 * max(1.0, np.abs(want).max())


def test_matches_reference_f32_numerics(moe):
    path, _ = moe
    with quant.numerics("f32"):  # the fp32 dequant-dot kernels; the reference then keeps float64 activations
        model = load_model(path)
        want = reference_forward(path, SEQ[:10])
    got = model.forward(SEQ[:10], model.new_state(64))
    assert np.array_equal(got.argmax(1), want.argmax(1))
    assert np.abs(got - want).max() <= 1e-3 * max(1.0, np.abs(want).max())


@pytest.mark.parametrize("strategy", ["lookup", "adaptive", "random"])
def test_strategy_parity(moe, strategy):
    """lookup and adaptive as shipped; `random` drafts every window (the true token with probability 0.6), so
    windows of every length are verified and partly rejected on these weights."""
    _, model = moe
    prompt = [int(t) for t in SEQ[:8]] * 3  # a repeated prompt: lookup has something to draft
    plain, _ = GuildSession(model, n_ctx=128).generate(prompt, 24, drafter=make_drafter("normal"))
    d = RandomDrafter(len(prompt), plain, vocab=model.args.vocab_size) if strategy == "random" else \
        make_drafter(strategy, min_match=2)
    spec, st = GuildSession(model, n_ctx=128).generate(prompt, 24, drafter=d, max_draft=4)
    assert spec == plain
    if strategy == "random":
        assert sum(w.k for w in st.windows) > sum(w.emitted - 1 for w in st.windows) > 0  # accepted and rejected
