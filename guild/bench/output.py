"""Records out: a table on a terminal (markdown), JSON Lines for machines, and the current-figures table that
docs/benchmarks.md opens with (`python -m guild.bench report FILE.jsonl ...`)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path

from ..errors import BadFlagError
from ..formats.files import write_bytes
from .record import FIGURES, Record


def _fmt(x: float) -> str:
    return f"{x:.3g}" if abs(x) < 10 else f"{x:.1f}"


def _cell(fig: dict) -> str:
    if "series" in fig:  # a curve by T shows its medians in order; named parts (ops) show their names
        return " ".join(_fmt(s["median"]) if k.isdigit() else f"{k} {_fmt(s['median'])}"
                        for k, s in fig["series"].items())
    spread = f" ({_fmt(fig['min'])}–{_fmt(fig['max'])})" if len(fig["runs"]) > 1 else ""
    return _fmt(fig["median"]) + spread


def markdown(records: Sequence[Record], baseline: str | None = None) -> str:
    """One row per record: its point, runner, every figure's median (spread over rounds in brackets, a curve's
    medians by T) and, beside a baseline runner at the same point, the ratio of each scalar figure."""
    if not records:
        return "(no records)"
    names = [n for n in FIGURES if any(n in r.figures for r in records)]
    base = {json.dumps(r.point, sort_keys=True): r for r in records if r.runner == baseline}
    head = ["point", "runner", *(f"{FIGURES[n].label} {FIGURES[n].unit}".strip() for n in names)]
    if base:
        head.append(f"vs {baseline}")
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for r in records:
        cells = [" ".join(f"{k}={v}" for k, v in r.point.items()), r.runner + (" ≠" if r.parity is False else "")]
        cells += [_cell(r.figures[n]) if n in r.figures else "–" for n in names]
        b = base.get(json.dumps(r.point, sort_keys=True))
        if base:
            vs = [] if b is None or b is r else [
                f"{FIGURES[n].label} {r.median(n) / b.median(n):.2f}×" for n in names
                if n in r.figures and n in b.figures and "series" not in r.figures[n] and b.median(n)]
            cells.append(", ".join(vs) or "–")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def footer(meta: dict) -> str:
    h = meta["host"]
    return (f"{h['cpu']} ({h['isa']}), {h['threads']} threads of {h['cores']} cores · commit {meta['commit']} · "
            f"load {meta['load'][0]:.2f} at start · `{meta['command']}`")


def jsonl(records: Iterable[Record]) -> str:
    return "".join(json.dumps(r.to_json()) + "\n" for r in records)


def write(records: Sequence[Record], folder: str | Path, case: str, md: str) -> None:
    """FOLDER/CASE.jsonl (one record a line) and FOLDER/CASE.md (the table)."""
    out = Path(folder)
    write_bytes(out / f"{case}.jsonl", jsonl(records).encode(), f"the {case} records")
    write_bytes(out / f"{case}.md", (md + "\n").encode(), f"the {case} table")


def read(paths: Sequence[str]) -> list[Record]:
    out = []
    for p in paths:
        try:
            lines = Path(p).read_text().splitlines()
        except OSError as e:
            raise BadFlagError(f"{p}: {e.strerror}") from None
        for i, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
                meta = {k: d[k] for k in ("commit", "host", "versions", "command", "date", "load", "load_end",
                                          "settings") if k in d}
                out.append(Record(d["case"], d["point"], d["runner"], d["figures"], d.get("parity"), meta))
            except (ValueError, KeyError, TypeError) as e:
                raise BadFlagError(f"{p}:{i}: not a benchmark record ({e})") from None
    return out


def current(records: Sequence[Record], figures: Sequence[str], baseline: str = "llama.cpp") -> str:
    """The current figures: per (case, point, figure), each guild runner beside the baseline and the ratio, with
    a note [n] naming the run that measured it (host, ISA, threads, commit, command)."""
    lines = [f"| case | point | figure | runner | median | {baseline} | ratio | run |", "|---" * 8 + "|"]
    base = {(r.case, json.dumps(r.point, sort_keys=True)): r for r in records if r.runner == baseline}
    runs: dict[tuple, int] = {}
    for r in records:
        if r.runner == baseline:
            continue
        h = r.meta.get("host", {})
        run = (f"{h.get('cpu', '?')} ({h.get('isa', '?')}), {h.get('threads', '?')} threads of {h.get('cores', '?')} "
               f"cores, commit {r.meta.get('commit', '?')}", r.meta.get("command", "?"))
        n = runs.setdefault(run, len(runs) + 1)
        b = base.get((r.case, json.dumps(r.point, sort_keys=True)))
        for name in figures:
            if name not in r.figures or "series" in r.figures[name]:
                continue
            ours, theirs = r.median(name), (b.median(name) if b and name in b.figures else None)
            lines.append(f"| {r.case} | {' '.join(f'{k}={v}' for k, v in r.point.items())} | "
                         f"{FIGURES[name].label} {FIGURES[name].unit} | {r.runner} | {_fmt(ours)} | "
                         f"{_fmt(theirs) if theirs else '–'} | {f'{ours / theirs:.2f}×' if theirs else '–'} | [{n}] |")
    lines.append("")
    lines += [f"- [{n}] {where}: `{command}`" for (where, command), n in runs.items()]
    return "\n".join(lines)
