"""`guild bench`: workloads × strategies in one process, token-ID parity against normal, a table.

Strategies run interleaved within each repeat (normal first) so that machine noise hits them alike; every
strategy's tokens must equal normal's for the same workload and repeat, or the bench stops with an error.

Noise check: `normal` runs at least twice per workload (once more after the other strategies when --repeats is
1); the coefficient of variation (CV) of its tok/s is that workload's noise, and a ratio to normal that differs
from 1 by less than it is marked unreliable. The load average at start and end is reported beside it.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numba
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from .. import __version__
from ..engine.options import DecodeOptions, RopeOptions
from ..engine.sampling import SamplingParams
from ..errors import BadFlagError, GuildError
from ..formats.files import write_bytes
from ..kvtypes import F32_KV, KVTypes
from ..load import load_for, slots
from ..speculative import registry
from ..speculative.options import MtpOptions
from ..text.chat import run_turn
from ..workloads import load_workloads
from .replay import captured, oracle, record_instance


class ParityError(GuildError):
    pass


@dataclass
class RunRecord:
    workload: str
    strategy: str
    repeat: int
    tokens: list[list[int]]  # per turn
    generated: int  # tokens emitted by windows (the first token of each turn comes from its prefill)
    decode_s: float
    drafted: int
    accepted: int
    windows: Counter = field(default_factory=Counter)  # per window strategy
    window_sizes: list[int] = field(default_factory=list)  # T of every window
    distinct_experts: float = 0.0  # mean over windows of the mean over layers
    rounds_ms: list[float] = field(default_factory=list)  # concurrent sessions: wall time of each batched round

    @property
    def tok_s(self) -> float:
        return self.generated / self.decode_s if self.decode_s else 0.0


def machine() -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "threads": numba.get_num_threads(),
            "python": platform.python_version(), "guild": __version__}


def run_workload(lm, w, opts: DecodeOptions, repeat: int = 0) -> RunRecord:
    """One workload (all its turns) on fresh sessions with the strategy's drafter (the workload's documents as
    its corpus); with opts.sessions > 1, that many copies run concurrently (one batched forward per round) and
    must agree token for token."""
    ss = slots(lm, opts, opts.sessions, corpus_texts=w.corpus_texts())
    g = w.grammar(lm.tokenizer)
    if g is not None:  # every reply follows the schema: constrained decoding, parity-checked alike
        for s in ss:
            s.grammar = g
    rec = RunRecord(w.key, opts.strategy, repeat, [], 0, 0.0, 0, 0)
    experts = []
    for text in w.render_turns():
        turns, cs = run_turn(ss, text, chat=w.chat, max_tokens=opts.max_tokens, max_draft=opts.max_draft)
        if cs is None:
            rec.decode_s += turns[0].stats.decode_s
            rec.generated += max(turns[0].stats.generated_tokens - 1, 0)
        else:
            rec.rounds_ms += cs.rounds_ms
            rec.decode_s += cs.decode_s
            rec.generated += cs.generated_tokens
        for i, t in enumerate(turns[1:], 1):
            if t.tokens != turns[0].tokens:
                raise ParityError(f"parity failure: {w.key} {opts.strategy}: concurrent session {i} differs from "
                                  "session 0")
        rec.tokens.append(turns[0].tokens)
        for t in turns:
            for r in t.stats.windows:
                rec.drafted += r.k
                rec.accepted += r.emitted - 1
                rec.windows[r.strategy] += 1
                rec.window_sizes.append(r.k + 1)
                if r.distinct_experts:
                    experts.append(sum(r.distinct_experts) / len(r.distinct_experts))
    rec.distinct_experts = sum(experts) / len(experts) if experts else 0.0
    return rec


def _check_parity(rec: RunRecord, ref: RunRecord) -> None:
    for i, (a, b) in enumerate(zip(rec.tokens, ref.tokens, strict=True)):
        if a != b:
            at = next((j for j, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
            raise ParityError(
                f"parity failure: {rec.workload} {rec.strategy} repeat {rec.repeat} turn {i + 1} differs from "
                f"normal at generated token {at}"
            )


def _oracle(lm, w, opts: DecodeOptions, ref: RunRecord) -> float:
    """The oracle's speedup on workload w: its recording (plain decoding, every drafter asked at every position,
    so its tokens are normal's) replayed by the policy that knew each draft's fate (guild.tools.replay)."""
    wl = record_instance(lm, w, opts)
    _check_parity(RunRecord(w.key, "oracle", 0, [t["tokens"][t["n0"] - 1 :] for t in wl["turns"]], 0, 0.0, 0, 0),
                  ref)
    return oracle(wl, max_draft=opts.max_draft)


def noise(records: list[RunRecord], extra: list[RunRecord]) -> dict[str, float | None]:
    """Per workload: the CV (stdev / mean) of normal's tok/s over its runs (repeats and the noise-check run)."""
    out: dict[str, float | None] = {}
    for r in [*records, *extra]:
        out.setdefault(r.workload, None)
    for w in out:
        xs = [r.tok_s for r in [*records, *extra] if r.workload == w and r.strategy == "normal" and r.tok_s]
        out[w] = round(statistics.stdev(xs) / statistics.mean(xs), 4) if len(xs) >= 2 else None
    return out


