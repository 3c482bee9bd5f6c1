"""Real drafters on the embedded MoE model: token-ID parity with plain decoding, greedy and seeded sampling."""

import pytest

from guild.engine.sampling import SamplingParams
from guild.engine.session import GuildSession
from guild.load import load
from guild.speculative.build import make_drafter
from guild.text.chat import Conversation

DOC = (
    "Python was created in the early 1990s by Guido van Rossum at Stichting Mathematisch Centrum in the "
    "Netherlands as a successor of a language called ABC. In 1995, Guido continued his work on Python at the "
    "Corporation for National Research Initiatives in Reston, Virginia, where he released several versions of "
    "the software. In May 2000, Guido and the Python core development team moved to BeOpen.com to form the "
    "BeOpen PythonLabs team. In 2001, the Python Software Foundation was formed, a non-profit organization "
    "created specifically to own Python-related Intellectual Property."
)
PROMPT = "Repeat the first two sentences of this text word for word, then summarise the rest.\n\n" + DOC
SAMPLED = SamplingParams(temperature=0.7, top_k=40, top_p=0.9, min_p=0.05, seed=12345, repeat_penalty=1.05)


@pytest.fixture(scope="module")
def lm(moe_path):
    return load(moe_path)


@pytest.fixture(scope="module")
def plain(lm):
    """Plain decoding's tokens per sampling, decoded once for the module: every parity test compares to them."""
    runs = {}

    def of(sampling):
        if sampling not in runs:
            runs[sampling] = _say(lm, "normal", sampling)[0]
        return runs[sampling]

    return of


def _say(lm, strategy, sampling, k=4, n=48, corpus=(), clock=None):
    s = GuildSession(lm.model, n_ctx=1024, eos_ids=lm.tokenizer.eos_ids)
    d = make_drafter(strategy)
    if clock is not None and strategy == "adaptive":  # its choices then rest on acceptance, not on this machine's load
        d.clock = clock
    for text in corpus:
        d.ingest(lm.tokenizer.encode(text))
    t = Conversation(s, lm.tokenizer).say(PROMPT, n, sampling=sampling, drafter=d, max_draft=k)
    return t.tokens, t.stats.summary()


@pytest.mark.parametrize("sampling", [SamplingParams(), SAMPLED], ids=["greedy", "sampled"])
@pytest.mark.parametrize("strategy", ["lookup", "retrieval", "adaptive"])
def test_parity_with_plain(lm, plain, strategy, sampling, fixed_clock):
    for k in (2, 4, 7):
        got, summ = _say(lm, strategy, sampling, k=k, corpus=[DOC] if strategy != "lookup" else (), clock=fixed_clock)
        assert got == plain(sampling), f"{strategy} k={k}"
        if sampling.greedy and k == 4:
            assert summ["accepted"] > 0  # the copy task gives the drafter something to find


def test_min_match_two(lm, plain):
    s = GuildSession(lm.model, n_ctx=1024, eos_ids=lm.tokenizer.eos_ids)
    d = make_drafter("lookup", min_match=2)
    t = Conversation(s, lm.tokenizer).say(PROMPT, 48, drafter=d, max_draft=3)
    assert t.tokens == plain(SamplingParams())
