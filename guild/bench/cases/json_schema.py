"""JSON-schema constrained decoding, exact under speculation: validity, parity, and what the constraint costs.

Points: --objects objects (built-in schemas x prompts, or --schemas FILE's) greedy, then seeded (object k with
seed 1234 + k), then --workload (W11). Runners: each of --strategies (normal, the reference, always) held to each
reply's schema by constrained decoding: the share of replies that validate (jsonschema), decode tok/s, draft
acceptance, drafts the grammar forced; their tokens must equal normal's. "normal/adaptive unconstrained": as many
tokens without the grammar (its cost); "mask": llguidance's mask per token, replaying normal's replies. An invalid
reply (or a matcher's error) is listed after the report and makes the exit status 1.

    python -m guild.bench json_schema -t 2 --rounds 1 [--objects 10] [--strategies lookup,adaptive]
"""

from __future__ import annotations

import sys

from ...engine.options import DecodeOptions
from ...errors import BadFlagError
from ...load import load_for
from ...speculative import registry
from .. import constrained as C
from .. import schemas as S
from ..harness import Run, Runner
from ..record import ratio

ROUNDS = 1
BASELINE = "normal"
UNCONSTRAINED = ("normal", "adaptive")  # also run without the grammar, when among --strategies


def add_args(ap) -> None:
    ap.add_argument("--model", default="smollm2-135m-moe", help="a GGUF path or tag (default: %(default)s)")
    ap.add_argument("--objects", type=int, default=len(S.SCHEMAS) * len(S.PROMPTS),
                    help="objects per sampling (default %(default)s: every schema with every prompt)")
    ap.add_argument("--strategies", default=",".join(registry.strategies()), help="normal, the reference, always runs")
    ap.add_argument("--max-tokens", type=int, default=192, help="per reply (default: %(default)s)")
    ap.add_argument("--max-draft", type=int, default=4, help="(default: %(default)s)")
    ap.add_argument("--schemas", help="a JSON list of {\"subject\", \"schema\"} objects instead of the built-in ones")
    ap.add_argument("--workload", default="W11", help="a schema-following workload as a point too ('' for none)")


def check(a) -> None:
    known = registry.strategies()
    a.strategy_list = list(dict.fromkeys(["normal", *filter(None, a.strategies.split(","))]))
    if bad := [s for s in a.strategy_list if s not in known]:
        raise BadFlagError(f"--strategies: unknown strategy '{bad[0]}' (choose from {', '.join(known)})")
    schemas = S.read_schemas(a.schemas) if a.schemas else S.SCHEMAS
    if not 1 <= a.objects <= len(schemas) * len(S.PROMPTS):
        raise BadFlagError(f"--objects must be in 1..{len(schemas) * len(S.PROMPTS)}, got {a.objects}")
    a.opts = DecodeOptions(max_draft=a.max_draft, max_tokens=a.max_tokens)
    a.lm = lm = load_for(a.model, a.opts, threads=a.threads)
    for s in a.strategy_list:
        lm.mtp_head(s)  # `mtp` on a model without a head: fail before any work
    a.jobs = C.object_jobs(lm, schemas, a.objects, a.max_tokens)
    if a.workload:
        a.jobs[a.workload] = [C.workload_job(lm, a.workload, a.opts.context)]
    for s in a.strategy_list:
        lm.warm_up(s, a.opts.mtp)  # kernels compiled before anything is timed
    a.replies, a.failures = {}, []


def points(a) -> list[dict]:
    return [{"sampling": "greedy"}, {"sampling": "seeded"}] + ([{"workload": a.workload}] if a.workload else [])


def _key(pt) -> str:
    return pt.get("workload") or pt["sampling"]


def _fail(a, msg: str) -> None:
    if msg not in a.failures:
        a.failures.append(msg)
        print(f"failure: {msg}", file=sys.stderr, flush=True)


def _constrained(a, strategy: str, pt) -> Run:
    turns, valid, where = [], 0, f"{strategy} {_key(pt)}"
    for job in a.jobs[_key(pt)]:
        t = C.reply(a.lm, a.opts.with_strategy(strategy), job)
        ok = not isinstance(t, str) and S.valid(t.text, job.schema)
        if isinstance(t, str):
            _fail(a, f"{job.label} {where}: {t}")
        elif not ok:
            _fail(a, f"{job.label} {where}: does not validate ({t.stats.stop_reason}): {t.text[:120]!r}")
        valid += ok
        turns.append(t)
    toks = [[] if isinstance(t, str) else [int(x) for x in t.tokens] for t in turns]
    if strategy == "normal":
        a.replies[_key(pt)] = toks
    figs = {"valid": valid / len(turns), **C.tally([t for t in turns if not isinstance(t, str)])}
    return Run(figs, [t for r in toks for t in (*r, -1)])  # -1 between replies: a reply's end is compared too


def _unconstrained(a, strategy: str, pt) -> Run:
    """As many tokens as constrained normal's reply, so that both decode the same positions."""
    turns = [C.reply(a.lm, a.opts.with_strategy(strategy), job, False, max(len(ref), 1))
             for job, ref in zip(a.jobs[_key(pt)], a.replies[_key(pt)], strict=True)]
    return Run({"decode_tok_s": C.tally(turns)["decode_tok_s"]})


def runners(a) -> list[Runner]:
    out = [Runner(s, lambda pt, s=s: _constrained(a, s, pt), exact=s != "normal", reference=s == "normal")
           for s in a.strategy_list]
    out += [Runner(f"{s} unconstrained", lambda pt, s=s: _unconstrained(a, s, pt)) for s in UNCONSTRAINED
            if s in a.strategy_list]
    mask = Runner("mask", lambda pt: Run(C.mask_cost(a.lm, list(zip(a.jobs[_key(pt)], a.replies[_key(pt)],
                                                                        strict=True)))))
    return [*out, mask]


def notes(records, a) -> list[str]:
    by = {(r.runner, _key(r.point)): r for r in records}
    out = [f"\nconstrained / unconstrained {s}, {k}: {ratio(r, by[(s + ' unconstrained', k)], 'decode_tok_s'):.2f}×"
           for (s, k), r in by.items() if (s + " unconstrained", k) in by]
    return out + ([f"\n**{len(a.failures)} failure(s)**:"] + [f"- {f}" for f in a.failures] if a.failures else [])


def failed(a) -> bool:
    return bool(a.failures)