def summarise(records: list[RunRecord], cv: dict[str, float | None] | None = None) -> list[dict]:
    """Per workload × strategy: medians over repeats, speedup vs normal of the same repeat; `reliable` is False
    where the workload's noise (cv) is at least the effect |speedup - 1|."""
    base = {(r.workload, r.repeat): r.tok_s for r in records if r.strategy == "normal"}
    cv = cv or {}
    rows = []
    for key in dict.fromkeys((r.workload, r.strategy) for r in records):
        rs = [r for r in records if (r.workload, r.strategy) == key]
        tok_s = statistics.median(r.tok_s for r in rs)
        speed = [r.tok_s / base[(r.workload, r.repeat)] for r in rs if base.get((r.workload, r.repeat))]
        drafted = sum(r.drafted for r in rs)
        sizes = [s for r in rs for s in r.window_sizes]
        wins = sum((r.windows for r in rs), Counter())
        speedup = round(statistics.median(speed), 3) if speed else None
        noise_cv = cv.get(key[0])
        reliable = None if key[1] == "normal" or speedup is None or noise_cv is None else \
            abs(speedup - 1.0) > noise_cv
        rows.append({
            "workload": key[0], "strategy": key[1], "tok_s": round(tok_s, 2),
            "ms_per_token": round(1000 / tok_s, 2) if tok_s else None,
            "speedup": speedup, "noise_cv": noise_cv, "reliable": reliable,
            "acceptance": round(sum(r.accepted for r in rs) / drafted, 3) if drafted else None,
            "mean_T": round(sum(sizes) / len(sizes), 2) if sizes else None,
            "windows": {k: int(round(v / len(rs))) for k, v in sorted(wins.items())},
            "distinct_experts": round(statistics.mean(r.distinct_experts for r in rs), 2),
            "round_ms": round(statistics.median(x for r in rs for x in r.rounds_ms), 2) if rs[0].rounds_ms else None,
            "generated": rs[0].generated,
        })
    return rows


WARMUP_TOKENS = 8  # per strategy, unmeasured, before the first repeat

LEGEND = """\
tok/s: decode tokens per second (each turn's first token, which comes from the prefill, is left out) · ms/token:
1000 / tok/s · vs normal: tok/s over normal's in the same repeat (median over repeats); "(noise)" marks a ratio
that differs from 1.00 by less than the noise; for adaptive, "N% of X×" is the share of the oracle's gain it won,
X× being the replayed speedup of a policy that knew each draft's fate (python -m guild.tools.replay) ·
acceptance: accepted drafts / drafted tokens · mean T: mean verification window size (1 root + drafts) ·
windows: verification windows per run, by the strategy that drafted them (normal = plain one-token steps) ·
experts/layer: distinct routed experts per layer per window, the union over the window's rows (dense models: 0) ·
noise: CV (stdev / mean) of normal's tok/s over its repeated runs."""


