"""The hybrid Gated-DeltaNet MoE forward (qwen3next, qwen35moe) against llama.cpp on the same tiny GGUF files,
and planted bugs that this comparison must catch."""

from __future__ import annotations

import numpy as np
import pytest

from guild.formats.gguf import GGUFFile
from tests.helpers.optional import installed
from tests.helpers.tiny_hybrids import TOKENS, assert_close, tiny_hybrids, window_logits

pytestmark = pytest.mark.oracle


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """tiny(name) -> (path, model), written and loaded once per module."""
    return tiny_hybrids(tmp_path_factory.mktemp("hybrid"))


def _llama_cpp_logits(path: str, tokens) -> np.ndarray:
    installed("llama_cpp")
    from guild.bench.runners import open_llama_cpp

    # the pinned llama-cpp-python (make setup-oracle) runs both architectures: failing to load them is a failure
    llm = open_llama_cpp(path, logits_all=True, n_ctx=64, n_threads=2, type_k=0, type_v=0, flash_attn=False)
    try:
        llm.eval(list(tokens))
        return np.array(llm.scores[: len(tokens)], dtype=np.float64)
    finally:
        llm.close()


@pytest.fixture(scope="module")
def llama_cpp_ref(tiny):
    cache: dict[str, np.ndarray] = {}

    def get(name: str) -> np.ndarray:
        if name not in cache:
            cache[name] = _llama_cpp_logits(tiny(name)[0], TOKENS)
        return cache[name]

    return get


@pytest.mark.parametrize("name", ["qwen3next", "qwen35moe", "qwen3next-ssm_in"])
def test_llama_cpp_oracle(name, tiny, llama_cpp_ref):
    """F32 weights and KV cache: the same file run by llama.cpp (its converter's layout, its graph)."""
    want = llama_cpp_ref(name)
    _, model = tiny(name)
    for windows in ((12,), (1, 4, 7), (8, 4)):
        # measured max |Δ| <= 2.1e-5 (max|logit| ~ 7-8); the planted bugs below give 0.60 .. 9.6
        assert_close(window_logits(model, TOKENS, windows), want, 1e-4 * np.abs(want).max(),
               f"{name} vs llama.cpp, windows {windows}")


@pytest.mark.parametrize("name, bug", [
    ("qwen35moe", dict(V_TILED=False)),  # value heads read grouped instead of tiled key heads
    ("qwen3next", dict(V_TILED=True)),
    ("qwen35moe", dict(rope_dim=32)),  # full instead of partial rope
    ("qwen3next", dict(norm_topk_prob=False)),
])
def test_llama_cpp_oracle_rejects_planted_bugs(name, bug, tiny, llama_cpp_ref):
    want = llama_cpp_ref(name)
    path, model = tiny(name)
    cls = type(model)
    if "V_TILED" in bug:
        cls = type("Planted", (cls,), bug)
        bug = {}
    got = window_logits(cls.from_gguf(GGUFFile(path), **bug), TOKENS, (12,))
    with pytest.raises(AssertionError):
        assert_close(got, want, 1e-4 * np.abs(want).max(), f"{name} with a planted bug")
