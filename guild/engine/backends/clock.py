"""Seconds spent inside kernels, by name: what guild.engine.timing reads to split a window's time."""

from __future__ import annotations

import contextlib
import time


class KernelClock:
    """Seconds spent inside kernels, by name. The host attributes its costliest ones while attached to it
    (`HOST.clock`, by guild.engine.timing): "experts" (the routed experts, kernels/cpu/moe) and
    "gdn_recurrence"; HOST.clock is None otherwise and nothing is timed. A TimedBackend on the clock adds every
    backend op by its name. A span inside another counts toward the outer one only, so nothing counts twice."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self._depth = 0

    def reset(self) -> None:
        self.seconds.clear()

    def ms(self) -> dict[str, float]:
        return {k: v * 1e3 for k, v in self.seconds.items()}

    @contextlib.contextmanager
    def span(self, name: str):
        self._depth += 1
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self._depth -= 1
            if not self._depth:
                self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t0

    def add(self, name: str, seconds: float) -> None:
        """seconds measured elsewhere (a part of a compiled call), counted under name unless inside a span."""
        if not self._depth:
            self.seconds[name] = self.seconds.get(name, 0.0) + seconds

    def timed(self, name: str, fn):
        """fn, its calls counted under name."""

        def call(*args, **kwargs):
            with self.span(name):
                return fn(*args, **kwargs)

        return call


_UNTIMED = contextlib.nullcontext()  # reusable: it holds no state


def clocked(clock: KernelClock | None, name: str):
    """clock's span `name`, or nothing while no clock is attached (the untimed default costs one branch)."""
    return _UNTIMED if clock is None else clock.span(name)


