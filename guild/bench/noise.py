"""The noise a ratio must beat: the spread (CV) of one runner's repeated runs at a point, and a warning when the
machine was busy while the bench ran (the load average at start and end, both in every record's meta)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence


def cv(values: Sequence[float]) -> float | None:
    """stdev / mean of the runs (None under two)."""
    xs = [x for x in values if x]
    return statistics.stdev(xs) / statistics.mean(xs) if len(xs) >= 2 else None


def within(speedup: float | None, noise: float | None) -> bool:
    """A ratio that differs from 1 by less than the noise says nothing."""
    return speedup is not None and noise is not None and abs(speedup - 1.0) <= noise


def load_warning(load_start: Sequence[float], load_end: Sequence[float], cores: int, threads: int,
                 unreliable: int) -> str | None:
    """A line for a machine that was busy or noisy: other work took more than the cores the bench's `threads`
    left (the end's 1-minute load average counts the bench's own threads: they are taken off), or `unreliable`
    ratios fell within the noise."""
    others = max(load_start[0], load_end[0] - threads)
    why = []
    if others > max(1.0, cores - threads):
        why.append(f"load average {others:.1f} besides the bench's {threads} threads on {cores} cores")
    if unreliable:
        why.append(f"{unreliable} ratio(s) within the noise")
    return ("unreliable: " + " and ".join(why) + "; rerun on a quiet machine with 3 rounds or more") if why else None
