"""GuildSession: one conversation's state and the decode loop.

Prefill the prompt in chunks, then run verification windows [root, d1..dk] until EOS, max_tokens or the
context ends. Drafts come from a drafter (empty = plain step); the Verifier keeps exactly what plain decoding
would have produced. Time is measured here, never inside drafters or the model, and kept per window.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from ..errors import ContextOverflowError, GuildError
from ..kernels.cpu.quant import ROW_INVARIANT_ROWS
from ..kvtypes import F32_KV, KVTypes
from ..speculative.base import Draft, Drafter, NoDrafter
from ..window import MAX_DRAFT, MAX_WINDOW
from .constraint import Constraint
from .forward import ForwardResult
from .sampling import GREEDY, SamplingParams, TokenLogprob
from .verify import Verifier

NO_DRAFT = Draft(np.empty(0, np.int32))  # a window with no room for drafts: the drafter is not asked


@dataclass(frozen=True)
class WindowRecord:
    strategy: str
    k: int  # drafts proposed (after cropping)
    draft_ms: float
    verify_ms: float  # forward of the window + accept rule + commit
    kept: int  # window inputs committed
    emitted: int  # tokens emitted (accepted drafts + 1)
    distinct_experts: tuple[int, ...]  # per layer, union of experts over the window's rows (MoE models)
    decision: object | None = None  # the adaptive scheduler's Decision: candidates and choice (--trace)
    forced: int = 0  # drafts the grammar forced (accepted whatever the logits)
    context: int = 0  # KV positions before the window's first row
    propose_ms: dict | None = None  # per drafter asked (adaptive), its propose time within draft_ms


@dataclass
class GenerationStats:
    prompt_tokens: int = 0
    generated_tokens: int = 0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    stop_reason: str = ""
    windows: list[WindowRecord] = field(default_factory=list)

    @property
    def prefill_tok_s(self) -> float:
        return self.prompt_tokens / self.prefill_s if self.prefill_s else 0.0

    @property
    def decode_tok_s(self) -> float:
        # the first generated token comes from the prefill logits; the rest from the windows
        n = max(self.generated_tokens - 1, 0)
        return n / self.decode_s if self.decode_s and n else 0.0

    @property
    def ms_per_token(self) -> float:
        t = self.decode_tok_s
        return 1000.0 / t if t else 0.0

    def summary(self) -> dict:
        w = self.windows
        drafted = sum(r.k for r in w)
        accepted = sum(r.emitted - 1 for r in w)
        forced = sum(r.forced for r in w)
        by_strategy: dict[str, dict] = {}
        propose: dict[str, float] = {}
        for r in w:
            s = by_strategy.setdefault(r.strategy, {"windows": 0, "tokens": 0, "drafted": 0, "accepted": 0,
                                                    "draft_ms": 0.0, "verify_ms": 0.0})
            s["windows"] += 1
            s["tokens"] += r.emitted
            s["drafted"] += r.k
            s["accepted"] += r.emitted - 1
            s["draft_ms"] += r.draft_ms
            s["verify_ms"] += r.verify_ms
            for name, ms in (r.propose_ms or {}).items():
                propose[name] = propose.get(name, 0.0) + ms
        for s in by_strategy.values():
            s["draft_ms"], s["verify_ms"] = round(s["draft_ms"], 3), round(s["verify_ms"], 3)
        # the scheduler's prediction beside what its windows took (the first, unseeded step predicts nothing)
        judged = [r for r in w if r.decision is not None and r.decision.predicted > 0]
        return {
            "windows": len(w),
            "drafted": drafted,
            "accepted": accepted,
            "acceptance": round(accepted / drafted, 4) if drafted else None,
            "forced": forced,
            "tokens_per_window": round(sum(r.emitted for r in w) / len(w), 3) if w else None,
            "t_histogram": dict(sorted(Counter(r.k + 1 for r in w).items())),
            "strategies": by_strategy,
            **({"propose_ms": {k: round(v, 3) for k, v in propose.items()},
                "rest_windows": sum(r.decision.reason == "rest" for r in judged),
                "predicted_ms_per_token": round(sum(r.decision.predicted * r.emitted for r in judged)
                                                / sum(r.emitted for r in judged), 3),
                "measured_ms_per_token": round(sum(r.draft_ms + r.verify_ms for r in judged)
                                               / sum(r.emitted for r in judged), 3)} if judged else {}),
        }

    def as_dict(self) -> dict:
        d = {k: v for k, v in asdict(self).items() if k != "windows"}
        d.update(
            prefill_tok_s=round(self.prefill_tok_s, 2),
            decode_tok_s=round(self.decode_tok_s, 2),
            ms_per_token=round(self.ms_per_token, 3),
            **self.summary(),
        )
        return d


class GuildSession:
    """Owns a model state (KV cache) and the token history of one conversation."""

    def __init__(self, model, n_ctx: int | None = None, prefill_batch: int = 512, eos_ids: Sequence[int] = (),
                 kv: KVTypes = F32_KV):
        if prefill_batch < 1:
            raise ValueError(f"prefill_batch must be >= 1, got {prefill_batch}")
        self.model = model
        self.state = model.new_state(n_ctx, kv)
        self.prefill_batch = prefill_batch
        self.eos_ids = frozenset(int(i) for i in eos_ids)
        self.tokens: list[int] = []  # every token of the conversation; the first state.pos are in the cache

    @property
    def n_ctx(self) -> int:
        return self.state.n_ctx

    def prefill(self, tokens: Sequence[int], drafter: Drafter | None = None) -> np.ndarray:
        """Append tokens and feed everything not yet in the cache, in chunks of up to prefill_batch rows; a
        drafter that follows the rows gets them. Returns the last row's logits [vocab]."""
        self.append(tokens)
        return self.feed(drafter)

    def append(self, tokens: Sequence[int]) -> None:
        """Append tokens to the conversation without feeding them (`feed` does)."""
        new = [int(t) for t in tokens]
        pending = len(self.tokens) - self.state.pos + len(new)
        if not pending:
            raise GuildError("empty prompt")
        if self.state.pos + pending >= self.n_ctx:
            raise ContextOverflowError(
                f"prompt of {pending} tokens does not fit the context of {self.n_ctx} tokens "
                f"({self.state.pos} already used; at least one generated token must fit)", self.n_ctx
            )
        self.tokens += new

    def feed(self, drafter: Drafter | None = None, max_chunks: int | None = None) -> np.ndarray | None:
        """Feed the tokens not yet in the cache, at most max_chunks chunks of prefill_batch rows (chunked as one
        whole prefill would be, so the rows are the same bits). Returns the last row's logits once every token
        is in, else None."""
        arr = np.asarray(self.tokens[self.state.pos :], np.int64)
        if not arr.size:
            raise GuildError("empty prompt")
        logits = None
        for i, s in enumerate(range(0, arr.size, self.prefill_batch)):
            if max_chunks is not None and i == max_chunks:
                return None
            chunk = arr[s : s + self.prefill_batch]
            pos0 = self.state.pos
            res = self.model.forward_batch([(chunk, self.state)], last_only=True)[0]
            self.state.commit(chunk.size)
            logits = res.logits
            if drafter is not None and drafter.follows_rows:
                drafter.observe_hidden(pos0, res.hidden, res.features)
        return logits[-1]

    def generate(
        self,
        prompt: Sequence[int],
        max_tokens: int,
        on_token: Callable[[int], bool | None] | None = None,
        *,
        sampling: SamplingParams = GREEDY,
        drafter: Drafter | None = None,
        max_draft: int = 4,
        strategy: str | None = None,
        constraint: Constraint | None = None,
    ) -> tuple[list[int], GenerationStats]:
        """Decode up to max_tokens after `prompt`; returns the emitted ids and the stats. `on_token(id)` sees each
        emitted id; returning True ends the generation there (stop_reason "stop"). `constraint`: a grammar the
        emitted tokens follow."""
        g = Generation(self, prompt, max_tokens, on_token, sampling, drafter, max_draft, strategy, constraint)
        while not g.done:
            window = g.window()
            t = time.perf_counter()
            g.finish(self.model.forward_batch([(window, self.state)])[0], t)
        return g.result()

    def rewind(self, n: int) -> None:
        """Keep the first n tokens of the conversation (and of the cache)."""
        self.tokens = self.tokens[:n]
        self.state.truncate(n)



