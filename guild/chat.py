"""Multi-turn chat over one session: the KV cache, the token history and the drafters persist across turns.

Each turn renders the whole conversation with the chat template, feeds only what the session does not hold
yet (after the longest common prefix of token ids; a differently tokenised tail is rewound), and generates.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .session import GenerationStats, GuildSession
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
        prompt = self.prepare(text)
        on_token, finish = stream_text(self.tok, on_text)
        out, stats = self.session.generate(prompt, max_tokens, on_token, **generate_kw)
        reply = finish()
        self.record(reply)
        return Turn(reply, out, stats)
