"""One record schema for every benchmark: a record is one runner measured at one point of one case, each figure
under the one key FIGURES names it by, with its median, spread and every run's value.

    {"case": "shapes", "point": {"model": "q3-4l-q4km.gguf"}, "runner": "guild i8",
     "figures": {"decode_tok_s": {"median": 61.2, "min": 60.8, "max": 63.0, "runs": [...]}, ...},
     "parity": true, "commit": "ce82bcb3a1f0", "host": {...}, "versions": {...}, "command": "...", "date": "..."}
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Figure:
    unit: str
    higher_is_better: bool
    label: str


# the only figure names a record may carry: one key per figure, whichever case measures it
FIGURES: dict[str, Figure] = {
    "decode_tok_s": Figure("tok/s", True, "decode"),
    "prefill_tok_s": Figure("tok/s", True, "prefill"),
    "ttft_ms": Figure("ms", False, "time to first token"),
    "load_s": Figure("s", False, "load"),
    "rss_added_mb": Figure("MB", False, "resident memory added"),
    "window_ms": Figure("ms", False, "V(T)"),
    "window_ratio": Figure("x", False, "V(T)/V(1)"),
    "distinct_experts": Figure("experts", False, "distinct experts per layer"),
    "bound_tok_s": Figure("tok/s", True, "bandwidth bound"),
    "bound_share": Figure("", True, "share of the bound"),
    "acceptance": Figure("", True, "draft acceptance"),
    "tokens_per_window": Figure("tokens", True, "tokens per window"),
    "window_size": Figure("rows", True, "mean window size T"),
    "speedup": Figure("x", True, "vs baseline"),
    "oracle_speedup": Figure("x", True, "a policy that knew each draft's fate"),
    "windows": Figure("windows", False, "verification windows by strategy"),
    "accepted_per_window": Figure("tokens", True, "accepted drafts per window, by drafter"),
    "generated_tokens": Figure("tokens", True, "generated"),
    "round_ms": Figure("ms", False, "batched round of all sessions"),
    "gweights_s": Figure("G/s", True, "weights per second"),
    "python_share": Figure("", False, "Python's share of a step"),
    "op_ms": Figure("ms", False, "ms per step by op"),
    "latency_ms": Figure("ms", False, "one call"),
    "verifier_share": Figure("", False, "verifier's share of a T=5 window"),
    "gb_s": Figure("GB/s", True, "bandwidth"),
    "gmacs": Figure("G/s", True, "multiply-adds per second"),
    "hit_rate": Figure("", True, "cache hit rate"),
    "draft_rate": Figure("", True, "proposals that drafted"),
    "agreement": Figure("", True, "top-1 agreement"),
    "max_abs": Figure("", False, "largest difference"),
    "rel_rms": Figure("", False, "relative RMS difference"),
    "same_tokens": Figure("", True, "same greedy tokens"),
    "commit_ms": Figure("ms", False, "commit (rollback included)"),
    "recurrence_ms": Figure("ms", False, "Gated-DeltaNet recurrence"),
    "recurrence_share": Figure("", False, "the recurrence's share of a window"),
    "valid": Figure("", True, "schema-valid replies"),
    "forced": Figure("drafts", True, "drafts the grammar forced"),
    "mask_us": Figure("µs", False, "grammar mask per token"),
    "mask_p90_us": Figure("µs", False, "grammar mask per token, 90th percentile"),
    "allowed_us": Figure("µs", False, "mask as the sampler's vector per token"),
    "aggregate_tok_s": Figure("tok/s", True, "all clients' tokens"),
    "ttft_max_ms": Figure("ms", False, "slowest time to first token"),
    "ttft_later_ms": Figure("ms", False, "time to first token, later requests"),
    "mb_per_token": Figure("MB", False, "read per token"),
    "reads_in_flight": Figure("reads", True, "reads in flight"),
    "events_per_token": Figure("/token", False, "events per token"),
    "cap_peak_mb": Figure("MB", False, "peak in the memory cap, page cache included"),
    "token_ms": Figure("ms", False, "a token's time by cause"),
}


def stats(values: list[float]) -> dict:
    """Median, spread and the runs of one figure."""
    if not values:
        raise ValueError("a figure needs at least one run")
    vs = [float(v) for v in values]
    return {"median": statistics.median(vs), "min": min(vs), "max": max(vs), "runs": vs}


@dataclass(frozen=True)
class Record:
    case: str
    point: dict
    runner: str
    figures: dict  # figure name (FIGURES) -> stats(); a figure by T carries "T=1".. sub-keys via `series`
    parity: bool | None = None  # the runner's tokens equal the reference runner's (None: not compared)
    meta: dict = field(default_factory=dict)  # provenance(): commit, host, versions, command, date, load

    def __post_init__(self):
        unknown = set(self.figures) - set(FIGURES)
        if unknown:
            raise ValueError(f"{self.case}: unknown figure(s) {sorted(unknown)}; add them to FIGURES")
        for name, s in self.figures.items():
            if not isinstance(s, dict) or not ({"median", "runs"} <= set(s) or "series" in s):
                raise ValueError(f"{self.case}: figure {name} is not stats() or series()")

    def median(self, name: str, at: int | None = None) -> float:
        s = self.figures[name]
        return s["series"][str(at)]["median"] if at is not None else s["median"]

    def to_json(self) -> dict:
        return {"case": self.case, "point": self.point, "runner": self.runner, "figures": self.figures,
                "parity": self.parity, **self.meta}


def series(by: dict) -> dict:
    """A figure measured at several T (or sizes): {"series": {"1": stats, "2": stats, ...}}."""
    return {"series": {str(k): v if isinstance(v, dict) else stats(v) for k, v in by.items()}}


def ratio(a: Record, b: Record, name: str) -> float | None:
    """a's median over b's, for a figure both carry."""
    if name not in a.figures or name not in b.figures or not b.median(name):
        return None
    return a.median(name) / b.median(name)
