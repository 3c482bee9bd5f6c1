"""Multi-turn chat over one session: the KV cache, the token history and the drafters persist across turns.

Each turn renders the whole conversation with the chat template, feeds only what the session does not hold
yet (after the longest common prefix of token ids; a differently tokenised tail is rewound), and generates.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..engine.sampling import SamplingParams
from ..engine.session import ConcurrentStats, GenerationStats, GuildSession, generate_concurrent
from ..errors import ChatTemplateError, ContextOverflowError, GuildError
from ..speculative.base import Drafter
from .grammar import Grammar, constraint
from .inputs import read_text_file
from .tokenizer import Tokenizer

MAX_TEMPLATE_BYTES = 2**20  # a chat template file (--chat-template): real ones are a few KiB


@dataclass
class Turn:
    text: str
    tokens: list[int]
    stats: GenerationStats
    prompt_ids: list[int] = field(default_factory=list)  # the ids this turn fed the session (after the cached prefix)
    ttft_s: float = 0.0  # from the turn's start (templating included) to its first token
    dropped: int = 0  # oldest turns dropped so that this one fit the context
    system: str | None = None  # the system prompt this turn was answered under (chat turns)


class TextStream:
    """The text of one generation as its tokens are emitted (`push` is the session's on_token). Held back until
    safe: bytes of an incomplete UTF-8 character (dropped if the generation ends mid-character, never shown as
    U+FFFD) and a tail that could begin a stop string. When a stop string appears, the text ends just before it
    and `push` returns True, which ends the generation at that token for every strategy alike."""

    def __init__(self, tok: Tokenizer, on_text: Callable[[str], None] | None = None, stop: Sequence[str] = (),
                 cancel: Callable[[], bool] | None = None):
        self._detok, self._eos, self._on_text = tok.detokenizer(), tok.eos_ids, on_text
        self.stop = tuple(s for s in stop if s)
        self.cancel = cancel  # asked at every token: True ends the generation there (Ctrl-C in a chat)
        self.text = ""  # complete characters decoded so far (cut before a stop string once one appears)
        self._sent = 0  # characters of text already handed to on_text
        self.stopped = False
        self.cancelled = False
        self.t_first: float | None = None  # perf_counter() at the first token

    def push(self, t: int) -> bool:
        if self.t_first is None:
            self.t_first = time.perf_counter()
        if self.stopped:
            return True
        if self.cancel is not None and self.cancel():
            self.stopped = self.cancelled = True
            self._send(len(self.text))
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
    """The messages of one chat (a system prompt first when there is one) over one session. When the next turn
    does not fit the context, the oldest turns are dropped (the system prompt kept) and the cache is rebuilt
    from what is kept: `dropped` says how many turns the last `prepare` dropped."""

    def __init__(self, session: GuildSession, tokenizer: Tokenizer, system: str | None = None):
        self.session, self.tok = session, tokenizer
        self.messages: list[dict] = []
        self.dropped = 0
        self.on_drop: Callable[[int, int, int], None] | None = None  # (turns dropped, tokens kept, context)
        if system:
            self.system = system

    @property
    def system(self) -> str | None:
        m = self.messages
        return m[0]["content"] if m and m[0]["role"] == "system" else None

    @system.setter
    def system(self, text: str | None) -> None:
        """Set (or with None/"" remove) the system prompt; the cache is rewound at the next turn."""
        rest = self.messages[1:] if self.system is not None else self.messages
        self.messages = ([{"role": "system", "content": text}] if text else []) + rest

    def clear(self) -> None:
        """Forget every turn (the system prompt stays)."""
        self.messages = self.messages[:1] if self.system is not None else []

    def load(self, messages: Sequence[dict]) -> None:
        """Replace the conversation (role/content messages; the cache follows at the next turn)."""
        self.messages = [dict(role=m["role"], content=m["content"]) for m in messages]

    def _ids(self, msgs: Sequence[dict]) -> list[int]:
        return self.tok.encode(self.tok.apply_chat_template(msgs, add_generation_prompt=True), add_special=True)

    def prepare(self, text: str, reserve: int = 0, drop_oldest: bool = True) -> list[int]:
        """Add a user turn; returns the prompt ids the session still has to be fed (rewinding any tail that
        the full rendering tokenises differently). While the rendering plus `reserve` reply tokens does not fit
        the context, the oldest turn (a user message and its replies) is dropped (unless not `drop_oldest`); the
        system prompt and the new message are always kept (too long: ContextOverflowError, nothing changed)."""
        msgs = [*self.messages, {"role": "user", "content": text}]
        full = self._ids(msgs)
        n_ctx, self.dropped = self.session.n_ctx, 0
        reserve = max(1, min(reserve, n_ctx // 2))
        while drop_oldest and len(full) + reserve > n_ctx:
            first = 1 if msgs[0]["role"] == "system" else 0
            nxt = next((j for j in range(first + 1, len(msgs)) if msgs[j]["role"] == "user"), None)
            if nxt is None:  # only the new message is left after the system prompt
                break
            msgs = msgs[:first] + msgs[nxt:]
            self.dropped += 1
            full = self._ids(msgs)
        if len(full) >= n_ctx:
            raise ContextOverflowError(
                f"the message ({len(full)} tokens with the chat template"
                + (" and the system prompt" if msgs[0]["role"] == "system" else "")
                + f") does not fit the context of {n_ctx} tokens", n_ctx)
        if self.dropped and self.on_drop is not None:
            self.on_drop(self.dropped, len(full), n_ctx)
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
            stop: Sequence[str] = (), cancel: Callable[[], bool] | None = None, **generate_kw) -> Turn:
        """One chat turn on this conversation (the chat template, history kept, oldest turns dropped when the
        context is full). `cancel()` is asked at every token: True ends the reply there (stop_reason
        "interrupted"; the partial reply is kept in the history)."""
        t0 = time.perf_counter()
        ids = self.prepare(text, max_tokens)
        stream = TextStream(self.tok, on_text, stop, cancel)
        return self._turn(ids, True, max_tokens, stream, generate_kw, t0)

    def complete(self, text: str, max_tokens: int, on_text: Callable[[str], None] | None = None, *,
                 stop: Sequence[str] = (), cancel: Callable[[], bool] | None = None, **generate_kw) -> Turn:
        """Raw completion of `text` (no template), continuing whatever the session holds."""
        t0 = time.perf_counter()
        self.dropped = 0
        ids = self.tok.encode(text, add_special=not self.session.tokens)
        return self._turn(ids, False, max_tokens, TextStream(self.tok, on_text, stop, cancel), generate_kw, t0)

    def _turn(self, prompt: list[int], chat: bool, max_tokens: int, stream: TextStream, generate_kw: dict,
              t0: float) -> Turn:
        out, stats = self.session.generate(prompt, max_tokens, stream.push, **generate_kw)
        reply = stream.finish()
        if stream.cancelled:
            stats.stop_reason = "interrupted"
        if chat:
            self.record(reply)
        return Turn(reply, out, stats, list(prompt), _ttft(stream, t0), self.dropped, self.system if chat else None)


@dataclass
class Slot:
    """One session of a run: its conversation, drafter and sampling."""

    conversation: Conversation
    drafter: Drafter
    sampling: SamplingParams
    grammar: Grammar | None = None  # what every reply follows (a fresh matcher per turn)


def drop_note(dropped: int, kept: int, n_ctx: int) -> str:
    """What a chat says when the context filled up (Conversation.on_drop)."""
    turns = "the oldest turn" if dropped == 1 else f"the {dropped} oldest turns"
    return (f"context full ({n_ctx} tokens): dropped {turns}, system prompt kept; the KV cache is rebuilt from "
            f"the {kept} tokens kept")


def _ttft(stream: TextStream, t0: float) -> float:
    return (stream.t_first - t0) if stream.t_first is not None else 0.0


def run_turn(slots: Sequence[Slot], text: str, *, chat: bool, max_tokens: int, max_draft: int,
             on_text: Callable[[str], None] | None = None, stop: Sequence[str] = (),
             cancel: Callable[[], bool] | None = None) -> tuple[list[Turn], ConcurrentStats | None]:
    """The turn loop of every command: `text` as the next turn of each slot's conversation (the chat template
    when `chat`, else a raw completion), ending at any of the `stop` strings (or when `cancel()` says so). One
    slot streams through `on_text`; several run concurrently, one batched forward per round (ConcurrentStats)."""
    if len(slots) == 1:
        s = slots[0]
        conv = s.conversation
        kw = dict(sampling=s.sampling, drafter=s.drafter, max_draft=max_draft, stop=stop, cancel=cancel,
                  constraint=_constraint(s))
        t = conv.say(text, max_tokens, on_text, **kw) if chat else conv.complete(text, max_tokens, on_text, **kw)
        return [t], None
    t0 = time.perf_counter()
    reqs, streams, prompts = [], [], []
    for s in slots:
        c = s.conversation
        ids = c.prepare(text, max_tokens) if chat else c.tok.encode(text, add_special=not c.session.tokens)
        prompts.append(ids)
        streams.append(TextStream(c.tok, None, stop, cancel))
        reqs.append((c.session, dict(prompt=ids, max_tokens=max_tokens, on_token=streams[-1].push,
                                     sampling=s.sampling, drafter=s.drafter, max_draft=max_draft,
                                     constraint=_constraint(s))))
    results, cs = generate_concurrent(reqs)
    turns = []
    for s, stream, ids, (out, st) in zip(slots, streams, prompts, results, strict=True):
        reply = stream.finish()
        if stream.cancelled:
            st.stop_reason = "interrupted"
        if chat:
            s.conversation.record(reply)
        c = s.conversation
        turns.append(Turn(reply, out, st, list(ids), _ttft(stream, t0), c.dropped if chat else 0,
                          c.system if chat else None))
    return turns, cs


def _constraint(s: Slot):
    return None if s.grammar is None else constraint(s.grammar, s.conversation.tok)


def use_chat_template(tok: Tokenizer, path: str | os.PathLike) -> None:
    """`--chat-template FILE`: the tokenizer renders with this Jinja template instead of the GGUF's, in the same
    sandbox; checked here by rendering a short conversation, which must show its messages' text."""
    source = read_text_file(path, "--chat-template", MAX_TEMPLATE_BYTES)
    old = tok.chat_template, tok._template_cache
    tok.chat_template, tok._template_cache = source, None
    probe = [{"role": "user", "content": "guild-probe-1"}, {"role": "assistant", "content": "guild-probe-2"},
             {"role": "user", "content": "guild-probe-3"}]
    try:
        if not source.strip():
            raise ChatTemplateError("the file is empty")
        out = tok.apply_chat_template(probe, add_generation_prompt=True)
        missing = [m["content"] for m in probe if m["content"] not in out]
        if missing:
            raise ChatTemplateError(f"rendering a conversation does not show its messages ({missing[0]} missing)")
    except GuildError as e:
        tok.chat_template, tok._template_cache = old
        msg = str(e).removeprefix("tokenizer.chat_template: ")
        raise ChatTemplateError(f"--chat-template {path}: {msg}") from None
