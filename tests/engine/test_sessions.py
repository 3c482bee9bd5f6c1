"""Concurrent sessions batched into one forward per round: each session's tokens equal its solo run."""

import numpy as np
import pytest

from guild.engine.sampling import SamplingParams
from guild.engine.session import GuildSession, generate_concurrent
from guild.load import load
from guild.speculative.build import make_drafter

pytestmark = pytest.mark.slow

PROMPTS = [
    "Summarise: The Python Software Foundation was formed in 2001 to own Python-related intellectual property. "
    "The Python Software Foundation is a non-profit organization.",
    "Write a haiku about the sea.",
    "List the first five prime numbers and explain why 1 is not prime.",
]
SAMPLED = SamplingParams(temperature=0.8, top_k=40, top_p=0.9, seed=99, repeat_penalty=1.1)


@pytest.fixture(scope="module")
def lm(moe_path):
    return load(moe_path)


def _req(lm, i, strategy, sampling, n=20):
    tok = lm.tokenizer
    s = GuildSession(lm.model, n_ctx=512, eos_ids=tok.eos_ids)
    ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": PROMPTS[i]}]), add_special=True)
    return s, dict(prompt=ids, max_tokens=n, sampling=sampling, drafter=make_drafter(strategy), max_draft=4)


@pytest.mark.parametrize("sampling", [SamplingParams(), SAMPLED], ids=["greedy", "sampled"])
@pytest.mark.parametrize("strategies", [("normal", "lookup"), ("lookup", "retrieval", "adaptive")])
def test_concurrent_equals_solo(lm, strategies, sampling):
    solo = []
    for i, strat in enumerate(strategies):
        s, kw = _req(lm, i, strat, sampling)
        solo.append(s.generate(kw.pop("prompt"), kw.pop("max_tokens"), **kw)[0])
    results, cs = generate_concurrent([_req(lm, i, strat, sampling) for i, strat in enumerate(strategies)])
    for (toks, _), want in zip(results, solo, strict=True):
        assert toks == want
    assert cs.generated_tokens == sum(len(t) - 1 for t in solo)
    assert len(cs.rounds_ms) == max(len(st.windows) for _, st in results)


def test_forward_batch_rows_equal_solo(lm):
    m = lm.model
    a, b = m.new_state(64), m.new_state(64)
    m.forward([5, 6, 7], a)
    a.commit(3)
    la, lb = (r.logits for r in m.forward_batch([([8, 9], a), ([10, 11, 12], b)]))
    a2, b2 = m.new_state(64), m.new_state(64)
    m.forward([5, 6, 7], a2)
    a2.commit(3)
    assert np.array_equal(la, m.forward([8, 9], a2)) and np.array_equal(lb, m.forward([10, 11, 12], b2))


def test_cli_sessions_json(lm):
    import json
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "guild", "run", "smollm2-135m", "--chat", "-p", "Say hi.",
                        "--sessions", "2", "-n", "8", "--json"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["sessions"] == 2 and len(out["texts"]) == 2 and out["texts"][0] == out["texts"][1]  # greedy
    assert out["turns"][0]["aggregate_tok_s"] > 0
