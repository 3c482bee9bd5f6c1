"""A decode row's or a verification window's every layer in one compiled call (guild/models/decode_step.py,
llama.WHOLE_STEP): each step's and window's logits, the rows an MTP head fuses and the distinct experts bitwise /
equal to the op-by-op path's, in every KV cache type, with layers whose q|k|v differ in parts (a real Q4_K_M
file's Q6_K values), windows whose expert groups split unevenly over the threads (the two-launch experts) and
evenly (one region); the one call is what ran, and a window it cannot take (two sessions, more than
GEMV_MAX_ROWS rows) takes the per-layer path."""

import numba
import numpy as np
import pytest

import guild.models.decode_step as decode_step
import guild.models.llama as llama
from guild.engine.backends.linear import Linear
from guild.formats.repack_cache import pack
from guild.kvtypes import KVTypes
from guild.models import load_model
from guild.tools.tiny import write_tiny_model

pytestmark = pytest.mark.filterwarnings("error::numba.NumbaWarning")

MODELS = {
    "qwen3moe": dict(arch="qwen3moe", qtype="Q8_0", n_layers=3, dim=256, n_heads=8, n_kv_heads=2, head_dim=64,
                     n_experts=4, top_k=2, ffn=128),
    "llama": dict(arch="llama", qtype="Q8_0", n_layers=3, dim=192, n_heads=3, n_kv_heads=1, ffn=256),
}
PROMPT = [5, 77, 12, 200, 31, 9, 150, 64, 3, 99, 18]


def _split_qkv(m, li: int) -> None:
    """Layer li's q|k|v as three packed matrices (as where the value matrix has another type), the rest fused."""
    L = m.layers[li]
    lin = object.__new__(Linear)
    lin.tensors, lin.n_out, lin.n_in = L.qkv.tensors, L.qkv.n_out, L.qkv.n_in
    lin.parts = [pack(t.qtype, t.data, t.shape[0], t.shape[1]) for t in lin.tensors]
    L.qkv = lin
    m.layers = list(m.layers)  # a new list: the stacked tables are rebuilt


@pytest.fixture(scope="module", params=list(MODELS))
def model(request, tmp_path_factory):
    path = tmp_path_factory.mktemp("step") / "m.gguf"
    write_tiny_model(path, seed=7, **MODELS[request.param])
    m = load_model(str(path))
    _split_qkv(m, 1)
    m.mtp_features = (0, 2)  # the rows a fused MTP head reads
    return request.param, m


SIZES = (1, 2, 3, 1, 5, 8, 1, 4)  # decode steps and windows, each committing part of its rows


def _decode(m, kv: str):
    st = m.new_state(96, KVTypes(kv, kv))
    m.forward(PROMPT, st)
    st.commit(len(PROMPT))
    rng = np.random.default_rng(3)
    rows, feats, distinct = [], [], []
    for T in SIZES:
        r = m.forward_batch([(rng.integers(0, 300, T), st)])[0]
        st.commit(int(rng.integers(1, T + 1)))
        rows.append(r.logits.copy())
        feats.append(np.stack([np.asarray(f) for f in r.features]))
        distinct.append(np.array(r.distinct_experts))
    return rows, feats, distinct


@pytest.mark.parametrize("kv", ["f32", "f16", "q8_0"])
def test_the_whole_step_is_the_op_by_op_step(model, kv, monkeypatch, threads):
    name, m = model
    threads(min(2, numba.config.NUMBA_NUM_THREADS))
    ran = []
    for fn in ("moe_layers", "dense_layers"):
        inner = getattr(decode_step, fn)
        monkeypatch.setattr(decode_step, fn, lambda *a, _inner=inner, _fn=fn: ran.append(_fn) or _inner(*a))
    monkeypatch.setattr(llama, "FUSED_ROW", False)
    want = _decode(m, kv)
    assert ran == []
    monkeypatch.setattr(llama, "FUSED_ROW", True)
    got = _decode(m, kv)
    assert ran == ["moe_layers" if name == "qwen3moe" else "dense_layers"] * len(SIZES)
    assert [len(t) for t in m._decode_step.attn[1]] == [3, 3, 3]  # one fused part, padded; the split layer's three
    for g, w, T in zip(got[0], want[0], SIZES, strict=True):
        assert g.shape[0] == T and np.array_equal(g.view(np.uint32), w.view(np.uint32))
    for g, w, T in zip(got[1], want[1], SIZES, strict=True):
        assert g.shape == (2, T, m.args.dim) and np.array_equal(g.view(np.uint32), w.view(np.uint32))
    assert all(np.array_equal(g, w) for g, w in zip(got[2], want[2], strict=True))
    if name == "qwen3moe":  # 4 experts, top 2: windows of 2+ rows route to 3 groups (uneven over 2 threads) or 4
        assert {int(d.max()) for d in got[2]} >= {2, 3, 4}


def test_a_long_window_takes_the_per_layer_path(model, monkeypatch):
    """More rows than GEMV_MAX_ROWS (a prompt chunk): not a verification window, layer by layer."""
    _, m = model
    step = decode_step.DecodeStep.of(m)
    inner = step.run
    ran = []
    monkeypatch.setattr(step, "run", lambda *a: ran.append(inner(*a)) or ran[-1])
    st = m.new_state(64)
    m.forward(list(range(9)), st)
    assert ran == [False]


def test_two_sessions_take_the_per_layer_path(model, monkeypatch):
    """Two sessions' rows are not one window: forward_batch runs them layer by layer, each session's logits bitwise
    its own single-session step's (which took the one call)."""
    _, m = model
    ran = []
    step = decode_step.DecodeStep.of(m)
    inner = step.run
    monkeypatch.setattr(step, "run", lambda *a: ran.append(inner(*a)) or ran[-1])
    sts = [m.new_state(64) for _ in range(2)]
    for st, p in zip(sts, (PROMPT, PROMPT[::-1]), strict=True):
        m.forward(p, st)
        st.commit(len(p))
    ran.clear()
    alone = []
    for st in sts:
        alone.append(m.forward([7], st)[-1].copy())
        st.commit(0)  # the window dropped: the same position again below
    both = m.forward_batch([([7], sts[0]), ([7], sts[1])])
    assert ran == [True, True, False]
    for r, a in zip(both, alone, strict=True):
        assert np.array_equal(r.logits[-1].view(np.uint32), a.view(np.uint32))
