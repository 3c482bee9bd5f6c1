"""A decode row's every layer in one compiled call (guild/models/decode_step.py, llama.WHOLE_STEP): each step's
logits, the rows an MTP head fuses and the distinct experts bitwise / equal to the op-by-op path's, in every KV
cache type, with layers whose q|k|v differ in parts (a real Q4_K_M file's Q6_K values); the one call is what ran,
and a window it cannot take (two sessions) takes the per-layer path."""

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


def _decode(m, kv: str, steps: int = 5):
    st = m.new_state(64, KVTypes(kv, kv))
    tok = int(np.argmax(m.forward(PROMPT, st)[-1]))
    st.commit(len(PROMPT))
    rows, feats, distinct = [], [], []
    for _ in range(steps):
        r = m.forward_batch([([tok], st)])[0]
        st.commit(1)
        rows.append(r.logits[-1].copy())
        feats.append(np.concatenate([np.asarray(f) for f in r.features]))
        distinct.append(np.array(r.distinct_experts))
        tok = int(np.argmax(r.logits[-1]))
    return np.stack(rows), np.stack(feats), np.stack(distinct)


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
    assert ran == ["moe_layers" if name == "qwen3moe" else "dense_layers"] * 5
    assert [len(t) for t in m._decode_step.attn[1]] == [3, 3, 3]  # one fused part, padded; the split layer's three
    assert np.array_equal(got[0].view(np.uint32), want[0].view(np.uint32))
    assert got[1].shape == (5, 2, m.args.dim) and np.array_equal(got[1].view(np.uint32), want[1].view(np.uint32))
    assert np.array_equal(got[2], want[2])


def test_two_sessions_take_the_per_layer_path(model, monkeypatch):
    """A window of two sessions' rows is not one decode row: forward_batch runs it layer by layer, each session's
    logits bitwise its own single-session step's (which took the one call)."""
    _, m = model
    ran = []
    step = decode_step.DecodeStep.of(m)
    inner = step.run
    monkeypatch.setattr(step, "run", lambda *a: ran.append(inner(*a)) or ran[-1])
    sts = [m.new_state(64) for _ in range(2)]
    for st, p in zip(sts, (PROMPT, PROMPT[::-1]), strict=True):
        m.forward(p, st)
        st.commit(len(p))
    alone = []
    for st in sts:
        alone.append(m.forward([7], st)[-1].copy())
        st.commit(0)  # the window dropped: the same position again below
    assert ran == [True, True]
    both = m.forward_batch([([7], sts[0]), ([7], sts[1])])
    for r, a in zip(both, alone, strict=True):
        assert np.array_equal(r.logits[-1].view(np.uint32), a.view(np.uint32))
