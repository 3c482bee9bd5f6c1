"""`--decode-strategy adaptive`: every window asks each drafter for a proposal, the AdaptiveScheduler picks
(strategy, k) — Normal included — and the session verifies it. Proposals not taken are still checked against
the tokens decoding emits later (shadow verification), so every strategy's acceptance stays measured."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np

from .base import Draft, Drafter
from .costs import DraftCosts
from .registry import drafter
from .scheduler import AdaptiveScheduler, Proposal, SchedulerConfig

MAX_PENDING = 64  # shadow proposals awaiting their tokens (each resolves within k emitted tokens)
MAX_CATCHUP_TIMED = 8  # an MTP propose that caught up more rows than a window commits is not timed


def agree(sig: dict, strategy: str, tokens, others) -> None:
    """Whether a drafter of the other kind (the model's head against the copying ones, which share the text they
    copy from) proposes the same first token: +1 one does, -1 none does, unset when none proposed. Independent
    drafters that agree are right far more often."""
    head = drafter(strategy).uses_head
    firsts = [q.tokens[0] for q in others if q.tokens and drafter(q.strategy).uses_head != head]
    if firsts:
        sig["agree"] = 1.0 if tokens[0] in firsts else -1.0


def with_forced(p: Proposal, forced: tuple[int, ...], c, k: int) -> Proposal:
    """Proposal p (at most k tokens) as the window would run it under grammar c: cut where the grammar refuses
    it, the run `forced` from the root when p stops inside it, then the tokens forced after p's last one, each
    of those marked certain. p's own tokens past the forced run keep their rates."""
    toks = p.tokens[:k]
    toks = toks[: c.valid_prefix(toks)]
    if len(toks) <= len(forced):  # a valid token where the grammar forces one is the forced one
        return Proposal(p.strategy, forced, p.signals, (True,) * len(forced))
    after = c.forced(toks, k - len(toks))
    return Proposal(p.strategy, toks + after, p.signals,
                    (True,) * len(forced) + (False,) * (len(toks) - len(forced)) + (True,) * len(after))


class AdaptiveDrafter(Drafter):
    """Drafter protocol over several drafters and one scheduler: `draft` asks each drafter's propose and hands
    back the scheduler's choice. `clock` times each drafter's propose (the scheduler itself reads no clock); the
    session reports each window through `observe`."""

    name = "adaptive"

    def __init__(self, drafters: Sequence, costs: DraftCosts | None = None,
                 clock: Callable[[], float] = time.perf_counter, mtp_cap_k: int = 3):
        self.drafters = list(drafters)
        self.follows_rows = any(d.follows_rows for d in self.drafters)
        self.scheduler = AdaptiveScheduler(SchedulerConfig(mtp_cap_k=mtp_cap_k), costs)
        self.clock = clock
        self.pending: list[tuple[Proposal, int]] = []  # (proposal, absolute position of its first token)
        self.constraint = None  # the grammar the generation follows (observe_constraint)
        self.context: int | None = None  # the KV length of the window drafted last (its rows follow it)
        self.ask_ms = 0.0  # what drafting the last window added to a plain step: every propose and the choice

    def ingest(self, tokens) -> None:
        """Reference text for the drafters that keep a corpus (retrieval)."""
        for d in self.drafters:
            d.ingest(tokens)

    def observe_hidden(self, pos0: int, rows, features=()) -> None:
        """The session's committed hidden rows (and the fused layers' rows), for the drafters that follow them
        (MTP)."""
        for d in self.drafters:
            d.observe_hidden(pos0, rows, features)

    def start(self, history: Sequence[int], prompt_start: int) -> None:
        self.pending.clear()  # what follows a new prompt is not the continuation they predicted
        for d in self.drafters:
            d.start(history, prompt_start)

    def _resolve(self, history: Sequence[int]) -> None:
        n = len(history)
        keep = []
        for p, pos in self.pending:
            avail = min(len(p.tokens), n - pos)
            a = 0
            while a < avail and history[pos + a] == p.tokens[a]:
                a += 1
            if a < avail or avail == len(p.tokens):
                self.scheduler.observe_proposal(p, a)
            else:
                keep.append((p, pos))
        self.pending = keep[-MAX_PENDING:]

    def observe_constraint(self, constraint) -> None:
        self.constraint = constraint

    def draft(self, history: Sequence[int], k: int) -> Draft:
        """Every drafter's proposal of at most k tokens (k: the window's one draft cap), the scheduler's pick."""
        t0 = self.clock()
        dr = self._draft(history, k)
        self.ask_ms = (self.clock() - t0) * 1e3
        return dr

    def _draft(self, history: Sequence[int], k: int) -> Draft:
        self._resolve(history)
        self.context = len(history) - 1  # the root is the window's first row
        rest = self.scheduler.rest() if k > 0 else None
        if rest is not None:  # the guard rests the drafters: a plain step that asks none of them
            return Draft(np.empty(0, np.int32), rest.strategy, rest, 0, {})
        c = self.constraint
        forced = c.forced((), k) if c is not None and k > 0 else ()
        props, ms = [], {}
        for d in self.drafters:  # the lazy ones (MTP) last: asked only when they could beat what is on the table
            if d.lazy and (self.scheduler.guard.resting or not self.scheduler.ask(d.name, props, k)):
                continue  # a resting guard's peek asks only the drafters that cost no forward
            if d.name in self.scheduler.muted:  # backed off: its proposal could not run, so it costs nothing
                continue
            t = self.clock()
            toks = d.propose(history, max(k, 0)) if k > 0 else np.empty(0, np.int32)
            ms[d.name] = (self.clock() - t) * 1e3
            if d.catchup_rows <= MAX_CATCHUP_TIMED:  # a long lagging catch-up is not the steady cost
                self.scheduler.observe_draft_ms(d.name, ms[d.name])
            sig = dict(d.signals())
            if d.lazy and toks.size:  # e.g. the head's confidence (docs/adaptive.md "MTP confidence")
                agree(sig, d.name, toks, props)
                self.scheduler.observe_lazy(d.name, sig)
            props.append(Proposal(d.name, tuple(toks.tolist()), sig))
        for p in props:
            if p.tokens:
                agree(p.signals, p.strategy, p.tokens, props)
                self.pending.append((p, len(history)))
        cands = props
        if c is not None and k > 0:  # each proposal through the tokens the grammar forces before and after it
            cands = [with_forced(p, forced, c, k) for p in props]
            if forced and not any(q.tokens for q in cands):  # every drafter muted: the forced run alone
                name = next((d.name for d in self.drafters if not d.lazy), None)
                if name is not None:
                    cands.append(Proposal(name, forced, {}, (True,) * len(forced)))
        dec = self.scheduler.decide(cands, k)
        if dec.k == 0:
            return Draft(np.empty(0, np.int32), dec.strategy, dec, 0, ms)
        chosen = next(p for p in cands if p.strategy == dec.strategy)
        return Draft(np.asarray(chosen.tokens[: dec.k], np.int32), dec.strategy, dec, sum(chosen.certain[: dec.k]),
                     ms)

    def observe_residency(self, cold_ms) -> None:
        self.scheduler.observe_residency(cold_ms)

    def observe(self, strategy: str, k: int, draft_ms: float, verify_ms: float, emitted: int) -> None:
        """The session's measurement of the window just verified."""
        # the drafter's own time, not the session's draft_ms: what a plain step would not have paid
        self.scheduler.observe_window(strategy, k, self.ask_ms, verify_ms, emitted, self.context)
