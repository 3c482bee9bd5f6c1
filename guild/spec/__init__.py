"""Drafters propose draft tokens for a verification window; the verifier decides what is kept.

A drafter is a plain object with no I/O and no clock, owned by one session:
- `propose(history, k)` returns up to k token ids (int32; empty = a plain one-token step this window)
  continuing `history` (every token so far, ending with the root that the window will feed first);
- `start(history, prompt_start)` (optional) is called when a generation starts (history[prompt_start:] is the
  new prompt; earlier tokens are previous turns), so the drafter can re-sync its indexes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from ..errors import BadFlagError

STRATEGIES = ("normal", "lookup", "retrieval", "mtp", "adaptive")


class Drafter(Protocol):
    name: str

    def propose(self, history: Sequence[int], k: int) -> np.ndarray: ...

    def start(self, history: Sequence[int], prompt_start: int) -> None: ...


class NoDrafter:
    """Plain decoding: never proposes."""

    name = "normal"

    def propose(self, history: Sequence[int], k: int) -> np.ndarray:
        return np.empty(0, np.int32)

    def start(self, history: Sequence[int], prompt_start: int) -> None:
        pass


def make_drafter(strategy: str, *, min_match: int = 3, lookup_window: int = 65536, costs=None) -> Drafter:
    """The drafter for `--decode-strategy`; strategies not built yet are refused, not faked. `costs`
    (a SpecCosts from a plan, or None) seeds the adaptive scheduler's cost model."""
    if strategy == "normal":
        return NoDrafter()
    if strategy == "lookup":
        from .suffix_drafter import SuffixDrafter

        if min_match not in (2, 3):
            raise BadFlagError(f"--spec-min-match must be 2 or 3, got {min_match}")
        if lookup_window < 64:
            raise BadFlagError(f"--spec-lookup-window must be >= 64, got {lookup_window}")
        return SuffixDrafter(min_match=min_match, max_history=lookup_window)
    if strategy == "retrieval":
        from .retrieval_drafter import RetrievalDrafter

        return RetrievalDrafter()
    if strategy == "adaptive":
        from .adaptive import AdaptiveDrafter

        return AdaptiveDrafter([make_drafter("lookup", min_match=min_match, lookup_window=lookup_window),
                                make_drafter("retrieval")], costs)
    if strategy == "mtp":
        raise BadFlagError("--decode-strategy mtp is not built yet (available: normal, lookup, retrieval, adaptive)")
    raise BadFlagError(f"--decode-strategy must be one of {', '.join(STRATEGIES)}, got '{strategy}'")
