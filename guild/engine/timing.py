"""Timing verification windows: the one loop behind `guild optimize`'s window costs V(T) (calib/draft_costs.py) and
the benchmarks' (guild.bench: the windows, step and hybrid cases).

A window is one forward of T rows at the state's position, then `state.commit(keep)`. Each round runs every T
once (rotated per round if asked, so no T always runs first and a slow spell of a shared machine hits all T
alike); warm-up rounds are run and not recorded. With `clock`, the host's KernelClock (guild.engine.backends)
is attached to HOST for the run and the seconds inside the routed experts and the Gated-DeltaNet recurrence
inside each forward are recorded per window. With `ops`, the forward also runs on its layout wrapped in
TimedBackends, and every backend op's seconds are recorded by its name: what is left of the forward is the
Python between the kernels.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from .backends import HOST, KernelClock


@dataclass
class WindowTimes:
    """Per T, one entry per recorded window (ms): the forward (with `after`), the commit, and the kernels' inside
    the forward."""

    forward_ms: dict = field(default_factory=dict)
    commit_ms: dict = field(default_factory=dict)
    kernel_ms: dict = field(default_factory=dict)  # T -> [{kernel or backend op name: ms}, ...]
    distinct: dict = field(default_factory=dict)  # T -> [mean distinct routed experts per layer, ...]

    def window_ms(self, T: int) -> list[float]:
        """The whole window: forward (with `after`) and commit."""
        return [f + c for f, c in zip(self.forward_ms[T], self.commit_ms[T], strict=True)]

    def kernel(self, name: str, T: int) -> list[float]:
        return [k.get(name, 0.0) for k in self.kernel_ms[T]]

    def kernels_total(self, T: int) -> list[float]:
        """Per window, the forward's ms inside any timed kernel (spans never overlap: see KernelClock)."""
        return [sum(k.values()) for k in self.kernel_ms[T]]


def time_windows(model, state, tokens: Callable[[int, int], Sequence[int]], Ts: Sequence[int], repeats: int, *,
                 warmup: int = 0, rotate: bool = False, keep: Callable[[int], int] = lambda T: 0,
                 after: Callable | None = None, clock: bool = False, ops: bool = False) -> WindowTimes:
    """Time `repeats` rounds (after `warmup` unrecorded ones) of one window per T in Ts on `state`.

    tokens(round, T): the window's token ids (round counts the warm-up ones). after(out, window, T): run on
    each forward's ForwardResult before the commit, inside the forward's time (the verifier's accept rule).
    The commit keeps keep(T) rows: by default none, so the state stays where it is."""
    res = WindowTimes(*({T: [] for T in Ts} for _ in range(4)))
    kc = KernelClock() if clock or ops else None
    if ops:
        model = model.on_layout(model.layout.timed(kc))
    saved, HOST.clock = HOST.clock, kc
    try:
        for r in range(warmup + repeats):
            order = list(Ts)
            if rotate:
                order = order[r % len(order):] + order[: r % len(order)]
            for T in order:
                window = tokens(r, T)
                if kc is not None:
                    kc.reset()
                t0 = time.perf_counter()
                out = model.forward_batch([(window, state)])[0]
                if after is not None:
                    after(out, window, T)
                tc = time.perf_counter()
                kernels = kc.ms() if kc is not None else {}  # the forward's: a replaying commit runs the recurrence
                state.commit(keep(T))
                t1 = time.perf_counter()
                if r < warmup:
                    continue
                res.forward_ms[T].append((tc - t0) * 1e3)
                res.commit_ms[T].append((t1 - tc) * 1e3)
                res.kernel_ms[T].append(kernels)
                res.distinct[T].append(float(np.mean(out.distinct_experts)))
    finally:
        HOST.clock = saved
    return res
