"""Replay the adaptive scheduler offline: what it would gain on a workload, and what any policy could.

`record` decodes workloads plainly while asking every drafter (MTP included) for a proposal at every position,
and keeps each proposal, its signals and propose time, the plain step's time and V(T)/V(1) measured on windows
of the workload's own text at its context. Decoding is exact, so the token stream is the same whatever the
scheduler does: `replay` runs the real AdaptiveDrafter over the recorded proposals with modelled times (no clock,
no noise), and `oracle` finds, by dynamic programming over positions, the cheapest windows a policy that knew
which drafts would be accepted could pick. The gap between the two is what a better policy could still win;
the oracle is what better drafters or cheaper windows must raise.

    python -m guild.tools.replay record --workloads W1,W3,W5,W7,W8 -o trace.json
    python -m guild.tools.replay run trace.json
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

from ..bench.runners import guild_windows
from ..engine.options import DecodeOptions
from ..errors import GuildError
from ..formats.files import write_bytes
from ..load import load_for, slots
from ..speculative.adaptive import AdaptiveDrafter, agree
from ..speculative.base import Draft, Drafter, top1
from ..speculative.registry import DRAFTERS
from ..speculative.scheduler import Acceptance, Proposal, features
from ..text.chat import run_turn
from ..workloads import load_workloads

CATCHUP_MS_PER_ROW = 0.12  # MTP catch-up per extra lagging row (64-row catch-ups on the embedded MoE: ~0.1-0.13 ms)
OVERHEAD_MS = 0.14  # the adaptive drafter's own work per window (its process time over a replay: 0.12-0.14 ms)


class Recorder(AdaptiveDrafter):
    """Plain decoding (never drafts) that asks every drafter at every window and keeps what each proposed."""

    name = "record"

    def __init__(self, drafters: Sequence[Drafter]):
        super().__init__(drafters)
        self.turns: list[dict] = []
        self.root = 0.0

    def start(self, history: Sequence[int], prompt_start: int) -> None:
        super().start(history, prompt_start)
        self.turns.append({"prompt": [int(t) for t in history], "prompt_start": prompt_start, "windows": {}})

    def draft(self, history: Sequence[int], k: int) -> Draft:
        rec = {}
        for d in self.drafters:
            t = time.perf_counter()
            toks = d.propose(history, k) if k > 0 else np.empty(0, np.int32)
            ms = (time.perf_counter() - t) * 1e3
            rec[d.name] = {"tokens": [int(x) for x in toks], "signals": d.signals(), "ms": ms,
                           "lazy": d.lazy, "rows": int(d.catchup_rows)}
        self.turns[-1]["windows"][len(history)] = {"room": int(k), "proposals": rec, "root": self.root}
        return Draft(np.empty(0, np.int32))

    def observe_logits(self, row: np.ndarray) -> None:
        self.root = top1(row)[1]


def _window_rho(model, tokens: list[int], n0: int, max_T: int, repeats: int = 20) -> list[float]:
    """V(T)/V(1) for T = 1..max_T at the turn's context, windows cut from the turn's own output."""
    ms, _ = guild_windows(model, tokens[: n0 - 1], repeats, max_T, text=tokens[n0 - 1 :])
    return [ms[T] / ms[1] for T in ms]


def record(workloads: Sequence[str], model: str | None = None, max_draft: int = 4, context: int = 8192,
           max_tokens: int | None = None, progress: Callable[[str], None] | None = None) -> dict:
    """Decode each workload plainly (its own sampling) and record every drafter's proposal at every position."""
    opts = DecodeOptions(strategy="adaptive", max_draft=max_draft, context=context)
    lm = load_for(model, opts)
    out = {"model": Path(lm.path).name, "max_draft": max_draft, "workloads": []}
    for w in load_workloads(workloads):
        for inst in w.instances(lm.tokenizer, context):
            if progress:
                progress(f"recording {inst.key}")
            o = replace(opts, sampling=inst.sampling_params(), max_tokens=max_tokens or inst.max_tokens)
            out["workloads"].append(record_instance(lm, inst, o))
    return out


