"""The Drafter interface: a plain object with no I/O and no clock, owned by one session.

The session calls `start` when a generation starts (history[prompt_start:] is the new prompt, earlier tokens are
previous turns), `propose` before every window, `observe` after it with the measured times, and
`observe_hidden` with the base model's final hidden rows of everything it commits when `follows_rows` is set.
`ingest` feeds reference text (a retrieval corpus); `signals()` is what the adaptive scheduler conditions its
acceptance estimates on. Every hook does nothing by default.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


class Drafter:
    name = "normal"
    lazy = False  # a forward per proposal: the adaptive scheduler asks only when it could pay
    follows_rows = False  # needs the base's committed final hidden rows (observe_hidden)

    def propose(self, history: Sequence[int], k: int) -> np.ndarray:
        """Up to k draft ids (int32) continuing `history`, which ends with the root the window feeds first;
        empty = a plain one-token step this window."""
        return np.empty(0, np.int32)

    def start(self, history: Sequence[int], prompt_start: int) -> None:
        pass

    def ingest(self, tokens) -> None:
        pass

    def observe_hidden(self, pos0: int, rows: np.ndarray) -> None:
        pass

    def observe(self, k: int, draft_ms: float, verify_ms: float, emitted: int) -> None:
        pass

    def signals(self) -> dict:
        """What the last proposal rested on (match length, confidence, probability), for the scheduler."""
        return {}

    # set by propose: the strategy whose tokens it returned (None: this drafter's own name; a drafter over
    # drafters picks one), the adaptive scheduler's decision (candidates and choice), and the committed rows
    # it caught up on first (not the steady cost of a proposal)
    last_strategy: str | None = None
    last_decision = None
    catchup_rows = 0


class NoDrafter(Drafter):
    """Plain decoding: never proposes."""
