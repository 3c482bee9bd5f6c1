"""The harness: every case's points × runners, rounds alternated (the order reversed every other round, so a
drifting host weighs on every runner alike), medians and spread, token parity where it applies, peak memory read
one way, and one Record per (point, runner).

A runner measures one point and returns a Run: figures (a number, or {T: number} for a curve) and the tokens it
generated. An `exact` runner's tokens must equal the case's reference runner's (guild's strategies: speculation
is exact), else the bench stops with ParityError; other runners (llama.cpp) are compared and reported only.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace

from ..errors import GuildError
from .record import Record, series, stats


class ParityError(GuildError):
    pass


@dataclass
class Run:
    figures: dict = field(default_factory=dict)  # name -> float, or {T: float} for a curve
    tokens: list[int] | None = None
    extra: dict = field(default_factory=dict)  # anything the case wants to keep beside the figures

    def to_json(self) -> dict:
        return {"figures": {k: ({str(t): x for t, x in v.items()} if isinstance(v, dict) else v)
                            for k, v in self.figures.items()}, "tokens": self.tokens, "extra": self.extra}

    @classmethod
    def from_json(cls, d: dict) -> Run:
        return cls(d["figures"], d.get("tokens"), d.get("extra", {}))


@dataclass(frozen=True)
class Runner:
    name: str
    measure: Callable[[dict], Run]  # point -> Run
    exact: bool = False  # its tokens must equal the reference's
    reference: bool = False  # the runner whose tokens the exact ones are held to
    warmup: Callable[[dict], None] | None = None  # unmeasured, once per point before the rounds
    once: bool = False  # measured in the first round only (a deterministic figure, costly to repeat)


def alternate(names: Sequence[str], rounds: int) -> Iterator[tuple[int, str]]:
    """(round, name): A B C, C B A, A B C, ..."""
    for i in range(rounds):
        for n in names if i % 2 == 0 else list(names)[::-1]:
            yield i, n


def rss_now_mb() -> float:
    """The process's resident memory now (Linux), else its peak."""
    try:
        with open("/proc/self/status") as f:
            return next(int(x.split()[1]) for x in f if x.startswith("VmRSS:")) / 1024
    except (OSError, StopIteration, ValueError):
        return peak_rss_mb()


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def aggregate(runs: list[Run]) -> dict:
    """Per figure: stats over the runs, or per T for a curve."""
    out = {}
    for name in runs[0].figures:
        vals = [r.figures[name] for r in runs if name in r.figures]
        if isinstance(vals[0], dict):
            out[name] = series({t: [v[t] for v in vals if t in v] for t in vals[0]})
        else:
            out[name] = stats(vals)
    return out


def parity(case: str, point: dict, runs: dict[str, list[Run]], runners: Sequence[Runner]) -> dict[str, bool | None]:
    """Each runner's tokens against the reference's first run: exact runners must match in every run."""
    ref = next((r for r in runners if r.reference), None)
    want = runs[ref.name][0].tokens if ref and runs.get(ref.name) else None
    out: dict[str, bool | None] = {}
    for r in runners:
        got = [x.tokens for x in runs.get(r.name, []) if x.tokens is not None]
        out[r.name] = None if want is None or not got else all(t == want for t in got)
        if r.exact and out[r.name] is False:
            bad = next(t for t in got if t != want)
            at = next((i for i, (a, b) in enumerate(zip(bad, want, strict=False)) if a != b), min(len(bad), len(want)))
            raise ParityError(f"parity failure: {case} {point}: {r.name} differs from {ref.name} at token {at}")
    return out


def paired(runs: list[Run], ref: list[Run], name: str) -> dict | None:
    """stats() of a runner's figure over the reference's in the same round, pair by pair."""
    xs = [a.figures[name] / b.figures[name] for a, b in zip(runs, ref, strict=False)
          if a.figures.get(name) and b.figures.get(name)]
    return stats(xs) if xs else None


def measure(case: str, points: Sequence[dict], runners: Sequence[Runner], rounds: int, meta: dict,
            progress: Callable[[str], None] = lambda s: None, speedup_of: str | None = None) -> list[Record]:
    """Every point: each runner's warm-up, then `rounds` alternated rounds; one Record per (point, runner). With
    `speedup_of` (a figure), each runner's record also carries `speedup`: that figure over the reference's, per
    round."""
    if rounds < 1:
        raise GuildError(f"rounds must be >= 1, got {rounds}")
    by_name = {r.name: r for r in runners}
    records = []
    for point in points:
        for r in runners:
            if r.warmup:
                r.warmup(point)
        runs: dict[str, list[Run]] = {r.name: [] for r in runners}
        for i, name in alternate(list(by_name), rounds):
            if i and by_name[name].once:
                continue
            run = by_name[name].measure(point)
            runs[name].append(run)
            shown = ", ".join(f"{k} {v:.4g}" for k, v in run.figures.items() if not isinstance(v, dict))
            progress(f"{case} {_point_label(point)} · {name} · round {i + 1}/{rounds}"
                     + (f": {shown}" if shown else ""))
        same = parity(case, point, runs, runners)
        ref = next((r.name for r in runners if r.reference), None)
        for r in runners:
            if runs[r.name]:
                figs = aggregate(runs[r.name])
                if speedup_of and ref and (x := paired(runs[r.name], runs[ref], speedup_of)):
                    figs["speedup"] = x
                records.append(Record(case, point, r.name, figs, same[r.name], meta))
    return records


def _point_label(point: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in point.items())


# -- a runner in a child process: its memory and its warm state are its own ------------------------------------
CHILD_FLAG = "--child"


def in_child(runner: Runner, case: str, argv: Sequence[str]) -> Runner:
    """`runner` run in a fresh `python -m guild.bench CASE ARGV --child NAME --point JSON` per measurement; the
    child adds rss_added_mb, the peak resident memory the run added over the interpreter and the case's modules."""

    def measure_child(point: dict) -> Run:
        cmd = [sys.executable, "-m", "guild.bench", case, *argv, CHILD_FLAG, runner.name, "--point", json.dumps(point)]
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode:
            tail = (p.stderr.strip().splitlines() or ["no output"])[-1]
            raise GuildError(f"{case}: {runner.name} at {_point_label(point)} failed: {tail}")
        return Run.from_json(json.loads(p.stdout.strip().splitlines()[-1]))

    # no warm-up here: each measurement's process is fresh, and warming this one would load the model beside it
    return replace(runner, measure=measure_child, warmup=None)


def child_main(runner: Runner, point: dict) -> None:
    """The child's side: measure once, print the Run as one JSON line."""
    base = rss_now_mb()
    run = runner.measure(point)
    run.figures["rss_added_mb"] = max(0.0, peak_rss_mb() - base)
    print(json.dumps(run.to_json()))
