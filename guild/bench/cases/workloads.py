"""Workloads × strategies, `guild bench`: each workload (W10 at each size the context holds) under normal and the
speculative strategies in one process, their tokens held to normal's. Per strategy: decode tok/s and its speedup
over normal's in the same round, acceptance, window size, windows by strategy, distinct experts per layer; with
adaptive, the oracle's speedup (guild.tools.replay) and the share of its gain adaptive won. With one round normal
runs once more at the end (the noise check): the CV of its tok/s is the noise a ratio must beat.

    python -m guild.bench workloads --workloads W2,W9 --strategies lookup,adaptive -r 3
    python -m guild.bench workloads smollm2-135m-moe --workloads W2,W7 --strategies lookup,retrieval --max-draft 1,2,3,4
"""

from __future__ import annotations

import statistics
from dataclasses import replace
from pathlib import Path

from ...engine.options import DecodeOptions
from ...errors import BadFlagError
from ...load import load_for
from ...speculative import registry
from ...tools.replay import oracle, record_instance
from ...workloads import load_workloads
from .. import runners as R
from ..harness import Run, Runner
from . import workloads_table
from .workloads_table import NOISE

ROUNDS = 1
SPEEDUP_OF = "decode_tok_s"
WARMUP_TOKENS = 8  # per strategy, once, unmeasured: its first run would pay its kernels' JIT load or compile
WINDOWS = ("normal", *registry.DRAFTERS)  # what drafted a window
table, notes = workloads_table.table, workloads_table.notes  # the harness's hooks: this case's own table


def add_args(ap) -> None:
    ap.add_argument("model", nargs="?", help="a tag or GGUF path (default: the embedded model)")
    ap.add_argument("--workloads", default="W1,W2,W3,W4,W5,W6,W7,W8,W9", help="comma-separated ids (W1..W11)")
    ap.add_argument("--strategies", default="normal,lookup,retrieval,adaptive", help="comma-separated; normal runs")
    ap.add_argument("--max-draft", default="4", help="draft tokens per window at most; several (1,2,3,4): points")
    ap.add_argument("-n", "--max-tokens", type=int, help="tokens per reply (default: each workload's)")
    ap.add_argument("-c", "--context", type=int, default=8192, help="context (W10 sizes above it are skipped)")
    ap.add_argument("--sessions", type=int, default=1, help="concurrent sessions per run, batched into one forward")
    ap.add_argument("--no-noise-check", dest="noise_check", action="store_false", help="no extra normal run")
    ap.add_argument("--no-oracle", dest="oracle", action="store_false", help="no oracle with adaptive")
    ap.set_defaults(base=None, overrides={})  # `guild bench` sets both: its plan, device, KV, rope, MTP; sampling


def check(a) -> None:
    a.strategy_list = list(dict.fromkeys(["normal", *filter(None, a.strategies.split(","))]))
    for s in a.strategy_list:
        if s not in registry.strategies():
            raise BadFlagError(f"--strategies: unknown strategy '{s}' (choose from {', '.join(registry.strategies())})")
    try:
        a.drafts = [int(k) for k in a.max_draft.split(",")]
    except ValueError:
        raise BadFlagError(f"--max-draft takes comma-separated integers, got '{a.max_draft}'") from None
    a.base = a.base or DecodeOptions(context=a.context, sessions=a.sessions)
    for k in a.drafts:  # each checked now, with its flag's name
        replace(a.base, max_draft=k, max_tokens=a.max_tokens if a.max_tokens is not None else a.base.max_tokens)
    a.lm = load_for(a.model, a.base)
    for s in a.strategy_list:
        a.lm.mtp_head(s)  # no head for `mtp`: fail before any work
    ws = load_workloads(list(filter(None, a.workloads.split(","))))
    a.instances = {i.key: i for w in ws for i in w.instances(a.lm.tokenizer, a.base.context)}
    kv, plan, over = a.base.kv, a.lm.plan, ", ".join(f"{k}={v}" for k, v in a.overrides.items())
    a.settings = {"model": Path(a.lm.path).name, "device": a.lm.device, "device_reason": a.lm.device_reason,
                  "plan": plan.path if plan else None, "context": a.base.context, "kv": [kv.k, kv.v],
                  "rope": a.lm.model.args.rope_settings(), "sessions": a.base.sessions,
                  "sampling": "workload defaults" + (f" with {over}" if over else "")}


def points(a) -> list[dict]:
    return [{"workload": key, "max_draft": k} for key in a.instances for k in a.drafts]


def _opts(a, pt: dict, strategy: str) -> DecodeOptions:
    w = a.instances[pt["workload"]]
    return a.base.with_strategy(strategy, max_draft=pt["max_draft"], max_tokens=a.max_tokens or w.max_tokens,
                   sampling=replace(w.sampling_params(), **a.overrides))


def _strategy(a, name: str, strategy: str, warmed: set) -> Runner:
    def measure(pt):
        r = R.guild_workload(a.lm, a.instances[pt["workload"]], _opts(a, pt, strategy))
        figs = {"decode_tok_s": r.tok_s, "generated_tokens": r.generated,
                "windows": {s: r.windows[s] for s in WINDOWS},
                "accepted_per_window": {s: r.accepted_by[s] / r.windows[s] if r.windows[s] else 0.0
                                        for s in WINDOWS[1:]},
                "distinct_experts": statistics.mean(r.experts) if r.experts else 0.0}
        if r.drafted:
            figs["acceptance"] = r.accepted / r.drafted
        if r.sizes:
            figs["window_size"], figs["tokens_per_window"] = statistics.mean(r.sizes), statistics.mean(r.emitted)
        if r.rounds_ms:
            figs["round_ms"] = statistics.median(r.rounds_ms)
        return Run(figs, r.tokens)

    def warm(pt):
        if strategy not in warmed:
            warmed.add(strategy)
            R.guild_workload(a.lm, a.instances[pt["workload"]], replace(_opts(a, pt, strategy),
                                                                         max_tokens=WARMUP_TOKENS))

    return Runner(name, measure, exact=name != "normal", reference=name == "normal", warmup=warm)


def _oracle(a) -> Runner:
    """Plain decoding, every drafter asked everywhere, replayed knowing each draft's fate: one round (deterministic)."""
    def measure(pt):
        wl = record_instance(a.lm, a.instances[pt["workload"]], _opts(a, pt, "adaptive"))
        return Run({"oracle_speedup": oracle(wl, max_draft=pt["max_draft"])},
                   [x for t in wl["turns"] for x in t["tokens"][t["n0"] - 1:]])

    return Runner("oracle", measure, exact=True, once=True)


def runners(a) -> list[Runner]:
    warmed: set = set()
    out = [_strategy(a, s, s, warmed) for s in a.strategy_list]
    if a.oracle and "adaptive" in a.strategy_list and a.base.sessions == 1:
        out.append(_oracle(a))
    return out + ([_strategy(a, NOISE, "normal", warmed)] if a.noise_check and a.rounds == 1 else [])
