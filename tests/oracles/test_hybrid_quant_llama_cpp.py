"""Quantised hybrid Gated-DeltaNet MoE models (qwen3next, qwen35moe) against llama.cpp on the same files, and planted
bugs this comparison must catch.

The files: a tiny F32 hybrid (guild.tools.tiny_hybrid), quantised by llama.cpp itself (llama_model_quantize, the
pinned llama-cpp-python 0.3.36) into Q4_K_M (Q4_K matrices, Q6_K where llama.cpp's mixture puts them) and Q8_0;
routers and norms stay F32. llama.cpp 0.3.36 loads and runs both architectures quantised (a failure to is a
failure here). guild runs them at its default int8 numerics in several window splits, one of them speculative
(rows fed and then rejected: commit(keep) must leave exactly the kept rows' recurrent state).

Why each bound, from the quantisation error. Both sides read the same quantised weights, so the weight error is
not in the difference; what is left is how each multiplies them:
- K-quants. Both quantise a matmul's activations to 8 bits per 256-element block with a float32 scale (ggml's
  q8_K, guild's int8 path: tests/oracles/test_ggml_quantizers.py) and sum integer products exactly, so the two
  agree to float32 rounding of the scales' products and of the float ops around them (norms, DeltaNet, softmax).
  That is the F32 oracle's 1e-4 * max|logit| (test_hybrid_llama_cpp.py). Measured max |Δ| 1.9e-6 (qwen35moe),
  2.4e-6 (qwen3next) with max|logit| ~ 8 - 10, argmax 12/12.
- Q8_0. Activations go to 8 bits per 32-element block on both sides, but where an element sits within a float32
  ulp of a rounding boundary (127 / max|x| against 1 / d: test_ggml_quantizers.py) the sides round it to
  neighbouring integers: an error of one quantisation step d = max|x| / 127 on a few elements per row, below
  1% of the layer's output, mean |Δlogit| a few hundredths. A tiny random MoE magnifies it where two experts'
  router scores are that close: the other expert runs and one row moves by O(1). So the bound is on the mean
  (0.15, about twice the measured 0.048 / 0.070), the max only has to exclude a broken model (2.5: measured
  0.39 / 1.35, the 1.35 one row of qwen3next whose routing flips), and the argmax must agree wherever
  llama.cpp's top-2 gap exceeds 0.5 (the disagreements measured are at gaps 0.13, 0.08, 0.05).
Planted bugs move the max |Δ| far past both: the decay's sign flipped (ssm_a read negated) 4.4 - 7.5, rejected
rows' state kept by commit(keep) (the speculative split; scripts/mutants.py's hybrid-state-not-rolled-back) 2.7 - 7.2.
"""

from __future__ import annotations

import numpy as np
import pytest

from guild.engine.state import HybridState
from guild.models import load_model
from guild.tools.tiny_hybrid import write_tiny_hybrid
from tests.helpers.optional import installed
from tests.helpers.tiny_hybrids import TOKENS, qtype_kwargs, window_logits

pytestmark = pytest.mark.oracle

ARCHS = {"qwen35moe": 2, "qwen3next": 1}  # arch -> seed
FTYPES = ("Q4_K_M", "Q8_0")  # llama.cpp file types (LLAMA_FTYPE_MOSTLY_*)
JUNK = (1, 2, 3)  # drafted tokens that get rejected
SPLITS = ((12,), (1, 4, 7), (8, 4))
SPECULATIVE = ((4, 0), (3, 2), (5, 1))  # (rows kept, rows rejected) per window: 12 kept in all
PROMPT, STEPS = 6, 8  # greedy decoding: TOKENS[:PROMPT], then STEPS tokens
BOUNDS = {
    "Q4_K_M": dict(max_rel=1e-4, mean=None, margin=0.0),
    "Q8_0": dict(max_abs=2.5, mean=0.15, margin=0.5),
}


def _dims(ftype: str) -> dict:
    """Matrices of rows of 256 for the K-quants (llama.cpp falls back to other types for shorter rows)."""
    kw = qtype_kwargs("Q4_K" if ftype.startswith("Q4_K") else "Q8_0")
    kw.pop("qtype")
    return kw


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """files(arch, ftype) -> path of the tiny hybrid quantised by llama.cpp, written once per module."""
    llama_cpp = installed("llama_cpp")
    from guild.bench.runners import quantize

    root = tmp_path_factory.mktemp("hybrid-quant")
    cache: dict[tuple[str, str], str] = {}

    def get(arch: str, ftype: str) -> str:
        if (arch, ftype) not in cache:
            src = write_tiny_hybrid(root / f"{arch}-{ftype}-f32.gguf", arch=arch, seed=ARCHS[arch], **_dims(ftype))
            cache[(arch, ftype)] = str(quantize(llama_cpp, src, root / f"{arch}-{ftype}.gguf", ftype, 2))
        return cache[(arch, ftype)]

    return get


def _open(path: str):
    from guild.bench.runners import open_llama_cpp

    return open_llama_cpp(path, logits_all=True, n_ctx=64, n_threads=2, type_k=0, type_v=0, flash_attn=False)