def markdown(rows: list[dict], info: dict) -> str:
    head = (f"guild {info['guild']} · {info['model']} · {info['cpu']} · {info['threads']} threads · "
            f"device {info.get('device_detail', info.get('device', 'cpu'))} · "
            f"KV {info.get('cache_type_k', 'f32')}/{info.get('cache_type_v', 'f32')} · "
            + (f"rope {rope['type']} x{rope['factor']:g} · " if (rope := info.get("rope")) and rope["type"] != "none"
               else "")
            + f"{info['sessions']} session(s) (tok/s aggregate) · {info['repeats']} repeats · {info['sampling']}\n\n"
            "| workload | strategy | tok/s | ms/token | vs normal | acceptance | mean T | windows | experts/layer |\n"
            "|---|---|---|---|---|---|---|---|---|")
    lines = [head]
    for r in rows:
        acc = f"{r['acceptance'] * 100:.0f}%" if r["acceptance"] is not None else "–"
        wins = ", ".join(f"{k} {v}" for k, v in r["windows"].items())
        flag = " (noise)" if r.get("reliable") is False else ""
        if r.get("captured") is not None:
            flag += f" · {r['captured'] * 100:.0f}% of {r['oracle']:.2f}×"
        lines.append(
            f"| {r['workload']} | {r['strategy']} | {r['tok_s']:.1f} | {r['ms_per_token'] or 0:.1f} | "
            f"{r['speedup'] or 0:.2f}×{flag} | {acc} | {r['mean_T'] or 1:.2f} | {wins} | "
            f"{r['distinct_experts']:.2f} |" + (f" {r['round_ms']:.1f} |" if r.get("round_ms") else "")
        )
    if any(r.get("round_ms") for r in rows):
        lines[0] = lines[0].replace("experts/layer |\n|", "experts/layer | round ms |\n|---|", 1)
    n = info.get("noise")
    if n:
        cvs = ", ".join(f"{w} {c * 100:.1f}%" for w, c in n["cv"].items() if c is not None) or "–"
        la, lb = n["load_start"], n["load_end"]
        lines.append(f"\nnoise: CV of normal's tok/s {cvs} · load average {la[0]:.2f} at start, {lb[0]:.2f} at end "
                     f"({n['cores']} cores)")
        if n.get("warning"):
            lines.append(f"**{n['warning']}**")
    legend = LEGEND + (" · round ms: median wall time of one batched round of all sessions."
                       if any(r.get("round_ms") for r in rows) else "")
    return "\n".join(lines) + "\n\n" + legend + "\n"


def load_warning(load_start: tuple, load_end: tuple, cores: int, rows: list[dict], threads: int = 0) -> str | None:
    """A line for a machine that was busy or noisy while the bench ran: other work took more than a core that
    the bench's `threads` needed (the end's 1-minute load average counts the bench's own threads: they are
    taken off), or ratios fell within the noise."""
    others = max(load_start[0], load_end[0] - threads)
    unreliable = sum(1 for r in rows if r.get("reliable") is False)
    why = []
    if others > max(1.0, cores - threads):
        why.append(f"load average {others:.1f} besides the bench's {threads} threads on {cores} cores")
    if unreliable:
        why.append(f"{unreliable} ratio(s) within the noise")
    return ("unreliable: " + " and ".join(why) + "; rerun on a quiet machine with --repeats 3") if why else None


