"""Constrained decoding as the json_schema case measures it: a job (one prompt, the schema and grammar its reply
follows, its sampling), one reply to it on a fresh session, and what the grammar's mask costs per token."""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass, replace

from ..engine.constraint import ConstraintError
from ..engine.options import DecodeOptions
from ..engine.sampling import GREEDY, SamplingParams
from ..errors import BadFlagError
from ..load import slots
from ..text.chat import run_turn
from ..text.grammar import compile_grammar, constraint
from ..workloads import load_workloads
from .schemas import objects

SEEDED = SamplingParams(temperature=0.8, top_p=0.95, seed=1234)  # object k draws with seed 1234 + k


@dataclass(frozen=True)
class Job:
    label: str  # in failure messages: "object 3 (product)", "W11"
    prompt: str
    schema: dict
    grammar: object
    sampling: object  # SamplingParams
    max_tokens: int
    corpus: tuple[str, ...]  # the retrieval drafter's


def object_jobs(lm, schemas, n: int, max_tokens: int) -> dict[str, list[Job]]:
    """n objects of `schemas` (schemas.objects), greedy and seeded; each schema compiled once (a GrammarError
    names it), and its text the retrieval drafter's corpus."""
    objs = objects(schemas, n)
    grammars = [compile_grammar("json_schema", schema, lm.tokenizer, f"schema {i} ({subject})")
                for i, (subject, schema) in enumerate(schemas[:n])]
    return {name: [Job(f"object {o.index} ({o.subject})", o.prompt, o.schema, grammars[o.index % len(schemas)],
                       sp if sp is GREEDY else replace(sp, seed=sp.seed + o.index), max_tokens,
                       (json.dumps(o.schema),)) for o in objs] for name, sp in (("greedy", GREEDY), ("seeded", SEEDED))}


def workload_job(lm, wid: str, context: int) -> Job:
    """A schema-following workload's one turn, held to its own schema."""
    (w,) = load_workloads([wid])
    (inst,) = w.instances(lm.tokenizer, context)
    if inst.json_schema is None or len(inst.turns) != 1:
        raise BadFlagError(f"--workload {wid}: not a one-turn schema-following workload (json_schema)")
    return Job(inst.key, inst.render_turns()[0], json.loads(inst.texts[inst.json_schema]), inst.grammar(lm.tokenizer),
               inst.sampling_params(), inst.max_tokens, tuple(inst.corpus_texts()))


def reply(lm, opts: DecodeOptions, job: Job, constrained: bool = True, max_tokens: int | None = None):
    """One reply on a fresh session with the job's sampling and corpus: the Turn, or the error of a matcher that
    failed (a string)."""
    s = slots(lm, replace(opts, sampling=job.sampling), 1, corpus_texts=list(job.corpus))[0]
    s.grammar = job.grammar if constrained else None
    try:
        turns, _ = run_turn([s], job.prompt, chat=True, max_tokens=max_tokens or job.max_tokens,
                            max_draft=opts.max_draft)
    except ConstraintError as e:
        return str(e)
    return turns[0]


def tally(turns) -> dict:
    """Decode tok/s over the turns (each one's first token is its prefill's), drafts the grammar forced, and the
    draft acceptance when there were drafts."""
    ws = [r for t in turns for r in t.stats.windows]
    dec_s = sum(t.stats.decode_s for t in turns)
    out = {"decode_tok_s": sum(max(t.stats.generated_tokens - 1, 0) for t in turns) / dec_s if dec_s else 0.0,
           "forced": sum(r.forced for r in ws)}
    if drafted := sum(r.k for r in ws):
        out["acceptance"] = sum(r.emitted - 1 for r in ws) / drafted
    return out


class _TimedMatcher:
    """llguidance's matcher with `compute_bitmask` timed around the call (microseconds in `us`)."""

    def __init__(self, matcher):
        self.matcher, self.us = matcher, []

    def compute_bitmask(self):
        t0 = time.perf_counter()
        out = self.matcher.compute_bitmask()
        self.us.append((time.perf_counter() - t0) * 1e6)
        return out

    def __getattr__(self, name):
        return getattr(self.matcher, name)


def mask_cost(lm, replies: list[tuple[Job, list[int]]]) -> dict:
    """Microseconds per token of the grammar's mask, replaying each job's reply through a fresh matcher: the
    median and 90th percentile of llguidance's `compute_bitmask` alone, and the median of all of
    Constraint.allowed (the bitmask unpacked to the sampler's bool vector)."""
    bitmask, allowed = [], []
    for job, toks in replies:
        c = constraint(job.grammar, lm.tokenizer)
        c.matcher = timed = _TimedMatcher(c.matcher)
        for tok in toks:
            if tok in c.eos_ids:
                break
            t0 = time.perf_counter()
            c.allowed(c.vocab)
            allowed.append((time.perf_counter() - t0) * 1e6)
            c.advance(tok)
        bitmask += timed.us
    if not bitmask:
        return {}
    p90 = statistics.quantiles(bitmask, n=10)[8] if len(bitmask) > 1 else bitmask[0]
    return {"mask_us": statistics.median(bitmask), "mask_p90_us": p90, "allowed_us": statistics.median(allowed)}