@pytest.fixture(scope="module")
def oracle(files):
    """oracle(arch, ftype) -> (llama.cpp's logits of TOKENS, its greedy tokens after TOKENS[:PROMPT], and the
    top-2 gap of the logits each greedy token was chosen from)."""
    cache: dict = {}

    def get(arch: str, ftype: str):
        if (arch, ftype) not in cache:
            llm = _open(files(arch, ftype))
            try:
                llm.eval(list(TOKENS))
                logits = np.array(llm.scores[: len(TOKENS)], dtype=np.float64)
            finally:
                llm.close()
            llm = _open(files(arch, ftype))  # a fresh context: nothing of the recurrent state above
            try:
                llm.eval(list(TOKENS[:PROMPT]))
                toks, gaps = [], []
                for _ in range(STEPS):
                    row = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float64)
                    top = np.sort(row)[-2:]
                    toks.append(int(row.argmax()))
                    gaps.append(float(top[1] - top[0]))
                    llm.eval([toks[-1]])
            finally:
                llm.close()
            cache[(arch, ftype)] = logits, toks, gaps
        return cache[(arch, ftype)]

    return get


def speculative_logits(model, tokens, plan=SPECULATIVE) -> np.ndarray:
    """Logits of `tokens` fed as a speculative decoder does: each window the next `kept` tokens and `rejected`
    junk ones after them, committed `kept` (the junk rows' logits dropped)."""
    st = model.new_state(64)
    rows, i = [], 0
    for kept, rejected in plan:
        window = np.asarray((*tokens[i : i + kept], *JUNK[:rejected]), np.int64)
        rows.append(model.forward(window, st)[:kept])
        st.commit(kept)
        i += kept
    assert i == len(tokens)
    return np.concatenate(rows).astype(np.float64)


def greedy(model, prompt, steps: int, forced=None) -> list[int]:
    """guild's greedy choice at each of `steps` decoding steps after `prompt`, one-row windows; fed its own
    choices, or the tokens `forced` (teacher forcing: every step compared however an earlier one went)."""
    st = model.new_state(64)
    out, window = [], np.asarray(prompt, np.int64)
    for i in range(steps):
        logits = model.forward(window, st)
        st.commit(len(window))
        out.append(int(logits[-1].argmax()))
        window = np.asarray([out[-1] if forced is None else forced[i]], np.int64)
    return out


def check(got, want, ftype: str, what: str) -> None:
    """`got` within BOUNDS[ftype] of llama.cpp's `want` (see the module docstring)."""
    b = BOUNDS[ftype]
    d = np.abs(got - want)
    max_abs = b["max_abs"] if "max_abs" in b else b["max_rel"] * np.abs(want).max()
    assert np.isfinite(got).all() and d.max() <= max_abs, f"{what}: max |Δlogit| {d.max():.3g} > {max_abs:.3g}"
    if b["mean"] is not None:
        assert d.mean() <= b["mean"], f"{what}: mean |Δlogit| {d.mean():.3g} > {b['mean']}"
    top = np.sort(want, 1)
    clear = top[:, -1] - top[:, -2] > b["margin"]
    assert np.array_equal(got.argmax(1)[clear], want.argmax(1)[clear]), f"{what}: argmax differs"


@pytest.mark.parametrize("ftype", FTYPES)
@pytest.mark.parametrize("arch", ARCHS)
def test_quantised_hybrid_vs_llama_cpp(arch, ftype, files, oracle):
    want, want_tokens, gaps = oracle(arch, ftype)
    model = load_model(files(arch, ftype))
    for windows in SPLITS:
        check(window_logits(model, TOKENS, windows), want, ftype, f"{arch} {ftype}, windows {windows}")
    check(speculative_logits(model, TOKENS), want, ftype, f"{arch} {ftype}, speculative windows")
    # greedy decoding fed llama.cpp's tokens: the same choice wherever llama.cpp's is clear (every step for the
    # K-quants, whose free-running greedy tokens are then the same too)
    forced = greedy(model, TOKENS[:PROMPT], STEPS, forced=want_tokens)
    clear = [i for i, g in enumerate(gaps) if g > BOUNDS[ftype]["margin"]]
    assert len(clear) >= STEPS // 2, f"{arch} {ftype}: too few clear greedy steps to compare ({gaps})"
    assert [forced[i] for i in clear] == [want_tokens[i] for i in clear], (arch, ftype, forced, want_tokens, gaps)
    if BOUNDS[ftype]["margin"] == 0.0:
        assert greedy(model, TOKENS[:PROMPT], STEPS) == want_tokens


def _negated_decay(model):
    """The planted bug: every DeltaNet layer's ssm_a with its sign flipped (exp(g) > 1: a growing state)."""
    for _, mixer, _ in model.blocks():
        if hasattr(mixer, "a"):
            mixer.a = -mixer.a
    return model


def _keep_rejected_state(monkeypatch):
    """The planted bug of scripts/mutants.py's hybrid-state-not-rolled-back: commit(keep) makes the last row's
    snapshot, rejected rows included, the committed state."""
    commit = HybridState.commit

    def planted(self, keep):
        T = self.pending
        if 1 <= keep < T:
            self.dst = self.dst.copy()
            self.dst[keep - 1] = self.dst[T - 1]
        commit(self, keep)

    monkeypatch.setattr(HybridState, "commit", planted)


@pytest.mark.parametrize("ftype", FTYPES)
@pytest.mark.parametrize("arch", ARCHS)
def test_quantised_bounds_reject_planted_bugs(arch, ftype, files, oracle, monkeypatch):
    want = oracle(arch, ftype)[0]
    path = files(arch, ftype)
    with pytest.raises(AssertionError):
        check(window_logits(_negated_decay(load_model(path)), TOKENS, (12,)), want, ftype, "decay sign flipped")
    model = load_model(path)
    check(speculative_logits(model, TOKENS), want, ftype, "no bug planted yet")
    _keep_rejected_state(monkeypatch)
    with pytest.raises(AssertionError):
        check(speculative_logits(model, TOKENS), want, ftype, "rejected rows' state kept")
