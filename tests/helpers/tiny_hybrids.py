"""Tiny hybrid Gated-DeltaNet MoE models (qwen3next, qwen35moe) shared by their tests and the llama.cpp oracle,
and the two ways those tests read logits: window by window, and held to a tolerance with equal argmax."""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType

from guild.kernels.blocks import QK_K
from guild.kernels.cpu import quant
from guild.kernels.quant_types import BLOCK
from guild.models import load_model
from guild.tools.tiny import SUPPORTED_QTYPES
from guild.tools.tiny_hybrid import write_tiny_hybrid

# name -> write_tiny_hybrid kwargs
TINY = {
    "qwen3next": dict(arch="qwen3next", seed=1),
    "qwen35moe": dict(arch="qwen35moe", seed=2),
    "qwen3next-ssm_in": dict(arch="qwen3next", legacy_ssm_in=True, seed=3),  # the older single ssm_in layout
    "qwen35moe-q8": dict(arch="qwen35moe", qtype="Q8_0", seed=4, tied=True, n_layers=6,
                         full_attention_interval=3, ssm_v_heads=6, shared_ffn=64),
    "qwen3next-copy": dict(arch="qwen3next", seed=1, copy_bias=3.3),  # mostly repeats what it generated once
}
TOKENS = (5, 300, 17, 260, 99, 261, 42, 7, 317, 128, 64, 270)

# every weight type a tiny hybrid can be written in and guild runs (the tiny writer's types that have kernels)
QTYPES = tuple(q for q in SUPPORTED_QTYPES if GGMLQuantizationType[q] in BLOCK)


def qtype_kwargs(qtype: str) -> dict:
    """write_tiny_hybrid kwargs for `qtype` weights: every matrix row a whole number of the type's blocks (rows
    of 256 weights make a larger model: two layers, one of each kind, and four experts keep it quick)."""
    if BLOCK[GGMLQuantizationType[qtype]][0] == QK_K:
        return dict(qtype=qtype, dim=256, ffn=256, head_dim=64, expert_ffn=256, shared_ffn=256, ssm_head_dim=64,
                    n_layers=2, full_attention_interval=2, n_experts=4)
    return dict(qtype=qtype, shared_ffn=64)


def tiny_hybrids(root):
    """A getter: tiny(name, numerics="i8") -> (path, model), each written under `root` and loaded once."""
    cache: dict[tuple[str, str], tuple] = {}

    def get(name: str, numerics: str = "i8"):
        if (name, numerics) not in cache:
            path = root / f"{name}.gguf"
            if not path.exists():
                write_tiny_hybrid(path, **TINY[name])
            with quant.numerics(numerics):
                cache[(name, numerics)] = (str(path), load_model(str(path)))
        return cache[(name, numerics)]

    return get


def window_logits(model, tokens, windows, rollback=None):
    """Logits of `tokens` fed in windows of the given sizes, each committed whole."""
    st = model.new_state(max(64, len(tokens)), rollback=rollback)
    rows, i = [], 0
    for w in windows:
        rows.append(model.forward(np.asarray(tokens[i : i + w], np.int64), st))
        st.commit(w)
        i += w
    return np.concatenate(rows).astype(np.float64)


def assert_close(got, want, max_abs, what=""):
    d = np.abs(got - want)
    assert d.max() <= max_abs, f"{what}: max |Δlogit| {d.max():.3g} > {max_abs:.3g}"
    assert np.array_equal(got.argmax(1), want.argmax(1)), what
