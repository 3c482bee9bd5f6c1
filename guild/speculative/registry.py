"""The drafters: one line per Drafter class. Every list of strategies (--decode-strategy, the adaptive drafter's
pool, the scheduler's priors and buckets, a plan's per-drafter costs, calibration) is derived from DRAFTERS.

The strategies are `normal` (no drafter), each drafter alone under its `name`, and `adaptive`, which picks among
all of them per window (guild.speculative.build.make_drafter builds each).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import UnknownStrategyError
from .base import Drafter
from .lookup import SuffixDrafter
from .mtp import MtpDrafter
from .retrieval import RetrievalDrafter

# in the order the adaptive drafter asks them (lazy ones go last whatever their place here)
DRAFTERS: dict[str, type[Drafter]] = {d.name: d for d in (SuffixDrafter, RetrievalDrafter, MtpDrafter)}

NORMAL, ADAPTIVE = "normal", "adaptive"


def drafter(name: str) -> type[Drafter]:
    """The registered drafter class named `name`."""
    cls = DRAFTERS.get(name)
    if cls is None:
        raise UnknownStrategyError(f"unknown drafter '{name}' (registered: {', '.join(DRAFTERS)})")
    return cls


def strategies() -> tuple[str, ...]:
    """Every --decode-strategy value, in the order help and errors list them."""
    return (NORMAL, *DRAFTERS, ADAPTIVE)


@dataclass(frozen=True)
class Needs:
    uses_head: bool = False  # drafts with the model's MTP head when it has one
    needs_head: bool = False  # cannot run without one
    uses_corpus: bool = False  # ingests --retrieval-corpus


def needs(strategy: str) -> Needs:
    """What a strategy needs: a drafter's own declaration; adaptive uses whatever any drafter uses."""
    if strategy == NORMAL:
        return Needs()
    if strategy == ADAPTIVE:
        return Needs(uses_head=any(d.uses_head for d in DRAFTERS.values()),
                     uses_corpus=any(d.uses_corpus for d in DRAFTERS.values()))
    d = DRAFTERS.get(strategy)
    if d is None:
        raise UnknownStrategyError(f"unknown strategy '{strategy}' (one of {', '.join(strategies())})")
    return Needs(d.uses_head, d.needs_head, d.uses_corpus)