def record_instance(lm, inst, o: DecodeOptions) -> dict:
    """One workload instance decoded plainly under options `o` (strategy adaptive: its drafters are asked at every
    position), with V(T)/V(1) measured at its first turn's context: one workload of a trace."""
    ss = slots(lm, o, 1, corpus_texts=inst.corpus_texts())
    ad = ss[0].drafter
    if not isinstance(ad, AdaptiveDrafter):
        raise TypeError("replay records the adaptive strategy's drafters")
    rec = ss[0] = replace(ss[0], drafter=Recorder(ad.drafters))
    if inst.json_schema is not None:  # a constrained workload is recorded as it runs
        rec.grammar = inst.grammar(lm.tokenizer)
    turns = []
    for text in inst.render_turns():
        t = run_turn(ss, text, chat=inst.chat, max_tokens=o.max_tokens, max_draft=o.max_draft)[0][0]
        turn = rec.drafter.turns[-1]
        turns.append({
            "tokens": turn["prompt"] + [int(x) for x in t.tokens], "n0": len(turn["prompt"]) + 1,
            "max_tokens": o.max_tokens, "v1_ms": statistics.median(r.verify_ms for r in t.stats.windows),
            "windows": {str(n): v for n, v in turn["windows"].items()},
        })
    rho = _window_rho(lm.model, turns[0]["tokens"], turns[0]["n0"], o.max_draft + 1)
    return {"id": inst.key, "rho": rho, "turns": turns}


class _Replayed(Drafter):
    """A drafter that returns what was recorded at each position; its propose advances a fake clock by its
    modelled cost (recorded median; a lazy one pays catch-up per row it lagged)."""

    def __init__(self, name: str, lazy: bool, ms: float, clock: list[float]):
        self.name, self.lazy, self.ms, self.clock = name, lazy, ms, clock
        self.windows: dict = {}
        self.seen = 0  # the last position it was asked at (lazy: its cache is caught up to there)
        self._sig: dict = {}

    def propose(self, history, k):
        n = len(history)
        p = self.windows[str(n)]["proposals"][self.name]
        self.catchup_rows = max(1, n - self.seen) if self.lazy else 0
        self.clock[0] += (self.ms + CATCHUP_MS_PER_ROW * (self.catchup_rows - 1)) / 1e3
        self.seen = n
        self._sig = p["signals"]
        return np.asarray(p["tokens"][:k], np.int32)

    def signals(self):
        return self._sig


def _propose_ms(wl: dict) -> tuple[dict[str, float], dict[str, bool]]:
    """Each drafter's median recorded propose time over the workload, and whether it is lazy."""
    some = next(iter(wl["turns"][0]["windows"].values()))["proposals"]
    ms = {name: statistics.median(w["proposals"][name]["ms"] for t in wl["turns"] for w in t["windows"].values())
          for name in some}
    return ms, {name: p["lazy"] for name, p in some.items()}


def _mtp_depth(wl: dict) -> int:
    """The most MTP drafts one recorded proposal holds (the depth the recording ran with), at least 1."""
    return max([1] + [len(w["proposals"]["mtp"]["tokens"]) for t in wl["turns"] for w in t["windows"].values()
                      if "mtp" in w["proposals"]])


def _accepted(tokens: list[int], n: int, end: int, draft: Sequence[int]) -> int:
    a = 0
    while a < len(draft) and n + a < end and tokens[n + a] == draft[a]:
        a += 1
    return a


def _rho(wl: dict, flatten: float) -> list[float]:
    """The workload's V(T)/V(1), its growth scaled by `flatten` (1: as recorded; 0.5: half as steep)."""
    return [1.0 + flatten * (r - 1.0) for r in wl["rho"]]


