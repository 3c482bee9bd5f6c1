"""Server counters and gauges, rendered in Prometheus' text format (`GET /metrics`). Thread-safe: the engine
thread and the HTTP event loop both update them."""

from __future__ import annotations

import threading
from collections import defaultdict

# name → (type, help); labels are given per update
METRICS = {
    "guild_requests_total": ("counter", "HTTP requests answered, by endpoint and status code"),
    "guild_prompt_tokens_total": ("counter", "Prompt tokens of finished requests"),
    "guild_prefix_reused_tokens_total": ("counter", "Prompt tokens served from a pooled session's KV cache"),
    "guild_completion_tokens_total": ("counter", "Tokens generated"),
    "guild_decode_seconds_total": ("counter", "Seconds requests spent decoding (after their first token)"),
    "guild_time_to_first_token_seconds_sum": ("counter", "Sum of the time from submission to the first token"),
    "guild_time_to_first_token_seconds_count": ("counter", "Requests that produced a first token"),
    "guild_windows_total": ("counter", "Verification windows, by strategy"),
    "guild_drafted_tokens_total": ("counter", "Draft tokens proposed, by strategy"),
    "guild_accepted_tokens_total": ("counter", "Draft tokens accepted, by strategy"),
    "guild_rounds_total": ("counter", "Batched decoding rounds (one forward for every active request)"),
    "guild_round_requests_total": ("counter", "Requests decoded, summed over rounds (/ rounds: the mean batch size)"),
    "guild_cancelled_total": ("counter", "Requests cancelled because the client went away"),
    "guild_queue_depth": ("gauge", "Requests waiting for a slot"),
    "guild_batch_size": ("gauge", "Requests decoding in the current round"),
    "guild_pool_sessions": ("gauge", "Sessions held (active and pooled for prefix reuse)"),
    "guild_pool_bytes": ("gauge", "Bytes of the sessions' caches (bounded by --cache-mem)"),
    "guild_decode_tokens_per_second": ("gauge", "Aggregate decode rate over the last round"),
}


class Metrics:
    def __init__(self):
        self._lock = threading.Lock()
        self._v: dict[str, dict[tuple, float]] = defaultdict(lambda: defaultdict(float))

    def inc(self, name: str, value: float = 1.0, **labels) -> None:
        with self._lock:
            self._v[name][tuple(sorted(labels.items()))] += value

    def set(self, name: str, value: float, **labels) -> None:
        with self._lock:
            self._v[name][tuple(sorted(labels.items()))] = value

    def clear(self) -> None:
        with self._lock:
            self._v.clear()

    def get(self, name: str, **labels) -> float:
        with self._lock:
            return self._v[name].get(tuple(sorted(labels.items())), 0.0)

    def render(self) -> str:
        lines = []
        with self._lock:
            for name, (kind, help_) in METRICS.items():
                lines += [f"# HELP {name} {help_}", f"# TYPE {name} {kind}"]
                series = self._v.get(name) or {(): 0.0}
                for labels, value in sorted(series.items()):
                    lab = ",".join(f'{k}="{_escape(str(v))}"' for k, v in labels)
                    lines.append(f"{name}{{{lab}}} {value:g}" if lab else f"{name} {value:g}")
        return "\n".join(lines) + "\n"


def _escape(s: str) -> str:
    return s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