class Generation:
    """One generation in progress on a session: prefilled at construction, then `window()` proposes the next
    verification window and `finish(logits, t_forward_start)` verifies and commits it. Split this way so that
    several sessions' windows can share one batched forward (generate_concurrent). `constraint`: a grammar the
    emitted tokens follow; `logprobs`: None, or how many alternatives each emitted token's TokenLogprob lists."""

    def __init__(self, session: GuildSession, prompt: Sequence[int], max_tokens: int, on_token=None,
                 sampling: SamplingParams = GREEDY, drafter: Drafter | None = None, max_draft: int = 4,
                 strategy: str | None = None, constraint: Constraint | None = None, logprobs: int | None = None,
                 chunked: bool = False):
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        if not 0 <= max_draft <= MAX_DRAFT:
            raise ValueError(f"max_draft must be in 0..{MAX_DRAFT}, got {max_draft}")
        self.s, self.max_tokens, self.on_token, self.max_draft = session, max_tokens, on_token, max_draft
        self.drafter = drafter or NoDrafter()
        self.strategy = strategy or self.drafter.name
        self.sampling = sampling
        self.constraint = constraint
        self.verifier = Verifier(sampling, session.eos_ids, constraint, logprobs)
        self.drafter.observe_constraint(constraint)
        self.logprobs: list[TokenLogprob] = []
        self.st = GenerationStats(prompt_tokens=len(prompt))
        self.out: list[int] = []
        self._pending: tuple | None = None
        self._prompt_start = len(session.tokens)
        session.append(prompt)
        self.prefilling = True
        if not chunked:
            self.prefill_chunk(None)

    def prefill_chunk(self, max_chunks: int | None = 1) -> bool:
        """Feed up to max_chunks prefill chunks (None: all); once the prompt is in, draw the first token.
        Returns whether the prefill is complete. A server interleaves these with other sessions' rounds."""
        s = self.s
        t0 = time.perf_counter()
        logits = s.feed(self.drafter, max_chunks)
        if logits is not None:
            self.drafter.start(s.tokens, self._prompt_start)  # indexes the prompt: counted as prefill
        self.st.prefill_s += time.perf_counter() - t0
        if logits is None:
            return False
        self.prefilling = False
        self.t0 = time.perf_counter()
        first, lp = self.verifier.draw(logits, s.tokens, len(s.tokens))
        if lp is not None:
            self.logprobs.append(lp)
        self.drafter.observe_logits(logits)
        self.st.stop_reason = "stop" if self._emit(first) else self._stop_reason(first)
        return True

    @property
    def done(self) -> bool:
        return bool(self.st.stop_reason)

    def window(self) -> list[int]:
        """[root, d1..dk]: the drafter's draft under the window's one cap, `room` (the remaining tokens, the
        context, max_draft), cut where a grammar refuses it."""
        s = self.s
        room = min(self.max_tokens - len(self.out) - 1, s.n_ctx - s.state.pos - 1, self.max_draft)
        td = time.perf_counter()
        cache = getattr(s.model, "expert_cache", None)
        if cache is not None and room > 0:  # drafts whose rows would read experts from disk cost that much more
            self.drafter.observe_residency(cache.cold_ms(MAX_WINDOW))
        dr = self.drafter.draft(s.tokens, room) if room > 0 else NO_DRAFT
        draft = np.asarray(dr.tokens, np.int64)[:room]
        if self.constraint is not None and len(draft):  # a draft the grammar refuses could never be accepted
            draft = draft[: self.constraint.valid_prefix(draft)]
        window = [s.tokens[-1], *(int(d) for d in draft)]
        self._pending = (window, s.state.pos, (time.perf_counter() - td) * 1e3, dr, min(dr.forced, len(draft)))
        return window

    def finish(self, out: ForwardResult, t_forward: float) -> None:
        """Verify the window's forward (logits [T, vocab]; started at perf_counter() == t_forward), commit."""
        window, pos0, draft_ms, dr, forced = self._pending
        s, d = self.s, self.drafter
        res = self.verifier.verify(out.logits, window, s.tokens, pos0, self.max_tokens - len(self.out))
        emitted, stopped = 0, False
        try:
            for t in res.tokens:
                emitted += 1
                if self._emit(t):
                    stopped = True
                    break
        finally:
            # row j's input precedes emitted token j, so `emitted` rows is what the emitted tokens need: a stop
            # keeps the rows before it through commit (exact on a recurrent state), never a rewind
            s.state.commit(emitted)
        self.logprobs += res.logprobs[:emitted]
        if d.follows_rows:
            d.observe_hidden(pos0, out.hidden[:emitted], tuple(f[:emitted] for f in out.features))
        verify_ms = (time.perf_counter() - t_forward) * 1e3
        k = len(window) - 1
        strategy = (dr.strategy or self.strategy) if k else "normal"
        d.observe(strategy, k, draft_ms, verify_ms, len(res.tokens))  # the adaptive scheduler learns from them
        d.observe_logits(out.logits[res.keep - 1])
        self.st.windows.append(WindowRecord(
            strategy, k, draft_ms, verify_ms, emitted, emitted,
            tuple(int(x) for x in out.distinct_experts), dr.decision, forced, pos0, dr.propose_ms,
        ))
        if stopped:
            self.st.stop_reason = "stop"
        else:
            self.st.stop_reason = res.stop or ("context" if s.state.pos >= s.n_ctx else "")

    def result(self) -> tuple[list[int], GenerationStats]:
        self.st.decode_s = time.perf_counter() - self.t0
        self.st.generated_tokens = len(self.out)
        return self.out, self.st

    def _emit(self, tok: int) -> bool:
        """Append a verified token; True when `on_token` ends the generation at it (a stop string, a cancel)."""
        self.s.tokens.append(tok)
        self.out.append(tok)
        return self.on_token is not None and bool(self.on_token(tok))

    def _stop_reason(self, tok: int) -> str:
        if tok in self.s.eos_ids:
            return "eos"
        if len(self.out) >= self.max_tokens:
            return "max_tokens"
        if self.s.state.pos >= self.s.n_ctx:
            return "context"
        return ""


