"""The adaptive scheduler's guard: adaptive decoding held to cost no more than plain steps, by the times it is
handed (scheduler.AdaptiveScheduler keeps one; docs/adaptive.md "Guard")."""

from __future__ import annotations


class Guard:
    """The promise that adaptive costs no more than plain steps, held by measurement rather than by the cost
    model: whatever the model misses (a drafter's propose time at a long history, V(T) at another context,
    Python per window) shows in the realised ms per committed token of the windows that asked the drafters.
    Each run of `guard_windows` such windows (`probe_windows` after a rest) is judged against plain's V(1); one
    that lost by more than `guard_margin` (or at once by `guard_budget` plain steps) rests the drafters for
    `rest` windows: plain steps that ask none of them, but for a peek every `peek_every` windows at the drafters
    that cost no forward, which ends the rest when one of them proposes a draft that pays (the reply starts to
    copy its input). `rest` doubles per loss in a row up to `rest_max`, and returns to `rest_min` after a run
    that did not lose. Clock-free: it reads only the times it is handed."""

    def __init__(self, cfg):  # a SchedulerConfig (its guard_*, probe_windows, peek_every, rest_* fields)
        self.cfg = cfg
        self.rest_left = 0  # plain windows left to rest
        self.rested = 0  # windows of this rest so far
        self.rest = cfg.rest_min  # the next rest's length
        self.ms = self.tokens = 0.0  # the current run's realised sums
        self.n = 0  # its windows
        self.run = cfg.guard_windows  # the current run's length
        self.rests = 0  # rests so far (reported)

    @property
    def resting(self) -> bool:
        return self.rest_left > 0

    @property
    def peek(self) -> bool:
        """Whether this resting window asks the drafters that cost no forward."""
        return self.resting and (self.rested + 1) % self.cfg.peek_every == 0

    def wake(self) -> None:
        """A peek found a draft that pays: the rest ends, and a new run is judged from here."""
        self.rest_left = 0
        self._restart()

    def _restart(self) -> None:
        self.ms = self.tokens = 0.0
        self.n = 0

    def observe(self, asked: bool, ms: float, emitted: int, plain_ms: float) -> None:
        """A window measured: `asked` whether it asked the drafters (else it rested), `ms` what it took beside
        the session's own work, `plain_ms` V(1), what a plain step costs now."""
        if not asked:
            self.rest_left = max(self.rest_left - 1, 0)
            self.rested += 1
            return
        c = self.cfg
        self.ms, self.tokens, self.n = self.ms + ms, self.tokens + max(emitted, 1), self.n + 1
        excess = self.ms - plain_ms * self.tokens
        if excess > c.guard_budget * plain_ms or (self.n >= self.run and excess > c.guard_margin * plain_ms
                                                  * self.tokens):
            self.rest_left, self.rest, self.rested = self.rest, min(2 * self.rest, c.rest_max), 0
            self.rests += 1
            self.run = c.probe_windows
        elif self.n < self.run:
            return
        else:
            self.rest, self.run = c.rest_min, c.guard_windows
        self._restart()