def replay(wl: dict, make: Callable | None = None, max_draft: int = 4, flatten: float = 1.0) -> dict:
    """The adaptive drafter (`make(drafters, clock)`, default AdaptiveDrafter) over one recorded
    workload. Besides the speedup: the drafters' share of decode time (the asking cost) and, for every proposal,
    the acceptance the scheduler predicted for each draft position beside what happened (`calibration`)."""
    clock = [0.0]
    ms, lazy = _propose_ms(wl)
    rho = _rho(wl, flatten)
    fakes = [_Replayed(name, lazy[name], ms[name], clock) for name in ms]

    ad = (make or (lambda ds, c: AdaptiveDrafter(ds, clock=c, mtp_cap_k=_mtp_depth(wl))))(fakes, lambda: clock[0])
    t_plain = t_ad = t_draft = 0.0
    n_win = drafted = accepted = 0
    ks: list[int] = []
    calib: list[tuple[str, int, float, int]] = []  # (strategy, draft position, predicted, accepted 0/1)
    for turn in wl["turns"]:
        h, n0 = turn["tokens"], turn["n0"]
        end, v1 = len(h), turn["v1_ms"]
        for f in fakes:
            f.windows, f.seen = turn["windows"], n0 - 1
        ad.start(h[: n0 - 1], n0 - 1)
        n = n0
        t_plain += (end - n0) * v1
        while n < end:
            room = min(turn["max_tokens"] - (n - n0 + 1) - 1, max_draft)
            c0 = clock[0]
            dr = ad.draft(h[:n], room) if room > 0 else None
            draft = list(dr.tokens)[:room] if dr is not None else []
            d_ms = (clock[0] - c0) * 1e3 + OVERHEAD_MS
            ad.ask_ms = d_ms  # what the scheduler learns from: the modelled proposes and the drafter's own work
            for p, pos in ad.pending:
                if pos == n:
                    calib += _calibration(p, ad.scheduler.acceptance(p, len(p.tokens)), _accepted(h, n, end, p.tokens),
                                          end - n)
            a = _accepted(h, n, end, draft)
            e = min(a + 1, end - n)
            v_ms = v1 * rho[len(draft)]
            ad.observe(dr.strategy if draft else "normal", len(draft), d_ms, v_ms, e)
            t_ad += d_ms + v_ms
            t_draft += d_ms
            n_win, drafted, accepted = n_win + 1, drafted + len(draft), accepted + a
            if draft:
                ks.append(len(draft))
            n += e
    return {"speedup": t_plain / t_ad, "windows": n_win, "drafted": drafted, "accepted": accepted,
            "mean_k": sum(ks) / len(ks) if ks else 0.0, "asking": t_draft / t_ad, "calibration": calib}


def _calibration(p, probs: Sequence[float], a: int, left: int) -> list[tuple[str, int, float, int]]:
    """Each draft position the text reached (its predecessors accepted, its token emitted): predicted vs kept."""
    return [(p.strategy, i + 1, probs[i], int(a > i)) for i in range(min(len(probs), left, a + 1))]


def oracle(wl: dict, strategies: Sequence[str] | None = None, max_draft: int = 4, flatten: float = 1.0) -> float:
    """Speedup of the cheapest windows a policy that knew each draft's accepted length could choose from the same
    proposals (each paying only the drafter it uses, at its recorded median propose time)."""
    t_plain = t_best = 0.0
    ms, _ = _propose_ms(wl)
    rho = _rho(wl, flatten)
    for turn in wl["turns"]:
        h, n0, v1 = turn["tokens"], turn["n0"], turn["v1_ms"]
        end = len(h)
        best = [0.0] * (end + 1)
        for n in range(end - 1, n0 - 1, -1):
            c = v1 + best[n + 1]
            w = turn["windows"].get(str(n))
            for name, p in (w["proposals"].items() if w else ()):
                if strategies is not None and name not in strategies:
                    continue
                a = _accepted(h, n, end, p["tokens"])
                for k in range(1, min(len(p["tokens"]), max_draft, w["room"]) + 1):
                    c = min(c, ms[name] + v1 * rho[k] + best[min(n + min(a, k) + 1, end)])
            best[n] = c
        t_plain += (end - n0) * v1
        t_best += best[n0]
    return t_plain / t_best


def outcomes(wl: dict, max_draft: int = 4) -> dict[str, list[tuple[dict[str, float], int]]]:
    """Per drafter, every recorded proposal's acceptance-model inputs (agreement marked as the adaptive drafter
    marks it) with each draft position the text reached: kept (1) or not (0)."""
    out: dict[str, list] = {}
    for turn in wl["turns"]:
        h = turn["tokens"]
        end = len(h)
        for n, w in turn["windows"].items():
            props = [Proposal(s, tuple(p["tokens"]), dict(p["signals"])) for s, p in w["proposals"].items()]
            for p in props:
                if not p.tokens:
                    continue
                agree(p.signals, p.strategy, p.tokens, props)
                a = _accepted(h, int(n), end, p.tokens[:max_draft])
                x = features(p.strategy, p.signals)
                for i in range(min(len(p.tokens), max_draft, end - int(n), a + 1)):
                    out.setdefault(p.strategy, []).append((x if i == 0 else {**x, "deep": 1.0}, int(a > i)))
    return out