@dataclass
class ConcurrentStats:
    rounds_ms: list[float] = field(default_factory=list)  # wall time of each batched round
    decode_s: float = 0.0
    generated_tokens: int = 0  # over all sessions, first tokens (from prefill) excluded

    @property
    def aggregate_tok_s(self) -> float:
        return self.generated_tokens / self.decode_s if self.decode_s else 0.0

    def as_dict(self) -> dict:
        r = sorted(self.rounds_ms)
        return {"rounds": len(r), "round_ms_median": round(r[len(r) // 2], 3) if r else None,
                "decode_s": round(self.decode_s, 4), "aggregate_tok_s": round(self.aggregate_tok_s, 2)}


def run_round(model, gens: Sequence[Generation]) -> None:
    """One round of several generations on one model: each proposes its window, and batched forwards within the
    kernels' row-invariant size serve them all (experts read once for every row), so each generation's logits
    equal its solo run's."""
    windows = [g.window() for g in gens]
    i = 0
    while i < len(gens):
        j, rows = i, 0
        while j < len(gens) and (j == i or rows + len(windows[j]) <= ROW_INVARIANT_ROWS):
            rows += len(windows[j])
            j += 1
        t = time.perf_counter()
        outs = model.forward_batch([(windows[n], gens[n].s.state) for n in range(i, j)])
        for n in range(i, j):
            gens[n].finish(outs[n - i], t)
        i = j


def generate_concurrent(requests: Sequence[tuple[GuildSession, dict]]) -> tuple[list, ConcurrentStats]:
    """Run several sessions' generations together, one `run_round` after another. `requests` holds
    (session, generate keyword arguments incl. prompt and max_tokens); the sessions share one model."""
    model = requests[0][0].model
    if any(s.model is not model for s, _ in requests):
        raise ValueError("concurrent sessions must share one model")
    gens = [Generation(s, **kw) for s, kw in requests]  # prefills, one session after another
    cs = ConcurrentStats()
    t0 = time.perf_counter()
    while active := [g for g in gens if not g.done]:
        tr = time.perf_counter()
        run_round(model, active)
        cs.rounds_ms.append((time.perf_counter() - tr) * 1e3)
    cs.decode_s = time.perf_counter() - t0
    results = [g.result() for g in gens]
    cs.generated_tokens = sum(max(st.generated_tokens - 1, 0) for _, st in results)
    return results, cs
