"""The Drafter interface: a plain object with no I/O and no clock, owned by one session.

The session calls `start` when a generation starts (history[prompt_start:] is the new prompt, earlier tokens are
previous turns), `draft` before every window (a Draft: the tokens `propose` returns, and what chose them),
`observe` after it with the strategy that ran and the measured times, and
`observe_hidden` with the base model's final hidden rows of everything it commits when `follows_rows` is set,
and `observe_logits` with the target's logits of the row that sampled the next window's root;
`observe_constraint` with the grammar a generation follows (or None) before its first proposal.
`ingest` feeds reference text (a retrieval corpus); `signals()` is what the adaptive scheduler conditions its
acceptance estimates on. Every hook does nothing by default.

A drafter class is also its own declaration (guild/speculative/registry.py lists the classes): its strategy name,
what it needs, how it is built from DraftOptions, and the scheduler's priors (per acceptance bucket, and of the
weights of its `features`). Everything that lists strategies (options, the scheduler, plans, calibration) reads
these attributes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, eq=False)
class Draft:
    """A drafter's answer for one window, handed back to the session as a value (nothing is read off the drafter
    after the call)."""

    tokens: np.ndarray  # up to k draft ids (int32); empty: a plain one-token step
    strategy: str | None = None  # whose tokens they are (None: the drafter's own name); a pool's choice
    decision: object | None = None  # the adaptive scheduler's Decision: candidates and choice (--trace)
    forced: int = 0  # how many of the tokens a grammar forces
    propose_ms: dict | None = None  # per drafter asked, its propose time (a pool's breakdown for --trace)


class Drafter:
    name = "normal"  # the --decode-strategy that drafts with this class alone
    lazy = False  # a forward per proposal: the adaptive scheduler asks only when it could pay
    follows_rows = False  # needs the base's committed final hidden rows (observe_hidden); pays a catch-up
    uses_head = False  # drafts with the model's MTP head (--mtp-head); its k is capped by --spec-mtp-k
    needs_head = False  # cannot run without one
    uses_corpus = False  # ingests --retrieval-corpus
    priors: dict[str, float] = {}  # the adaptive scheduler's prior acceptance per signal bucket
    weights: dict[str, float] = {}  # prior means of the weights of `features` (absent: 0)
    catchup_rows = 0  # set by propose: the committed rows it caught up on first (not a proposal's steady cost)

    @classmethod
    def build(cls, o, head, n_ctx: int) -> Drafter:
        """The drafter of `--decode-strategy <name>` from DraftOptions `o`, the MTP head (or None) and the
        context rows a head's cache needs."""
        return cls()

    @classmethod
    def warm(cls) -> None:
        """Once per process, at build: load what a first propose would (Numba's compiled kernels, 4-6 ms a
        drafter), so that cost is paid with the model's load, not inside a decode window."""
        if not cls.__dict__.get("_warmed"):
            cls._warmed = True
            cls._warm()

    @classmethod
    def _warm(cls) -> None:
        """A tiny start and propose through the drafter's kernels (nothing to load by default)."""

    @classmethod
    def member(cls, o, head, n_ctx: int) -> Drafter | None:
        """The drafter as one of the adaptive drafter's pool (None: it sits out, e.g. no head)."""
        return cls.build(o, head, n_ctx)

    @classmethod
    def bucket(cls, signals: dict) -> str:
        """The acceptance bucket (a key of `priors`) of a proposal from its signals; one bucket needs no rule."""
        if len(cls.priors) != 1:
            raise NotImplementedError(f"{cls.__name__} has {len(cls.priors)} acceptance buckets and no bucket rule")
        return next(iter(cls.priors))

    @classmethod
    def features(cls, signals: dict) -> dict[str, float]:
        """The acceptance model's inputs beyond the bucket, from a proposal's signals: 0 where typical."""
        return {}

    def propose(self, history: Sequence[int], k: int) -> np.ndarray:
        """Up to k draft ids (int32) continuing `history`, which ends with the root the window feeds first;
        empty = a plain one-token step this window."""
        return np.empty(0, np.int32)

    def draft(self, history: Sequence[int], k: int) -> Draft:
        """The session's call before a window, k its one draft cap: `propose`'s tokens as a Draft (a drafter
        over drafters overrides it to say which one it chose and why)."""
        return Draft(self.propose(history, k))

    def start(self, history: Sequence[int], prompt_start: int) -> None:
        pass

    def ingest(self, tokens) -> None:
        pass

    def observe_hidden(self, pos0: int, rows: np.ndarray, features=()) -> None:
        pass

    def observe(self, strategy: str, k: int, draft_ms: float, verify_ms: float, emitted: int) -> None:
        """The window just verified: k drafts of `strategy` ("normal" when k == 0), its measured times."""

    def observe_residency(self, cold_ms) -> None:
        """Before a proposal: the expected ms of expert reads a window of T = 1.. rows would wait for (a model
        whose experts an expert cache streams from disk; guild.engine.experts.ExpertCache.cold_ms)."""

    def observe_constraint(self, constraint) -> None:
        """At a generation's start: the grammar its tokens follow (guild.engine.constraint.Constraint), or None.
        Its `forced` tokens are certain drafts; asking it reads and changes no committed state."""

    def observe_logits(self, row: np.ndarray) -> None:
        """The target's logits [vocab] that sampled the root of the next window (the prefill's last row, then
        each window's last kept row): the verifier computed them anyway. Read before the next forward."""

    def signals(self) -> dict:
        """What the last proposal rested on (match length, confidence, probability), for the scheduler."""
        return {}


class NoDrafter(Drafter):
    """Plain decoding: never proposes."""


def top1(logits: np.ndarray) -> tuple[int, float]:
    """The argmax of a row of logits and its softmax probability (float32: a signal, and a vocabulary-wide
    exp in float64 costs several times more)."""
    j = int(np.argmax(logits))
    z = np.asarray(logits, np.float32) - np.float32(logits[j])
    return j, float(1.0 / np.exp(z).sum())


def next_pow2(x: int) -> int:
    """The smallest power of two >= x (at least 1): the drafters' hash tables index with `h & (size - 1)`."""
    return 1 << max(0, int(x - 1).bit_length())
