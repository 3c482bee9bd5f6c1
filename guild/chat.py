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


def stream_text(tok: Tokenizer, on_text: Callable[[str], None] | None):
    """(on_token, finish) for a generation: detokenises incrementally, skips end-of-generation tokens."""
    detok = tok.detokenizer()
    pieces: list[str] = []

    def on_token(t: int) -> None:
        if t in tok.eos_ids:
            return
        s = detok.push(t)
        if s:
            pieces.append(s)
            if on_text is not None:
                on_text(s)

    def finish() -> str:
        tail = detok.flush()
        if tail:
            pieces.append(tail)
            if on_text is not None:
                on_text(tail)
        return "".join(pieces)

    return on_token, finish


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

    def say(self, text: str, max_tokens: int, on_text: Callable[[str], None] | None = None, **generate_kw) -> Turn:
        """One chat turn on this conversation (the chat template, history kept)."""
        return self._turn(self.prepare(text), True, max_tokens, on_text, generate_kw)

    def complete(self, text: str, max_tokens: int, on_text: Callable[[str], None] | None = None,
                 **generate_kw) -> Turn:
        """Raw completion of `text` (no template), continuing whatever the session holds."""
        ids = self.tok.encode(text, add_special=not self.session.tokens)
        return self._turn(ids, False, max_tokens, on_text, generate_kw)

    def _turn(self, prompt: list[int], chat: bool, max_tokens: int, on_text, generate_kw: dict) -> Turn:
        on_token, finish = stream_text(self.tok, on_text)
        out, stats = self.session.generate(prompt, max_tokens, on_token, **generate_kw)
        reply = finish()
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
             on_text: Callable[[str], None] | None = None) -> tuple[list[Turn], ConcurrentStats | None]:
    """The turn loop of every command: `text` as the next turn of each slot's conversation (the chat template
    when `chat`, else a raw completion). One slot streams through `on_text`; several run concurrently, one
    batched forward per round (ConcurrentStats)."""
    if len(slots) == 1:
        s = slots[0]
        conv, kw = s.conversation, dict(sampling=s.sampling, drafter=s.drafter, max_draft=max_draft)
        t = conv.say(text, max_tokens, on_text, **kw) if chat else conv.complete(text, max_tokens, on_text, **kw)
        return [t], None
    reqs = []
    for s in slots:
        c = s.conversation
        ids = c.prepare(text) if chat else c.tok.encode(text, add_special=not c.session.tokens)
        reqs.append((c.session, dict(prompt=ids, max_tokens=max_tokens, sampling=s.sampling, drafter=s.drafter,
                                     max_draft=max_draft)))
    results, cs = generate_concurrent(reqs)
    turns = []
    for s, (out, st) in zip(slots, results, strict=True):
        tok = s.conversation.tok
        reply = tok.decode([t for t in out if t not in tok.eos_ids])
        if chat:
            s.conversation.record(reply)
        turns.append(Turn(reply, out, st))
    return turns, cs
