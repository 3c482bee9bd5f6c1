"""A decode row's layer in one compiled call per half (Layout.attention_row, ffn_row, moe_row; llama.FUSED_ROW):
every step's logits bitwise those of the op-by-op path, in every KV cache type, and the one-call path is what ran."""

import numba
import numpy as np
import pytest

import guild.engine.backends.layout as layout
import guild.models.llama as llama
from guild.kvtypes import KVTypes
from guild.models import load_model
from guild.tools.tiny import write_tiny_model

# a compiled function Numba cannot cache would compile again in every process: fail where it warns so
pytestmark = pytest.mark.filterwarnings("error::numba.NumbaWarning")

# shapes whose every matrix is whole tiles of 64 rows: QK-norm, NEOX rope, heads in fours (qwen3moe); a dense
# llama, heads in threes
MODELS = {
    "qwen3moe": dict(arch="qwen3moe", qtype="Q8_0", dim=256, n_heads=8, n_kv_heads=2, head_dim=64, n_experts=4, top_k=2,
                     ffn=128),
    "llama": dict(arch="llama", qtype="Q8_0", dim=192, n_heads=3, n_kv_heads=1, ffn=256),
}
PROMPT = [5, 77, 12, 200, 31, 9, 150, 64, 3, 99, 18]


@pytest.fixture(scope="module", params=list(MODELS))
def model(request, tmp_path_factory):
    path = tmp_path_factory.mktemp("row") / "m.gguf"
    write_tiny_model(path, seed=5, **MODELS[request.param])
    return request.param, load_model(str(path))


def _decode(m, kv: str, steps: int = 6) -> np.ndarray:
    st = m.new_state(64, KVTypes(kv, kv))
    tok = int(np.argmax(m.forward(PROMPT, st)[-1]))
    st.commit(len(PROMPT))
    rows = []
    for _ in range(steps):
        lg = m.forward([tok], st)
        st.commit(1)
        rows.append(lg[-1].copy())
        tok = int(np.argmax(lg[-1]))
    return np.stack(rows)


@pytest.mark.parametrize("kv", ["f32", "f16", "q8_0"])
def test_one_call_row_is_the_op_by_op_row(model, kv, monkeypatch, threads):
    name, m = model
    threads(min(2, numba.config.NUMBA_NUM_THREADS))  # top_k = 2 groups split evenly: the MoE row's one call
    ran = {"attention_half": 0, "ffn_half": 0, "moe_residual_row": 0}
    for fn in ran:
        inner = getattr(layout, fn)

        def counted(*a, _inner=inner, _fn=fn):
            r = _inner(*a)
            ran[_fn] += r is not False
            return r

        monkeypatch.setattr(layout, fn, counted)
    monkeypatch.setattr(llama, "WHOLE_STEP", False)  # the halves a layer at a time (test_decode_step.py: all at once)
    monkeypatch.setattr(llama, "FUSED_ROW", False)
    want = _decode(m, kv)
    assert not any(ran.values())
    monkeypatch.setattr(llama, "FUSED_ROW", True)
    got = _decode(m, kv)
    layers = m.args.n_layers * 6
    assert ran == {"attention_half": layers, "ffn_half": 0 if name == "qwen3moe" else layers,
                   "moe_residual_row": layers if name == "qwen3moe" else 0}
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
