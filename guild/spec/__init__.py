"""Drafters propose draft tokens for a verification window; the verifier decides what is kept.

A drafter is a plain object with no I/O and no clock: `propose(history, k)` returns up to k token ids
(int32; empty = a plain one-token step this window) continuing `history` (every token so far, ending with
the root that the window will feed first).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np


class Drafter(Protocol):
    name: str

    def propose(self, history: Sequence[int], k: int) -> np.ndarray: ...


class NoDrafter:
    """Plain decoding: never proposes."""

    name = "normal"

    def propose(self, history: Sequence[int], k: int) -> np.ndarray:
        return np.empty(0, np.int32)
