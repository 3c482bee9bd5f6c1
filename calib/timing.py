"""Statistics of repeated timings, shared by the calibration passes and the benchmark tools."""

from __future__ import annotations

import statistics


def median(xs) -> float:
    """The median of a sample as a float; NaN for an empty one (a measurement that produced no samples)."""
    return float(statistics.median(xs)) if xs else float("nan")
