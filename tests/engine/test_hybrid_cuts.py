"""A generation that ends inside a drafted window on a hybrid Gated-DeltaNet model (a stop string or a cancel,
EOS, max_tokens) leaves the KV cache, the recurrent state and the conv history bitwise where plain decoding
leaves them, for every weight type a tiny hybrid can be written in and every cut position of windows of
T = 2..8, so the next turn's logits are bitwise plain decoding's (docs/contracts.md "Window"). The weight types
run one thread each: about a minute here in all, most of it the 256-weight-block types.
"""

import numpy as np
import pytest

from guild.engine.sampling import SamplingParams
from guild.engine.session import GuildSession
from guild.load import load
from guild.models import load_model
from guild.text.chat import Conversation
from guild.tools.tiny_hybrid import write_tiny_hybrid
from tests.helpers.drafters import OracleDrafter
from tests.helpers.tiny_hybrids import QTYPES, TINY, qtype_kwargs

pytestmark = pytest.mark.slow

PROMPT = [5, 77, 12, 200, 31, 9, 150, 64, 3, 99]
NEXT = [17, 260, 42, 7, 120]  # the next turn's tokens
N = 17  # the plain run: the prefill's token, then two windows of 8
CTX = 64
# greedy, every token of the history penalised out: the stream never repeats a token, so EOS can end it anywhere
DISTINCT = SamplingParams(presence_penalty=100.0)


@pytest.fixture(scope="module", params=QTYPES)
def hybrid(request, tmp_path_factory):
    path = tmp_path_factory.mktemp("cuts") / f"{request.param}.gguf"
    write_tiny_hybrid(path, arch="qwen35moe", seed=5, **qtype_kwargs(request.param))
    return load_model(str(path))


def _carried(s: GuildSession) -> tuple:
    """What a session carries into its next turn: position, recurrent state, conv history, KV cache."""
    st = s.state
    return st.pos, st.S[:, st.cur].copy(), st.conv.copy(), st.kv.k.copy(), st.kv.v.copy()


def _same(a: tuple, b: tuple) -> bool:
    return a[0] == b[0] and all(np.array_equal(x, y) for x, y in zip(a[1:], b[1:], strict=True))


class _Plain:
    """Plain decoding that ends after e tokens: its tokens, carried state and next-turn logits, per e."""

    def __init__(self, model):
        self.model, self.runs = model, {}

    def __call__(self, e: int):
        if e not in self.runs:
            s = GuildSession(self.model, n_ctx=CTX)
            out, st = s.generate(PROMPT, e, sampling=DISTINCT)
            assert len(out) == e and {w.k for w in st.windows} <= {0}
            self.runs[e] = out, _carried(s), s.prefill(NEXT)
        return self.runs[e]


def _cut(model, truth, T: int, e: int, kind: str):
    """A run drafting the true continuation in windows of T that ends at its e-th token by `kind`."""
    kw = dict(sampling=DISTINCT, drafter=OracleDrafter(len(PROMPT), truth), max_draft=T - 1)
    if kind == "max_tokens":
        s = GuildSession(model, n_ctx=CTX)
        return s, *s.generate(PROMPT, e, **kw)
    if kind == "eos":
        s = GuildSession(model, n_ctx=CTX, eos_ids=[truth[e - 1]])
        return s, *s.generate(PROMPT, N, **kw)
    s = GuildSession(model, n_ctx=CTX)  # a stop string or a cancel: on_token says so at the e-th token
    seen = []
    return s, *s.generate(PROMPT, N, lambda t: seen.append(t) or len(seen) == e, **kw)


def test_every_cut_leaves_the_plain_state(hybrid, threads):
    threads(1)  # row invariance makes the thread count irrelevant to the bits; one thread is the fastest here
    plain = _Plain(hybrid)
    truth = plain(N)[0]
    assert len(set(truth)) == N
    for T in range(2, 9):
        for c in range(1, T + 1):  # the generation ends at the token of the window's row c
            e = 1 + T + c  # in the second window: the first was drafted and fully kept
            for kind in ("stop", "eos", "max_tokens"):
                where = f"T={T} cut={c} {kind}"
                s, out, st = _cut(hybrid, truth, T, e, kind)
                assert out == truth[:e] and st.stop_reason == kind, where
                last = st.windows[-1]  # max_tokens crops the last window's drafts to the tokens left
                assert (last.k, last.kept) == ((c - 1, c) if kind == "max_tokens" else (T - 1, c)), where
                assert [(w.k, w.kept) for w in st.windows[:-1]] == [(T - 1, T)], where
                _, carried, nxt = plain(e)
                assert _same(_carried(s), carried), f"{where}: the state differs from plain decoding's"
                assert np.array_equal(s.prefill(NEXT), nxt), f"{where}: the next turn's logits differ"


def test_a_chat_turn_after_a_stop_or_a_cancel_is_plain_decodings(tmp_path, threads):
    """Through the chat layer (the stop string's TextStream, Ctrl-C's cancel) on the tiny qwen35moe: a reply cut
    inside a drafted window leaves plain decoding's state, and the next turn's tokens and state are plain's."""
    threads(1)
    path = tmp_path / "qwen35moe.gguf"
    write_tiny_hybrid(path, **TINY["qwen35moe"])
    lm = load(str(path))
    tok, ask, then = lm.tokenizer, "Tell me about the sea.", "And the sky?"
    prompt = tok.encode(tok.apply_chat_template([{"role": "user", "content": ask}], add_generation_prompt=True),
                        add_special=True)

    def chat(stop=(), cancel_at=0, truth=None):
        conv = Conversation(lm.session(256), tok)
        asked = []
        cancel = (lambda: asked.append(1) or len(asked) == cancel_at) if cancel_at else None
        kw = dict(drafter=OracleDrafter(len(prompt), truth), max_draft=7) if truth else {}
        first = conv.say(ask, 60, stop=stop, cancel=cancel, **kw)
        after_first = _carried(conv.session)
        return first, after_first, conv.say(then, 12), _carried(conv.session)

    whole = chat()[0]
    assert len(whole.tokens) == 60
    stop = next(s for k in range(30, 50) if whole.text.count(s := whole.text[k : k + 2]) == 1 and "\ufffd" not in s)
    for way in (dict(stop=[stop]), dict(cancel_at=36)):
        plain = chat(**way)
        drafted = chat(**way, truth=whole.tokens)
        first = drafted[0]
        assert first.tokens == plain[0].tokens and first.text == plain[0].text, way
        assert first.stats.stop_reason == plain[0].stats.stop_reason, way
        last = first.stats.windows[-1]
        assert last.k == 7 and last.kept < 8 and first.stats.summary()["accepted"] > 0, way  # a drafted cut
        assert _same(drafted[1], plain[1]), f"{way}: the state after the reply differs"
        assert drafted[2].tokens == plain[2].tokens and _same(drafted[3], plain[3]), f"{way}: the next turn"
