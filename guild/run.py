"""`guild run`: decode one prompt or a whole conversation on a loaded model (guild.load), stream text, return
stats; `--sessions N` runs N copies concurrently."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from .chat import Conversation, Slot, Turn, run_turn
from .errors import BadFlagError
from .load import LoadedModel, load
from .options import DecodeOptions

__all__ = ["DecodeOptions", "RunResult", "Runner", "run", "run_sessions", "slots", "write_trace"]

@dataclass
class RunResult:
    turns: list[Turn]
    model: str
    threads: int
    load_s: float
    options: DecodeOptions = field(default_factory=DecodeOptions)
    device: str = "cpu"
    mtp_head: str | None = None  # the MTP head file drafting used (mtp, adaptive)
    device_reason: str = ""  # why the CPU runs it when --device auto did not take the GPU

    @property
    def text(self) -> str:
        return self.turns[-1].text

    @property
    def tokens(self) -> list[int]:
        return self.turns[-1].tokens

    @property
    def stats(self):
        return self.turns[-1].stats

    def as_dict(self) -> dict:
        head = {"model": self.model, "threads": self.threads, "load_s": round(self.load_s, 3),
                "strategy": self.options.strategy, "seed": self.options.sampling.seed, "device": self.device,
                "device_reason": self.device_reason, "mtp_head": self.mtp_head}
        turns = [{"text": t.text, "tokens": t.tokens, **t.stats.as_dict()} for t in self.turns]
        return {**head, **turns[0]} if len(turns) == 1 else {**head, "turns": turns}


def load_for(model: str | None, opts: DecodeOptions, threads: int | None = None) -> LoadedModel:
    """The model as `opts` wants it: its plan (--gexec), threads, device and MTP head options."""
    return load(model, opts.gexec, threads, opts.device, opts.mtp, context=opts.context, strict_plan=opts.strict_plan)


def slots(lm: LoadedModel, opts: DecodeOptions, n: int = 1, corpus_texts=()) -> list[Slot]:
    """n sessions, each with its own cache, drafter (corpus ingested) and sampling seed (seed + i)."""
    out = []
    for i in range(n):
        conv = Conversation(lm.session(opts.context, opts.prefill_batch), lm.tokenizer)
        out.append(Slot(conv, lm.drafter(opts, opts.context, corpus_texts),
                        replace(opts.sampling, seed=(opts.sampling.seed + i) % 2**64)))
    return out


class Runner:
    """A loaded model with one session and its drafter: one-shot prompts or a multi-turn conversation."""

    def __init__(self, model: str | None, opts: DecodeOptions, threads: int | None = None):
        self.opts = opts
        self.lm = load_for(model, opts, threads)
        self.plan, self.threads = self.lm.plan, self.lm.threads
        self.slot = slots(self.lm, opts)[0]
        self.conversation, self.drafter, self.session = self.slot.conversation, self.slot.drafter, \
            self.slot.conversation.session

    def turn(self, text: str, chat: bool, on_text: Callable[[str], None] | None = None) -> Turn:
        """One turn: a chat turn (the chat template, history kept) or a raw completion of `text`."""
        o = self.opts
        return run_turn([self.slot], text, chat=chat, max_tokens=o.max_tokens, max_draft=o.max_draft,
                        on_text=on_text)[0][0]

    def say(self, text: str, on_text: Callable[[str], None] | None = None) -> Turn:
        return self.turn(text, True, on_text)

    def complete(self, text: str, on_text: Callable[[str], None] | None = None) -> Turn:
        return self.turn(text, False, on_text)

    def result(self, turns: list[Turn]) -> RunResult:
        head = self.lm.mtp_head(self.opts.strategy)
        return RunResult(turns, self.lm.path, self.threads, self.lm.load_s, self.opts, self.lm.device,
                         head.info.source if head is not None else None, self.lm.device_reason)


def run(model: str | None, prompts: Sequence[str], *, chat: bool = False, opts: DecodeOptions = DecodeOptions(),
        threads: int | None = None, on_text: Callable[[str], None] | None = None,
        on_turn: Callable[[int, str], None] | None = None) -> RunResult:
    """Decode each prompt in turn on one session (several prompts = a conversation when chat is set)."""
    if not prompts:
        raise BadFlagError("no prompt: give -p/--prompt or --conversation")
    r = Runner(model, opts, threads)
    turns = []
    for i, p in enumerate(prompts):
        if on_turn is not None:
            on_turn(i, p)
        turns.append(r.turn(p, chat, on_text))
    return r.result(turns)


def run_sessions(model: str | None, prompts: Sequence[str], *, chat: bool = False,
                 opts: DecodeOptions = DecodeOptions(), threads: int | None = None) -> dict:
    """`--sessions N`: N sessions run the same turns concurrently, each with its own cache, drafter and
    sampling seed (seed + i), batched into one forward per round. Returns texts per session and the rounds."""
    if not prompts:
        raise BadFlagError("no prompt: give -p/--prompt or --conversation")
    lm = load_for(model, opts, threads)
    ss = slots(lm, opts, opts.sessions)
    texts: list[list[str]] = [[] for _ in ss]
    turns = []
    for p in prompts:
        res, cs = run_turn(ss, p, chat=chat, max_tokens=opts.max_tokens, max_draft=opts.max_draft)
        for i, t in enumerate(res):
            texts[i].append(t.text)
        turns.append({"sessions": [{"tokens": t.tokens, **t.stats.as_dict()} for t in res], **cs.as_dict()})
    return {"model": lm.path, "threads": lm.threads, "strategy": opts.strategy, "sessions": len(ss),
            "device": lm.device, "device_reason": lm.device_reason, "texts": texts, "turns": turns}


def write_trace(path: str | Path, turns: Sequence[Turn], session: int | None = None) -> None:
    """`--trace FILE`: one JSON line per window (strategy, k, measured ms, kept, emitted, distinct experts, and
    the adaptive scheduler's candidates with predicted ms/token and its choice)."""
    with open(path, "a") as f:
        for i, t in enumerate(turns):
            for j, w in enumerate(t.stats.windows):
                rec = {"turn": i + 1, "window": j, **({"session": session} if session is not None else {}),
                       **asdict(w), "decision": w.decision.as_dict() if w.decision else None}
                rec["draft_ms"], rec["verify_ms"] = round(w.draft_ms, 4), round(w.verify_ms, 4)
                f.write(json.dumps(rec) + "\n")
