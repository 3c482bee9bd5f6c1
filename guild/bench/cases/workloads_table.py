"""The workloads case's table: per workload and strategy tok/s, ms/token, the speedup over normal in the same
round (marked where within the noise; for adaptive, the share of the oracle's gain it won), acceptance, window
size, tokens per window, windows by strategy and distinct experts per layer; under it the noise line, a warning
when the machine was busy or the ratios noisy, and the legend."""

from __future__ import annotations

from collections.abc import Sequence

from ...tools.replay import captured
from ..noise import cv, load_warning, within
from ..record import Record

NOISE = "noise check"  # normal once more after the others (one round): its spread with normal's is the noise
SHOWN_IN_CELLS = ("oracle", NOISE)  # runners without a row: their figures show in others' cells and the notes

LEGEND = """\
tok/s: decode tokens per second (each turn's first token, which comes from the prefill, is left out) · ms/token:
1000 / tok/s · vs normal: tok/s over normal's in the same round (median over rounds); "(noise)" marks a ratio
that differs from 1.00 by less than the noise; for adaptive, "N% of X×" is the share of the oracle's gain it won,
X× being the replayed speedup of a policy that knew each draft's fate (python -m guild.tools.replay) ·
acceptance: accepted drafts / drafted tokens · mean T: mean verification window size (1 root + drafts) ·
tokens/window: tokens a window emitted (accepted drafts + 1) · windows: verification windows per run, by the
strategy that drafted them (normal = plain one-token steps), "(+a)": that drafter's accepted drafts per window ·
experts/layer: distinct routed experts per layer per window, the union over the window's rows (dense models: 0) ·
noise: CV (stdev / mean) of normal's tok/s over its runs (its rounds and the noise check)."""


def _at(r: Record) -> tuple[str, int]:
    return r.point["workload"], r.point["max_draft"]


def _label(at: tuple[str, int], several: bool) -> str:
    return f"{at[0]} k={at[1]}" if several else at[0]


def noise_cv(records: Sequence[Record]) -> dict:
    """Per point: the CV of normal's tok/s over its runs and the noise check's."""
    runs: dict = {}
    for r in records:
        if r.runner in ("normal", NOISE):
            runs.setdefault(_at(r), []).extend(r.figures["decode_tok_s"]["runs"])
    return {at: cv(xs) for at, xs in runs.items()}


def _speedup(r: Record) -> float | None:
    return r.median("speedup") if "speedup" in r.figures else None


def warning(records: Sequence[Record]) -> str | None:
    """The busy-machine warning (guild.bench.noise), counting the ratios within their point's noise."""
    if not records:
        return None
    noise = noise_cv(records)
    unreliable = sum(1 for r in records if r.runner not in ("normal", *SHOWN_IN_CELLS)
                     and within(_speedup(r), noise.get(_at(r))))
    m = records[0].meta
    return load_warning(m["load"], m.get("load_end", m["load"]), m["host"]["cores"], m["host"]["threads"],
                        unreliable)


def table(records: Sequence[Record], a) -> str:
    s, several = a.settings, len(a.drafts) > 1
    rope = s["rope"]
    batched = s["sessions"] > 1
    head = (f"{s['model']} · device {s['device']} · KV {s['kv'][0]}/{s['kv'][1]} · "
            + (f"rope {rope['type']} x{rope['factor']:g} · " if rope and rope["type"] != "none" else "")
            + f"{s['sessions']} session(s) (tok/s aggregate) · {a.rounds} round(s) · sampling {s['sampling']}\n\n"
            "| workload | strategy | tok/s | ms/token | vs normal | acceptance | mean T | tokens/window | windows | "
            "experts/layer |" + (" round ms |" if batched else "") + "\n" + "|---" * (10 + batched) + "|")
    noise = noise_cv(records)
    oracles = {_at(r): r.median("oracle_speedup") for r in records if r.runner == "oracle"}
    lines = [head]
    for r in records:
        if r.runner in SHOWN_IN_CELLS:
            continue
        f, at, sp = r.figures, _at(r), _speedup(r)
        tok_s = r.median("decode_tok_s")
        vs = "–" if sp is None else f"{sp:.2f}×" + (" (noise)" if r.runner != "normal" and within(sp, noise.get(at))
                                                      else "")
        if r.runner == "adaptive" and at in oracles and sp is not None and (c := captured(sp, oracles[at])) is not None:
            vs += f" · {c * 100:.0f}% of {oracles[at]:.2f}×"
        acc = f"{r.median('acceptance') * 100:.0f}%" if "acceptance" in f else "–"
        apw = f["accepted_per_window"]["series"] if "accepted_per_window" in f else {}
        wins = ", ".join(f"{k} {w['median']:.0f}" + (f" (+{apw[k]['median']:.2f})" if k in apw else "")
                         for k, w in f["windows"]["series"].items() if w["median"])
        cells = [_label(at, several), r.runner, f"{tok_s:.1f}", f"{1000 / tok_s:.1f}" if tok_s else "–", vs, acc,
                 f"{r.median('window_size'):.2f}" if "window_size" in f else "1.00",
                 f"{r.median('tokens_per_window'):.2f}" if "tokens_per_window" in f else "1.00", wins,
                 f"{r.median('distinct_experts'):.2f}"]
        if batched:
            cells.append(f"{r.median('round_ms'):.1f}" if "round_ms" in f else "–")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def notes(records: Sequence[Record], a) -> list[str]:
    """The noise line, the warning in bold, the legend."""
    if not records:
        return []
    m = records[0].meta
    cvs = ", ".join(f"{_label(at, len(a.drafts) > 1)} {c * 100:.1f}%" for at, c in noise_cv(records).items()
                    if c is not None) or "–"
    la, lb = m["load"], m.get("load_end", m["load"])
    out = [f"\nnoise: CV of normal's tok/s {cvs} · load average {la[0]:.2f} at start, {lb[0]:.2f} at end "
           f"({m['host']['cores']} cores)"]
    w = warning(records)
    return out + ([f"**{w}**"] if w else []) + ["", LEGEND + (" · round ms: median wall time of one batched round "
                                                              "of all sessions." if a.settings["sessions"] > 1 else "")]