def fit(rows: Sequence[tuple[dict[str, float], int]], l2: float = 1.0) -> dict[str, float]:
    """Logistic-regression weights of the acceptance model over (inputs, kept) rows: Newton's method on the
    log-likelihood with an L2 penalty (pooled over workloads: the drafters' priors; over one: its ceiling)."""
    names = sorted({n for x, _ in rows for n in x})
    x = np.array([[r.get(n, 0.0) for n in names] for r, _ in rows])
    y = np.array([v for _, v in rows], float)
    w = np.zeros(len(names))
    for _ in range(30):
        p = 1.0 / (1.0 + np.exp(-x @ w))
        w -= np.linalg.solve((x * (p * (1 - p))[:, None]).T @ x + l2 * np.eye(len(names)), x.T @ (p - y) + l2 * w)
    return dict(zip(names, w.tolist(), strict=True))


class _Fitted(Acceptance):
    """The acceptance model with its weights fixed in hindsight, learning nothing."""

    def __init__(self, cfg, weights: dict[str, dict[str, float]]):
        super().__init__(cfg)
        self.fixed = weights

    def _w(self, strategy: str, name: str) -> float:
        return self.fixed.get(strategy, {}).get(name, 0.0)

    def learn(self, strategy: str, x: dict[str, float], y: int) -> None:
        pass


def fitted(wl: dict, max_draft: int = 4, flatten: float = 1.0) -> float:
    """Speedup of the scheduler whose acceptance model was fitted to this workload's own outcomes: the most its
    signals could tell a causal policy (the oracle knows more: which drafts will be kept)."""
    weights = {s: fit(rows) for s, rows in outcomes(wl, max_draft).items()}

    def make(ds, clock):
        ad = AdaptiveDrafter(ds, clock=clock, mtp_cap_k=_mtp_depth(wl))
        ad.scheduler.acc = _Fitted(ad.scheduler.cfg, weights)
        return ad
    return replay(wl, make, max_draft, flatten)["speedup"]


def fit_priors(tr: dict, workloads: Sequence[str] | None = None) -> dict[str, dict]:
    """The acceptance model fitted to the pooled outcomes of a trace's workloads (ids, or their W-prefix:
    W10 pools every W10 size), per drafter in the form the drafters declare: each bucket's acceptance at
    typical features (the sigmoid of bias + bucket weight), the feature weights, and `deep`."""
    rows: dict[str, list] = {}
    for wl in tr["workloads"]:
        if workloads is None or wl["id"] in workloads or wl["id"].split("@")[0] in workloads:
            for s, r in outcomes(wl, tr["max_draft"]).items():
                rows.setdefault(s, []).extend(r)
    out = {}
    for s, r in rows.items():
        w = fit(r)
        bias = w.pop("bias", 0.0)
        out[s] = {"priors": {n[2:]: round(1 / (1 + math.exp(-(bias + v))), 2) for n, v in w.items() if n[:2] == "b:"},
                  "weights": {n: round(v, 2) for n, v in w.items() if n[:2] != "b:" and n != "deep"},
                  "deep": round(w.get("deep", 0.0), 2)}
    return out


