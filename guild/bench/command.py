"""`guild bench`: the workloads case (guild.bench.cases.workloads) with the options the command parsed, its
records and table written to --out as bench.jsonl and bench.md."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import numba

from ..engine.options import DecodeOptions, RopeOptions
from ..errors import BadFlagError
from ..kvtypes import F32_KV, KVTypes
from ..speculative.options import MtpOptions
from . import main, output
from .cases import workloads as case
from .cases.workloads_table import warning


def bench(model: str | None, workloads: Sequence[str], strategies: Sequence[str], repeats: int = 1,
          max_draft: int = 4, context: int = 8192, max_tokens: int | None = None, out: str | Path | None = "results",
          progress: bool = True, sessions: int = 1, gexec: str | None = None, strict_plan: bool = False,
          device: str = "cpu", mtp: MtpOptions = MtpOptions(), sampling_overrides: dict | None = None,
          noise_check: bool = True, oracle: bool = True, rope: RopeOptions = RopeOptions(),
          kv: KVTypes = F32_KV) -> dict:
    """`repeats` alternated rounds; `gexec`, a `guild optimize` plan whose calibrated costs seed the adaptive
    drafters (checked against this machine and model; regenerated beside it on a mismatch unless `strict_plan`);
    `sampling_overrides` (SamplingParams fields) change those of every workload's sampling. Returns the records,
    the table (`markdown`), the records as JSON Lines and the busy-machine `warning` (None on a quiet one)."""
    if repeats < 1:
        raise BadFlagError(f"--repeats must be >= 1, got {repeats}")
    a = argparse.Namespace(
        model=model, workloads=",".join(workloads), strategies=",".join(strategies), max_draft=str(max_draft),
        max_tokens=max_tokens, noise_check=noise_check, oracle=oracle, overrides=dict(sampling_overrides or {}),
        threads=numba.get_num_threads(), rounds=repeats, out=None if out is None else str(out),
        base=DecodeOptions(context=context, gexec=gexec, strict_plan=strict_plan, device=device, mtp=mtp,
                           sessions=sessions, rope=rope, kv=kv))
    case.check(a)
    records, md = main.run("workloads", case, a, [], stem="bench", progress=(lambda s: print(
        s, file=sys.stderr, flush=True)) if progress else (lambda s: None))
    return {"records": records, "markdown": md, "jsonl": output.jsonl(records), "warning": warning(records)}
