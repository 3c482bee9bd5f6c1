"""Model forward: agreement with the float64 reference, exact commit(keep), row invariance
(docs/contracts.md "Window", "Row invariance")."""

import numpy as np
import pytest

from guild.kernels.cpu.ops import get_keys
from guild.kvtypes import KVTypes
from guild.models import load_model
from guild.tools.tiny import write_tiny_model
from tests.helpers.reference import reference_forward

TINY = [
    dict(arch="llama", qtype="F32"),
    dict(arch="llama", qtype="Q4_1"),
    dict(arch="llama", qtype="Q8_0", n_experts=4, top_k=2),
    dict(arch="qwen3", qtype="F16"),
    dict(arch="qwen3moe", qtype="Q4_0", n_experts=4, top_k=2),
]


def _id(c):
    return "-".join(str(v) for v in c.values())


@pytest.fixture(scope="module", params=TINY, ids=_id)
def tiny(request, tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny") / "m.gguf"
    write_tiny_model(path, seed=3, **request.param)
    return str(path), load_model(str(path))


SEQ = np.array([5, 77, 12, 200, 31, 9, 150, 64, 3, 99, 18, 250, 42, 7, 120, 33], np.int64)


def _plain(model, seq, n_ctx=64):
    """Logits of one-token steps over seq: row i predicts position i+1."""
    st = model.new_state(n_ctx)
    rows = []
    for t in seq:
        rows.append(model.forward([t], st)[0])
        st.commit(1)
    return np.stack(rows)


def test_matches_reference(tiny):
    path, model = tiny
    st = model.new_state(64)
    got = model.forward(SEQ[:10], st)
    want = reference_forward(path, SEQ[:10])
    assert np.array_equal(got.argmax(1), want.argmax(1))
    # fp32 kernels vs float64 reference on fp32-dequantised weights
    assert np.abs(got - want).max() <= 1e-3 * max(1.0, np.abs(want).max())


def test_commit_keep_equals_plain_decoding(tiny):
    _, model = tiny
    P = 4  # prompt rows, then windows over SEQ[P:]
    plain = _plain(model, SEQ)
    for T in range(2, 9):
        for keep in range(1, T + 1):
            st = model.new_state(64)
            model.forward(SEQ[:P], st)
            st.commit(P)
            win = model.forward(SEQ[P : P + T], st)
            assert np.array_equal(win, plain[P : P + T]), f"T={T}: window rows differ from plain steps"
            st.commit(keep)
            assert st.pos == P + keep
            assert not get_keys(st.k, st.pos, st.v.shape[2]).any() and not st.v[:, :, st.pos :].any()
            nxt = model.forward(SEQ[P + keep : P + keep + 2], st)
            assert np.array_equal(nxt, plain[P + keep : P + keep + 2]), f"T={T} keep={keep}"


def test_row_invariance_neighbours_and_threads(tiny, threads):
    _, model = tiny
    rng = np.random.default_rng(1)
    ref_rows = None
    for n_threads in (1, 2):
        threads(n_threads)
        for T in range(1, 9):
            st = model.new_state(64)
            model.forward(SEQ[:3], st)
            st.commit(3)
            win = SEQ[3 : 3 + T].copy()
            if T > 1:  # different neighbours after row 0
                win[1:] = rng.integers(0, 256, T - 1)
            row0 = model.forward(win, st)[0]
            if ref_rows is None:
                ref_rows = row0
            assert np.array_equal(row0, ref_rows), f"row 0 changed with T={T}, threads={n_threads}"


def test_moe_routes_distinct_experts(tmp_path):
    path = tmp_path / "moe.gguf"
    write_tiny_model(path, arch="llama", n_experts=4, top_k=2, qtype="F32", seed=5)
    m = load_model(str(path))
    d = m.forward_batch([(SEQ[:8], m.new_state(32))])[0].distinct_experts
    assert d.shape == (2,)
    assert (d >= 2).all() and (d <= 4).all()


def test_lists_of_architectures_are_read_off_the_classes():
    """What the GPU path places and train-mtp's SUPPORTED_ARCHS are read off each class's declaration: every
    registered architecture runs on the GPU; the Llama family (whose block train-mtp's PyTorch twin mirrors)
    trains heads, the DeltaNet hybrids do not."""
    from guild.models import REGISTRY
    from guild.tools.train_mtp.config import SUPPORTED_ARCHS

    assert all(c.GPU for c in REGISTRY.values())
    assert SUPPORTED_ARCHS == ("llama", "qwen3", "qwen3moe")
    assert not REGISTRY["qwen35moe"].MTP_TRAINABLE and not REGISTRY["qwen3next"].MTP_TRAINABLE


@pytest.mark.parametrize("kv", [KVTypes("f16", "f16"), KVTypes("q8_0", "q8_0"), KVTypes("f16", "q8_0")],
                         ids=lambda kv: f"{kv.k}-{kv.v}")
def test_kv_types_keep_windows_exact(tmp_path_factory, kv):
    """For each stored KV type: a window's rows equal plain steps bitwise whatever their neighbours, commit(keep)
    leaves what `keep` steps leave, and the logits are the stored type's (not float32's)."""
    path = tmp_path_factory.getbasetemp() / "tiny_hd32.gguf"
    if not path.exists():
        write_tiny_model(path, arch="llama", n_experts=4, top_k=2, qtype="Q8_0", head_dim=32, seed=3)
    model = load_model(str(path))
    P = 4

    def steps(seq, kv):
        st = model.new_state(64, kv)
        rows = []
        for t in seq:
            rows.append(model.forward([t], st)[0])
            st.commit(1)
        return np.stack(rows)

    plain = steps(SEQ, kv)
    assert not np.array_equal(plain, steps(SEQ, KVTypes()))
    rng = np.random.default_rng(2)
    for T in (2, 5, 8):
        for keep in (1, T // 2, T):
            st = model.new_state(64, kv)
            model.forward(SEQ[:P], st)
            st.commit(P)
            win = model.forward(SEQ[P : P + T], st)
            assert np.array_equal(win, plain[P : P + T]), (T, keep)
            st.commit(keep)
            nxt = model.forward(SEQ[P + keep : P + keep + 2], st)
            assert np.array_equal(nxt, plain[P + keep : P + keep + 2]), (T, keep)
        st = model.new_state(64, kv)
        model.forward(SEQ[:P], st)
        st.commit(P)
        other = np.concatenate([SEQ[P : P + 1], rng.integers(0, 256, T - 1)])
        assert np.array_equal(model.forward(other, st)[0], plain[P]), T  # row 0 beside other rows