def load_trace(path: str | Path) -> dict:
    """A trace written by `record`, checked for the fields replay reads."""
    try:
        tr = json.loads(Path(path).read_text())
        for wl in tr["workloads"]:
            if len(wl["rho"]) < tr["max_draft"] + 1 or not wl["turns"]:
                raise ValueError(f"workload {wl['id']}: V(T) for T = 1..{tr['max_draft'] + 1} and turns needed")
            for t in wl["turns"]:
                if not (1 <= t["n0"] <= len(t["tokens"]) and t["v1_ms"] > 0 and t["windows"]):
                    raise ValueError(f"workload {wl['id']}: a turn without tokens, windows or plain-step time")
    except OSError as e:
        raise GuildError(f"replay trace {path}: {e.strerror or e}") from None
    except (ValueError, KeyError, TypeError) as e:
        raise GuildError(f"replay trace {path}: not a trace written by `replay record` ({e})") from None
    return tr


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m guild.tools.replay", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record", help="decode workloads plainly, recording every drafter's proposals")
    r.add_argument("--workloads", default="W1,W3,W5,W7,W8")
    r.add_argument("--model", default=None)
    r.add_argument("--max-tokens", type=int, default=None)
    r.add_argument("-o", "--out", default="replay-trace.json")
    p = sub.add_parser("run", help="replay the scheduler over a recorded trace; print it beside the oracle")
    p.add_argument("trace")
    p.add_argument("--flatten", type=float, default=1.0,
                   help="scale the growth of V(T)/V(1) (0.5: half as steep), as a cheaper window would")
    p.add_argument("--json", action="store_true")
    f = sub.add_parser("fit", help="fit the acceptance model to a trace's outcomes, pooled: the drafters' priors")
    f.add_argument("trace")
    f.add_argument("--workloads", default=None, help="the workloads to pool (default: all)")
    a = ap.parse_args(argv)
    if a.cmd == "record":
        tr = record(a.workloads.split(","), a.model, max_tokens=a.max_tokens, progress=print)
        write_bytes(Path(a.out), json.dumps(tr).encode(), "the replay trace")
        print(f"written to {a.out}")
        return
    if a.cmd == "fit":
        for s, w in fit_priors(load_trace(a.trace), a.workloads.split(",") if a.workloads else None).items():
            print(f"{s}: priors {w['priors']}, weights {w['weights']}, deep {w['deep']}")
        return
    if not a.flatten > 0:
        raise GuildError(f"--flatten must be > 0, got {a.flatten}")
    rows, calib = run(load_trace(a.trace), a.flatten)
    if a.json:
        print(json.dumps({"workloads": rows, "calibration": calib}, indent=1))
        return
    print("| workload | replayed adaptive | oracle | captured | fitted (captured) | oracle without MTP | windows "
          "| drafted | accepted | mean k | asking | V(T)/V(1) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for x in rows:
        cap, fcap = ("–" if c is None else f"{c:.0%}" for c in (x["captured"], x["fitted_captured"]))
        print(f"| {x['workload']} | {x['speedup']:.3f}× | {x['oracle']:.3f}× | {cap} | {x['fitted']:.3f}× ({fcap}) | "
              f"{x['oracle_no_mtp']:.3f}× | {x['windows']} | {x['drafted']} | {x['accepted']} | {x['mean_k']:.2f} | "
              f"{x['asking']:.1%} | {', '.join(f'{v:.2f}' for v in x['rho'])} |")
    print("\nCalibration: the acceptance the scheduler predicted for each draft position the text reached, "
          "beside how often it was kept")
    print("| drafter | position | predicted | n | mean predicted | observed |")
    print("|---|---|---|---|---|---|")
    for c in calib:
        print(f"| {c['strategy']} | {c['position']} | {c['bin']} | {c['n']} | {c['predicted']:.2f} | "
              f"{c['observed']:.2f} |")


def captured(speedup: float, oracle_speedup: float) -> float | None:
    """The share of the oracle's gain over plain decoding that the scheduler won (None: there is none to win)."""
    return (speedup - 1.0) / (oracle_speedup - 1.0) if oracle_speedup > 1.0 + 1e-9 else None


BINS = (0.0, 0.2, 0.4, 0.6, 0.8, 0.9, 1.0)  # predicted-acceptance bins of the calibration table


def calibration(calib: Sequence[tuple[str, int, float, int]]) -> list[dict]:
    """Predicted against observed acceptance per drafter, first draft and deeper ones, per predicted bin."""
    groups: dict[tuple, list[tuple[float, int]]] = {}
    for s, i, q, ok in calib:
        j = 1 + sum(q >= b for b in BINS[1:-1])
        groups.setdefault((s, "1" if i == 1 else "2+", j), []).append((q, ok))
    return [{"strategy": s, "position": pos, "bin": f"{BINS[j - 1]:.1f}–{BINS[j]:.1f}", "n": len(v),
             "predicted": sum(q for q, _ in v) / len(v), "observed": sum(ok for _, ok in v) / len(v)}
            for (s, pos, j), v in sorted(groups.items())]


def run(tr: dict, flatten: float = 1.0) -> tuple[list[dict], list[dict]]:
    """Every workload of a trace replayed beside the oracle (with and without MTP), and the pooled calibration."""
    rows, calib = [], []
    md = tr["max_draft"]
    for wl in tr["workloads"]:
        res = replay(wl, max_draft=md, flatten=flatten)
        calib += res.pop("calibration")
        orc = oracle(wl, max_draft=md, flatten=flatten)
        fit_s = fitted(wl, md, flatten)
        rows.append({"workload": wl["id"], **res, "oracle": orc, "captured": captured(res["speedup"], orc),
                     "fitted": fit_s, "fitted_captured": captured(fit_s, orc),
                     "oracle_no_mtp": oracle(wl, [n for n, d in DRAFTERS.items() if not d.uses_head], md, flatten),
                     "rho": [round(x, 3) for x in _rho(wl, flatten)]})
    return rows, calibration(calib)


if __name__ == "__main__":
    try:
        main()
    except GuildError as e:
        raise SystemExit(f"error: {e}") from None
