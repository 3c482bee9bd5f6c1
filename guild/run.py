"""`guild run`: load a model (path or tag), set up a session and its drafter, decode one prompt or a whole
conversation, stream text, return stats."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .chat import Conversation, Turn, stream_text
from .errors import BadFlagError
from .gguf import GGUFFile
from .models import load_model
from .sampling import GREEDY, SamplingParams
from .session import GuildSession
from .spec import make_drafter
from .tokenizer import Tokenizer
from .upcycle import resolve_model


def set_threads(threads: int | None) -> int:
    """Numba worker threads for the kernels (None = all cores); returns the count in use."""
    import numba

    if threads is not None:
        if not 1 <= threads <= numba.config.NUMBA_NUM_THREADS:
            raise BadFlagError(f"--threads must be in 1..{numba.config.NUMBA_NUM_THREADS}, got {threads}")
        numba.set_num_threads(threads)
    return numba.get_num_threads()


@dataclass
class Loaded:
    path: str
    gguf: GGUFFile
    model: object
    tokenizer: Tokenizer
    load_s: float


def load(model: str | None) -> Loaded:
    t0 = time.perf_counter()
    path = str(resolve_model(model))
    g = GGUFFile(path)
    tok = Tokenizer.from_metadata(g.metadata)
    m = load_model(g)
    return Loaded(path, g, m, tok, time.perf_counter() - t0)


@dataclass(frozen=True)
class DecodeOptions:
    """How `guild run` decodes: strategy and its knobs, sampling, limits."""

    strategy: str = "normal"
    max_draft: int = 4
    min_match: int = 3
    lookup_window: int = 65536
    corpus: tuple[str, ...] = ()  # documents the retrieval drafter ingests
    sampling: SamplingParams = GREEDY
    max_tokens: int = 128
    context: int = 4096
    prefill_batch: int = 512

    def __post_init__(self):
        if self.context < 16:
            raise BadFlagError(f"--context must be >= 16, got {self.context}")
        if self.max_tokens < 1:
            raise BadFlagError(f"--max-tokens must be >= 1, got {self.max_tokens}")
        if self.prefill_batch < 1:
            raise BadFlagError(f"--prefill-batch must be >= 1, got {self.prefill_batch}")
        if not 0 <= self.max_draft <= 7:
            raise BadFlagError(f"--spec-max-draft must be in 0..7, got {self.max_draft}")
        if self.corpus and self.strategy != "retrieval":
            raise BadFlagError("--retrieval-corpus needs --decode-strategy retrieval")
        for f in self.corpus:
            if not Path(f).is_file():
                raise BadFlagError(f"--retrieval-corpus: no such file: {f}")


@dataclass
class RunResult:
    turns: list[Turn]
    model: str
    threads: int
    load_s: float
    options: DecodeOptions = field(default_factory=DecodeOptions)

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
                "strategy": self.options.strategy, "seed": self.options.sampling.seed}
        turns = [{"text": t.text, "tokens": t.tokens, **t.stats.as_dict()} for t in self.turns]
        return {**head, **turns[0]} if len(turns) == 1 else {**head, "turns": turns}


def _slot(lm: Loaded, opts: DecodeOptions):
    """A session with its own drafter (corpus ingested) and conversation."""
    drafter = make_drafter(opts.strategy, min_match=opts.min_match, lookup_window=opts.lookup_window)
    for f in opts.corpus:
        drafter.ingest(lm.tokenizer.encode(Path(f).read_text(errors="replace")))
    s = GuildSession(lm.model, n_ctx=opts.context, prefill_batch=opts.prefill_batch, eos_ids=lm.tokenizer.eos_ids)
    return Conversation(s, lm.tokenizer), drafter


class Runner:
    """A loaded model with one session and its drafter: one-shot prompts or a multi-turn conversation."""

    def __init__(self, model: str | None, opts: DecodeOptions, threads: int | None = None):
        self.opts = opts
        self.threads = set_threads(threads)
        make_drafter(opts.strategy, min_match=opts.min_match, lookup_window=opts.lookup_window)  # flags first
        self.lm = load(model)
        self.conversation, self.drafter = _slot(self.lm, opts)
        self.session = self.conversation.session

    def _kw(self) -> dict:
        o = self.opts
        return dict(sampling=o.sampling, drafter=self.drafter, max_draft=o.max_draft)

    def say(self, text: str, on_text: Callable[[str], None] | None = None) -> Turn:
        """One chat turn (the chat template, history kept)."""
        return self.conversation.say(text, self.opts.max_tokens, on_text, **self._kw())

    def complete(self, text: str, on_text: Callable[[str], None] | None = None) -> Turn:
        """Raw completion of `text` (no template), continuing whatever the session holds."""
        tok = self.lm.tokenizer
        ids = tok.encode(text, add_special=not self.session.tokens)
        on_token, finish = stream_text(tok, on_text)
        out, stats = self.session.generate(ids, self.opts.max_tokens, on_token, **self._kw())
        return Turn(finish(), out, stats)

    def result(self, turns: list[Turn]) -> RunResult:
        return RunResult(turns, self.lm.path, self.threads, self.lm.load_s, self.opts)


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
        turns.append(r.say(p, on_text) if chat else r.complete(p, on_text))
    return r.result(turns)


def run_sessions(model: str | None, prompts: Sequence[str], n: int, *, chat: bool = False,
                 opts: DecodeOptions = DecodeOptions(), threads: int | None = None) -> dict:
    """`--sessions N`: N sessions run the same turns concurrently, each with its own cache, drafter and
    sampling seed (seed + i), batched into one forward per round. Returns texts per session and the rounds."""
    from dataclasses import replace

    from .session import generate_concurrent

    if not 1 <= n <= 8:
        raise BadFlagError(f"--sessions must be in 1..8, got {n}")
    if not prompts:
        raise BadFlagError("no prompt: give -p/--prompt or --conversation")
    n_threads = set_threads(threads)
    make_drafter(opts.strategy, min_match=opts.min_match, lookup_window=opts.lookup_window)  # flags first
    lm = load(model)
    slots = [(*_slot(lm, opts), replace(opts.sampling, seed=(opts.sampling.seed + i) % 2**64)) for i in range(n)]
    tok = lm.tokenizer
    texts: list[list[str]] = [[] for _ in range(n)]
    turns = []
    for p in prompts:
        reqs = []
        for c, d, samp in slots:
            ids = c.prepare(p) if chat else tok.encode(p, add_special=not c.session.tokens)
            reqs.append((c.session, dict(prompt=ids, max_tokens=opts.max_tokens, sampling=samp, drafter=d,
                                         max_draft=opts.max_draft)))
        results, cs = generate_concurrent(reqs)
        for i, ((c, _, _), (out, _)) in enumerate(zip(slots, results, strict=True)):
            text = tok.decode([t for t in out if t not in tok.eos_ids])
            texts[i].append(text)
            if chat:
                c.record(text)
        turns.append({"sessions": [{"tokens": out, **st.as_dict()} for out, st in results], **cs.as_dict()})
    return {"model": lm.path, "threads": n_threads, "strategy": opts.strategy, "sessions": n,
            "texts": texts, "turns": turns}