def bench(model: str | None, workloads: Sequence[str] | None, strategies: Sequence[str], repeats: int = 1,
          sampling: SamplingParams | None = None, max_draft: int = 4, context: int = 8192,
          max_tokens: int | None = None, out: str | Path | None = "results", progress: bool = True,
          sessions: int = 1, gexec: str | None = None, strict_plan: bool = False, device: str = "cpu",
          mtp: MtpOptions = MtpOptions(), sampling_overrides: dict | None = None, noise_check: bool = True,
          oracle: bool = True, rope: RopeOptions = RopeOptions(), kv: KVTypes = F32_KV) -> dict:
    """`gexec`: a `guild optimize` plan whose calibrated costs seed the adaptive drafters (checked against this
    machine and model; regenerated next to it on a mismatch unless `strict_plan`). `sampling` replaces each
    workload's sampling; `sampling_overrides` (SamplingParams fields) change only those fields of it. With
    `noise_check` and one repeat, normal runs once more per workload for the noise figure. With `oracle` and
    adaptive among the strategies, each workload is also recorded (guild.tools.replay) for the speedup of a
    policy that knew each draft's fate, and adaptive's row says what share of that gain it won."""
    strategies = list(dict.fromkeys(["normal", *strategies]))
    for s in strategies:
        if s not in registry.strategies():
            raise BadFlagError(f"--strategies: unknown strategy '{s}' (choose from {', '.join(registry.strategies())})")
    if repeats < 1:
        raise BadFlagError(f"--repeats must be >= 1, got {repeats}")
    base = DecodeOptions(max_draft=max_draft, context=context, gexec=gexec, strict_plan=strict_plan, device=device,
                         mtp=mtp, sessions=sessions, rope=rope, kv=kv,
                         **({} if max_tokens is None else {"max_tokens": max_tokens}))
    lm = load_for(model, base)
    plan = lm.plan
    for s in strategies:
        lm.mtp_head(s)  # no head for `mtp`: fail before any work
    ws = []
    for w in load_workloads(workloads):
        ws += w.instances(lm.tokenizer, context)
    extra = noise_check and repeats == 1
    # (repeat, workload, strategy, noise-check run): a noise-check normal run closes each workload
    jobs = [(rep, w, s, False) for rep in range(repeats) for w in ws for s in strategies]
    if extra:
        jobs = [j for w in ws for j in [*(x for x in jobs if x[1] is w), (0, w, "normal", True)]]
    oracle = oracle and "adaptive" in strategies and sessions == 1
    jobs += [(0, w, "oracle", False) for w in ws] if oracle else []
    oracles: dict[str, float] = {}
    records: list[RunRecord] = []
    checks: list[RunRecord] = []
    ref: dict = {}
    threads = numba.get_num_threads()
    if progress:
        Console(stderr=True).print(f"warming up: {ws[0].key}, {WARMUP_TOKENS} tokens per strategy (unmeasured)")
    def sampling_of(w):
        return replace(sampling or w.sampling_params(), **(sampling_overrides or {}))

    for s in strategies:  # the first run of each strategy would pay its kernels' JIT load (or compile) in its time
        run_workload(lm, ws[0], replace(base, strategy=s, sampling=sampling_of(ws[0]), max_tokens=WARMUP_TOKENS))
    t_start = time.time()
    load_start = os.getloadavg()
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("eta"), TimeRemainingColumn(), disable=not progress, transient=True,
                  console=Console(stderr=True)) as bar:
        task = bar.add_task("bench", total=len(jobs))
        for rep, w, s, check in jobs:
            what = "noise check" if check else f"repeat {rep + 1}"
            bar.update(task, description=escape(f"{what} · {w.key} · {s}"))
            opts = replace(base, strategy="adaptive" if s == "oracle" else s, sampling=sampling_of(w),
                           max_tokens=max_tokens or w.max_tokens)
            if s == "oracle":
                oracles[w.key] = _oracle(lm, w, opts, ref[(w.key, 0)])
                bar.advance(task)
                continue
            rec = run_workload(lm, w, opts, rep)
            if s == "normal" and not check:
                ref[(w.key, rep)] = rec
            else:
                _check_parity(rec, ref[(w.key, rep)])
            (checks if check else records).append(rec)
            bar.advance(task)
    load_end = os.getloadavg()
    cv = noise(records, checks) if noise_check or repeats > 1 else {}
    rows = summarise(records, cv)
    for r in rows:
        if r["strategy"] == "adaptive" and r["workload"] in oracles and r["speedup"] is not None:
            c = captured(r["speedup"], oracles[r["workload"]])
            r["oracle"], r["captured"] = round(oracles[r["workload"]], 3), None if c is None else round(c, 3)
    cores = os.cpu_count() or 1
    sampling_desc = "workload defaults" if sampling is None else str(sampling)
    if sampling_overrides:
        sampling_desc += " with " + ", ".join(f"{k}={v}" for k, v in sampling_overrides.items())
    info = {**machine(), "model": Path(lm.path).name, "repeats": repeats, "max_draft": max_draft, "sessions": sessions,
            "plan": plan.path if plan else None, "device": "cpu" if lm.device == "cpu" else "cuda",
            "device_detail": lm.device, "device_reason": lm.device_reason, "sampling": sampling_desc,
            "context": context, "rope": lm.model.args.rope_settings(), "cache_type_k": kv.k, "cache_type_v": kv.v,
            "date": time.strftime("%Y-%m-%d %H:%M"),
            "wall_s": round(time.time() - t_start, 1),
            "noise": {"cv": cv, "load_start": [round(x, 2) for x in load_start],
                      "load_end": [round(x, 2) for x in load_end], "cores": cores,
                      "check_runs": [{"workload": r.workload, "tok_s": round(r.tok_s, 3)} for r in checks],
                      "warning": load_warning(load_start, load_end, cores, rows, threads)}}
    report = {"info": info, "rows": rows,
              "runs": [{**asdict(r), "windows": dict(r.windows), "tok_s": round(r.tok_s, 3)} for r in records]}
    md = markdown(rows, info)
    if out is not None:
        o = Path(out)
        write_bytes(o / "bench.md", md.encode(), "the bench table")
        write_bytes(o / "bench.json", json.dumps(report, indent=1, default=str).encode(), "the bench report")
    report["markdown"] = md
    return report
