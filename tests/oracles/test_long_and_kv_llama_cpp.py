"""Past 1K positions and over f16 / q8_0 KV caches: guild's logits against llama.cpp (and HF transformers) on tiny
F32 models (dim 128: head size 32, whole q8_0 blocks), every position compared.

Long inputs (F32 KV cache, llama.cpp without flash attention, HF eager float32), 1600 positions: measured max |Δ|
3.4e-5 (max |logit| 8.7), growing with the position (3e-6 at 0, 1e-5 at 1599 in the row maxima). Bound: the tiny
F32 oracles' 1e-4 * max|logit| (tests/oracles/test_oracles.py): an attention output is a float32 chain over L
weighted values, its rounding grows like sqrt(L) u for random rounding (about 12x from 12 to 1600 positions:
5e-6 -> 6e-5), inside the bound; rope slipping one position from 1024 on moves the logits far past it.

Typed KV caches, 200 positions, llama.cpp with flash attention (its quantised V needs it) and the same types.
Where the numbers differ: ggml's CPU flash attention converts each query row to the key type's dot type (f16 for
an f16 K: 2^-11 relative per element; Q8_0 for a q8_0 K: max|q| / 254 per element of each 32-block) before the
score dot products, and rounds its V accumulation to f16 for an f16 V; guild keeps queries, scores and sums in
float32 over the same stored keys and values (its q8_0 rows are ggml's own quants: test_ggml_quantizers.py).
A score then moves by up to scale * sum_i |Δq_i k_i|: ~5e-4 S for f16 K, ~4e-3 S for q8_0 K (S = scale * sum |q_i
k_i|), the q8_0 one as large as the K cache's own quantisation error. Measured (llama / qwen3), max |Δ|, mean:
  f16/f16 1.2e-4 / 4.8e-4, 6.7e-6 / 2.8e-5;  f16/q8_0 0.015 / 0.008, 6e-4;  q8_0/q8_0 0.057 / 0.056, 7.3e-3 / 6.6e-3;
  q8_0/f16 0.066 / 0.055, 7.1e-3 / 6.5e-3  (max |logit| ~8-9).
Bounds, about 2-3x those: an f16 K 1.5e-3 / 1e-4 with an f16 V, 0.04 / 2e-3 with a q8_0 V; a q8_0 K 0.15 / 0.02;
top-1 equal wherever llama.cpp's top-2 gap exceeds twice the max bound.
The f16-K bounds reject guild's float32 cache against llama.cpp's f16 one (max 3e-3, mean 3.5e-4) and K and V
types swapped (0.076, 9e-3); the q8_0-K bounds cannot tell a q8_0 K from a float32 one (0.10, 0.011: llama.cpp's
query quantisation is as large as the cache's), so guild's q8_0 rows are held to ggml's bitwise in
tests/oracles/test_ggml_quantizers.py and its attention over them in tests/kernels/ops/test_attention_long.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from guild.bench.runners import open_llama_cpp
from guild.kvtypes import KVTypes
from guild.models import load_model
from guild.tools.tiny import write_tiny_model
from tests.helpers.optional import installed
from tests.oracles.test_oracles import assert_close, guild_logits, hf_model_from_gguf, llama_cpp_logits

pytestmark = pytest.mark.oracle

LONG = tuple((i * 37 + 5) % 317 for i in range(1600))
LONG_WINDOWS = ((1600,), (1536, 1, 7, 56))  # one prefill; a prefill, then decode rows and a window past 1536
SHORT = LONG[:200]
GGML_TYPE = {"f32": 0, "f16": 1, "q8_0": 8}
KV_BOUNDS = {
    ("f16", "f16"): dict(max_abs=1.5e-3, mean_abs=1e-4, argmax_margin=3e-3),
    ("f16", "q8_0"): dict(max_abs=0.04, mean_abs=2e-3, argmax_margin=0.08),
    ("q8_0", "q8_0"): dict(max_abs=0.15, mean_abs=0.02, argmax_margin=0.3),
    ("q8_0", "f16"): dict(max_abs=0.15, mean_abs=0.02, argmax_margin=0.3),
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("long_kv")
    return {a: str(write_tiny_model(root / a / "m.gguf", arch=a, seed=3, dim=128, context=2048))
            for a in ("llama", "qwen3")}


def llama_cpp_typed(path: str, tokens, kt: str, vt: str) -> np.ndarray:
    installed("llama_cpp")
    llm = open_llama_cpp(path, logits_all=True, n_ctx=max(64, len(tokens)), n_threads=2, type_k=GGML_TYPE[kt],
                         type_v=GGML_TYPE[vt], flash_attn=True)
    try:
        llm.eval(list(tokens))
        out = np.array(llm.scores[: len(tokens)], dtype=np.float64)
    finally:
        llm.close()
    assert np.isfinite(out).all()
    return out


def rope_slipped_at_1024(model):
    """The model with rope tables whose rows from 1024 on hold the previous position's angles."""
    cos, sin = model.cos.copy(), model.sin.copy()
    cos[1024:], sin[1024:] = model.cos[1023:-1], model.sin[1023:-1]
    model.cos, model.sin = cos, sin
    model.__dict__.pop("_layout", None)  # the host layout is rebuilt from these tables
    return model


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_long_input_matches_llama_cpp(tiny, arch):
    ref = llama_cpp_logits(tiny[arch], LONG)
    tol = 1e-4 * np.abs(ref).max()
    model = load_model(tiny[arch])
    for w in LONG_WINDOWS:
        assert_close(guild_logits(model, LONG, w), ref, max_abs=tol, what=f"{arch} 1600 positions, windows {w[:3]}")
    with pytest.raises(AssertionError):
        assert_close(guild_logits(rope_slipped_at_1024(load_model(tiny[arch])), LONG, (1600,)), ref, max_abs=tol)


def test_long_input_matches_transformers(tiny):
    torch = installed("torch")
    hf = hf_model_from_gguf(tiny["qwen3"])
    with torch.no_grad():
        ref = hf(torch.tensor([LONG]), use_cache=False).logits[0].double().numpy()
    assert_close(guild_logits(load_model(tiny["qwen3"]), LONG, (1600,)), ref, max_abs=1e-4 * np.abs(ref).max(),
                 what="qwen3 1600 positions vs transformers")


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
@pytest.mark.parametrize("kt, vt", list(KV_BOUNDS))
def test_typed_kv_cache_matches_llama_cpp(tiny, arch, kt, vt):
    ref = llama_cpp_typed(tiny[arch], SHORT, kt, vt)
    model = load_model(tiny[arch])
    for w in ((200,), (150, 1, 7, 42)):
        assert_close(guild_logits(model, SHORT, w, KVTypes(kt, vt)), ref, **KV_BOUNDS[(kt, vt)],
                     what=f"{arch} K {kt} V {vt}, windows {w}")


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
@pytest.mark.parametrize("ref_kv, bad_kv", [(("f16", "f16"), ("f32", "f32")), (("f16", "q8_0"), ("q8_0", "f16"))])
def test_typed_kv_bounds_reject_the_wrong_types(tiny, arch, ref_kv, bad_kv):
    """The bounds above reject guild's float32 cache where llama.cpp's is f16, and K and V types swapped."""
    ref = llama_cpp_typed(tiny[arch], SHORT, *ref_kv)
    got = guild_logits(load_model(tiny[arch]), SHORT, (200,), KVTypes(*bad_kv))
    with pytest.raises(AssertionError):
        assert_close(got, ref, **KV_BOUNDS[ref_kv])
