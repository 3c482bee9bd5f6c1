"""Calibrated drafting costs: what `guild optimize` measured (a plan's drafting section) in the form the adaptive
scheduler consumes. Without a plan the scheduler seeds these live from the first plain steps."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import BadFlagError


@dataclass(frozen=True)
class DraftCosts:
    verify_ms: tuple[float, ...]  # window wall time for T = 1..len(verify_ms) rows, at `context` tokens
    context: int = 0  # KV length the window times were measured at
    draft_ms: dict[str, float] = field(default_factory=dict)  # propose latency per strategy ("lookup", ...)
    catchup_ms: dict[str, float] = field(default_factory=dict)  # per window, per drafter that follows rows (mtp)
    commit_ms: float = 0.0  # KV commit per window

    def __post_init__(self):
        if not self.verify_ms or any(not v > 0 for v in self.verify_ms):
            raise BadFlagError(f"draft costs: verify_ms must be positive, got {self.verify_ms}")
        if any(v < 0 for v in (*self.draft_ms.values(), *self.catchup_ms.values())) or self.commit_ms < 0:
            raise BadFlagError("draft costs: drafter, catch-up and commit times must be >= 0")
