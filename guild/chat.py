"""Multi-turn chat over one session: the KV cache, the token history and the drafters persist across turns.

Each turn renders the whole conversation with the chat template, feeds only what the session does not hold
yet (after the longest common prefix of token ids; a differently tokenised tail is rewound), and generates.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .engine.sampling import SamplingParams
from .engine.session import ConcurrentStats, GenerationStats, GuildSession, generate_concurrent
from .spec import Drafter
from .tokenizer import Tokenizer


@dataclass
class Turn:
    text: str
    tokens: list[int]
    stats: GenerationStats


class TextStream:
    """The text of one generation as its tokens are emitted (`push` is the session's on_token). Held back until
    safe: bytes of an incomplete UTF-8 character (dropped if the generation ends mid-character, never shown as
    U+FFFD) and a tail that could begin a stop string. When a stop string appears, the text ends just before it
    and `push` returns True, which ends the generation at that token for every strategy alike."""

    def __init__(self, tok: Tokenizer, on_text: Callable[[str], None] | None = None, stop: Sequence[str] = ()):
        self._detok, self._eos, self._on_text = tok.detokenizer(), tok.eos_ids, on_text
        self.stop = tuple(s for s in stop if s)
        self.text = ""  # complete characters decoded so far (cut before a stop string once one appears)
        self._sent = 0  # characters of text already handed to on_text
        self.stopped = False

    def push(self, t: int) -> bool:
        if self.stopped:
            return True
        if t in self._eos:
            return False
        self.text += self._detok.push(t)
        if self.stop:
            # text before _sent holds no prefix of a stop string (it was held back), so matches start after it
            hits = [i for s in self.stop if (i := self.text.find(s, self._sent)) >= 0]
            if hits:
                self.text = self.text[: min(hits)]
                self.stopped = True
                self._send(len(self.text))
                return True
        self._send(len(self.text) - self._partial_stop())
        return False

    def finish(self) -> str:
        """The whole text; sends what was held back (a stop string's prefix that never completed)."""
        if not self.stopped and not self._detok.pending:
            self.text += self._detok.flush()
        self._send(len(self.text))
        return self.text

    def _partial_stop(self) -> int:
        """Length of the longest unsent tail of text that is a proper prefix of a stop string."""
        tail = self.text[self._sent :]
        for n in range(min(len(tail), max((len(s) for s in self.stop), default=1) - 1), 0, -1):
            if any(s.startswith(tail[-n:]) for s in self.stop):
                return n
        return 0

    def _send(self, upto: int) -> None:
        if upto > self._sent:
            if self._on_text is not None:
                self._on_text(self.text[self._sent : upto])
            self._sent = upto


class Conversation:
    def __init__(self, session: GuildSession, tokenizer: Tokenizer):
        self.session, self.tok = session, tokenizer
        self.messages: list[dict] = []

    def prepare(self, text: str) -> list[int]:
        """Add a user turn; returns the prompt ids the session still has to be fed (rewinding any tail that
        the full rendering tokenises differently)."""
        msgs = [*self.messages, {"role": "user", "content": text}]
        full = self.tok.encode(self.tok.apply_chat_template(msgs, add_generation_prompt=True), add_special=True)
        held = self.session.tokens
        n = 0
        for a, b in zip(held, full, strict=False):
            if a != b:
                break
            n += 1
        if n < len(held):
            self.session.rewind(n)
        self.messages = msgs
        return full[n:]

    def record(self, reply: str) -> None:
        self.messages = [*self.messages, {"role": "assistant", "content": reply}]

    def say(self, text: str, max_tokens: int, on_text: Callable[[str], None] | None = None, *,
            stop: Sequence[str] = (), **generate_kw) -> Turn:
        """One chat turn on this conversation (the chat template, history kept)."""
        return self._turn(self.prepare(text), True, max_tokens, TextStream(self.tok, on_text, stop), generate_kw)

    def complete(self, text: str, max_tokens: int, on_text: Callable[[str], None] | None = None, *,
                 stop: Sequence[str] = (), **generate_kw) -> Turn:
        """Raw completion of `text` (no template), continuing whatever the session holds."""
        ids = self.tok.encode(text, add_special=not self.session.tokens)
        return self._turn(ids, False, max_tokens, TextStream(self.tok, on_text, stop), generate_kw)

    def _turn(self, prompt: list[int], chat: bool, max_tokens: int, stream: TextStream, generate_kw: dict) -> Turn:
        out, stats = self.session.generate(prompt, max_tokens, stream.push, **generate_kw)
        reply = stream.finish()
        if chat:
            self.record(reply)
        return Turn(reply, out, stats)


@dataclass
class Slot:
    """One session of a run: its conversation, drafter and sampling."""

    conversation: Conversation
    drafter: Drafter
    sampling: SamplingParams


def run_turn(slots: Sequence[Slot], text: str, *, chat: bool, max_tokens: int, max_draft: int,
             on_text: Callable[[str], None] | None = None,
             stop: Sequence[str] = ()) -> tuple[list[Turn], ConcurrentStats | None]:
    """The turn loop of every command: `text` as the next turn of each slot's conversation (the chat template
    when `chat`, else a raw completion), ending at any of the `stop` strings. One slot streams through
    `on_text`; several run concurrently, one batched forward per round (ConcurrentStats)."""
    if len(slots) == 1:
        s = slots[0]
        conv, kw = s.conversation, dict(sampling=s.sampling, drafter=s.drafter, max_draft=max_draft, stop=stop)
        t = conv.say(text, max_tokens, on_text, **kw) if chat else conv.complete(text, max_tokens, on_text, **kw)
        return [t], None
    reqs, streams = [], []
    for s in slots:
        c = s.conversation
        ids = c.prepare(text) if chat else c.tok.encode(text, add_special=not c.session.tokens)
        streams.append(TextStream(c.tok, None, stop))
        reqs.append((c.session, dict(prompt=ids, max_tokens=max_tokens, on_token=streams[-1].push,
                                     sampling=s.sampling, drafter=s.drafter, max_draft=max_draft)))
    results, cs = generate_concurrent(reqs)
    turns = []
    for s, stream, (out, st) in zip(slots, streams, results, strict=True):
        reply = stream.finish()
        if chat:
            s.conversation.record(reply)
        turns.append(Turn(reply, out, st))
    return turns, cs
