"""Stop strings and cut streams: the text ends just before a stop string, every strategy stops at the same
token, and a stream cut mid-character never ends in U+FFFD."""

import codecs

import pytest

from guild.engine.sampling import SamplingParams
from guild.load import load
from guild.speculative.options import DraftOptions
from guild.text.chat import Conversation, Slot, TextStream, run_turn


class _Decoder:
    def __init__(self, pieces):
        self.pieces, self._utf8 = pieces, codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, t):
        return self._utf8.decode(self.pieces[t])

    def flush(self):
        return self._utf8.decode(b"", final=True)

    @property
    def pending(self):
        return bool(self._utf8.getstate()[0])


class _Tok:
    """Token i decodes to PIECES[i] (bytes); 0 is the end-of-generation token."""

    eos_ids = frozenset({0})

    def __init__(self, pieces):
        self.pieces = pieces

    def detokenizer(self):
        return _Decoder(self.pieces)


PIECES = [b"", b"Hello", b" wor", b"ld", b"\n", b"\nEND", b"\xc3", b"\xa9", b"E", b"ND"]


def _feed(ids, stop=()):
    sent = []
    ts = TextStream(_Tok(PIECES), sent.append, stop)
    stopped_at = next((i for i, t in enumerate(ids) if ts.push(t)), None)
    return ts.finish(), sent, stopped_at


def test_cut_at_the_stop_string():
    text, sent, at = _feed([1, 2, 3, 4, 5, 2, 3], stop=["\n\nEND"])
    assert (text, at) == ("Hello world", 4) and "".join(sent) == text
    # a stop string split over tokens: its prefix is held back, never sent
    text, sent, at = _feed([1, 4, 8, 9, 2], stop=["\nEND"])
    assert (text, at) == ("Hello", 3) and sent == ["Hello"]


def test_prefix_that_never_completes_is_sent_at_the_end():
    text, sent, at = _feed([1, 4, 8, 2], stop=["\nEND"])
    assert at is None and text == "Hello\nE wor"
    assert sent == ["Hello", "\nE wor"]  # "\nE" was held until it could no longer begin the stop string


def test_earliest_of_several_stops_wins():
    text, _, at = _feed([1, 2, 3, 4, 5], stop=["ld", "wor"])
    assert (text, at) == ("Hello ", 1)


def test_no_replacement_character_at_a_cut():
    text, sent, _ = _feed([1, 6])  # "Hello" then the first byte of "é": the generation ends mid-character
    assert text == "Hello" and "\ufffd" not in "".join(sent)
    text, _, _ = _feed([1, 6, 7])
    assert text == "Helloé"


def test_eos_adds_no_text():
    text, _, at = _feed([1, 0], stop=["x"])
    assert (text, at) == ("Hello", None)


# -- on the embedded MoE: every strategy stops at the same token -----------------------------------------------
PROMPT = "List the days of the week, one per line."


@pytest.fixture(scope="module")
def lm(moe_path):
    return load(moe_path)


def _turn(lm, strategy, stop=(), sampling=SamplingParams(), n=48):
    conv = Conversation(lm.session(1024), lm.tokenizer)
    d = lm.drafter(DraftOptions(strategy=strategy), 1024)
    return conv, conv.say(PROMPT, n, stop=stop, sampling=sampling, drafter=d, max_draft=4)


@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(temperature=0.8, seed=7)],
                         ids=["greedy", "sampled"])
def test_strategies_stop_at_the_same_token(lm, sampling):
    _, plain = _turn(lm, "normal", sampling=sampling)
    text = plain.text
    assert len(text) > 20, text
    stop = text[len(text) // 2 : len(text) // 2 + 3]  # a stop string from the middle of the reply
    want_text = text[: text.index(stop)]
    ref = None
    for strategy in ("normal", "lookup", "retrieval", "mtp", "adaptive"):
        conv, t = _turn(lm, strategy, stop=[stop], sampling=sampling)
        assert t.text == want_text and t.stats.stop_reason == "stop", strategy
        assert t.tokens == plain.tokens[: len(t.tokens)], strategy
        ref = ref or t.tokens
        assert t.tokens == ref, strategy
        s = conv.session
        assert s.state.pos == len(s.tokens) - 1  # nothing past the stop token stays in the cache
        assert conv.messages[-1] == {"role": "assistant", "content": want_text}


def test_next_turn_after_a_stop_is_exact(lm):
    """A turn after a stopped one equals the same turn on a fresh conversation with the same history."""
    _, plain = _turn(lm, "normal")
    stop = plain.text[10:13]
    conv, _ = _turn(lm, "lookup", stop=[stop])
    again = conv.say("Thanks. And the months?", 16)
    fresh = Conversation(lm.session(1024), lm.tokenizer)
    fresh.messages = conv.messages[:2]
    ref = fresh.say("Thanks. And the months?", 16)
    assert again.tokens == ref.tokens


def test_concurrent_slots_stop_like_solo(lm):
    _, plain = _turn(lm, "normal")
    stop = plain.text[len(plain.text) // 2 :][:3]
    slots = [Slot(Conversation(lm.session(1024), lm.tokenizer), lm.drafter(DraftOptions(strategy=s), 1024),
                  SamplingParams()) for s in ("normal", "adaptive")]
    turns, _ = run_turn(slots, PROMPT, chat=True, max_tokens=48, max_draft=4, stop=[stop])
    _, solo = _turn(lm, "normal", stop=[stop])
    for t in turns:
        assert t.tokens == solo.tokens and t.text == solo.text
