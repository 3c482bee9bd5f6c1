"""`guild bench`: workloads x strategies in one process, token parity against normal (guild.bench's workloads case)."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape

from ...engine.options import RopeOptions
from ...engine.sampling import SamplingParams
from ...errors import GuildError
from ...kvtypes import KVTypes
from ...speculative.options import MtpOptions
from ..options import BENCH_SAMPLING, MODEL, ROPE, SESSIONS_RANGE, flag, model_arg, set_process_flags, takes
from ..output import err, fail, writable


@takes(sampling=BENCH_SAMPLING, rope=ROPE)
def command(
    model: str | None = MODEL,
    model_opt: str | None = flag("model_opt"),
    workloads: str = typer.Option("W1,W2,W3,W4,W5,W6,W7,W8,W9", "--workloads", help="Comma-separated ids (W1..W11)."),
    strategies: str = typer.Option("normal,lookup,retrieval,adaptive", "--strategies",
                                   help="Comma-separated strategies."),
    repeats: int = typer.Option(1, "--repeats", help="Repeats (strategies interleaved within each)."),
    noise_check: bool = typer.Option(True, "--noise-check/--no-noise-check", help="With one repeat, run normal once "
                                     "more per workload: its tok/s CV is the noise a ratio must beat."),
    oracle: bool = typer.Option(True, "--oracle/--no-oracle", help="With adaptive, record each workload once more "
                                "and print the share of the oracle's gain adaptive won beside its speedup."),
    max_draft: int = flag("max_draft", help="Draft tokens per window at most."),
    max_tokens: int | None = flag("max_tokens", help="Override each workload's length."),
    context: int = flag("context", 8192, "Context length (W10 sizes above it are skipped)."),
    cache_type_k: str = flag("cache_type_k"),
    cache_type_v: str = flag("cache_type_v"),
    threads: int | None = flag("threads"),
    numerics: str = flag("numerics"),
    expert_cache: str = flag("expert_cache"),
    sessions: int = flag("sessions", help=f"Concurrent sessions per run ({SESSIONS_RANGE}), batched into one "
                         "forward."),
    out: Path = typer.Option(Path("results"), "--out", help="Folder for bench.md and bench.jsonl."),
    as_json: bool = flag("as_json", help="Print the records (JSON Lines) instead of the table."),
    gexec: Path | None = flag("gexec"),
    strict_plan: bool = flag("strict_plan"),
    device: str = flag("device"),
    mtp_head: Path | None = flag("mtp_head", help="MTP head GGUF for mtp/adaptive."),
    mtp_k: int = flag("mtp_k"),
    mtp_vocab: int = flag("mtp_vocab", help="Draft LM head rows (0 = whole vocabulary)."),
    *,
    sampling: dict,
    rope: tuple,
):
    """Run workloads x strategies in one process, check token parity with normal, write a table. Sampling flags
    change those settings of every workload (the rest stay each workload's own)."""
    from ...bench.command import bench as run_bench  # deferred: the loader and the benchmarks pull in numba
    from ...load import set_threads

    try:
        writable(out / "bench.jsonl", "--out")
        model = model_arg(model, model_opt)
        set_process_flags(numerics, expert_cache)
        set_threads(threads)
        SamplingParams(**sampling)  # each value checked now, with its flag's name
        kv = KVTypes(cache_type_k, cache_type_v)
        rep = run_bench(model, [w for w in workloads.split(",") if w], [s for s in strategies.split(",") if s],
                        repeats=repeats, max_draft=max_draft, context=context, sampling_overrides=sampling,
                        max_tokens=max_tokens, out=out, sessions=sessions, noise_check=noise_check, oracle=oracle,
                        gexec=None if gexec is None else str(gexec), strict_plan=strict_plan, device=device,
                        mtp=MtpOptions(None if mtp_head is None else str(mtp_head), mtp_k, vocab=mtp_vocab), kv=kv,
                        rope=RopeOptions(*rope))
    except OSError as e:  # writing bench.md / bench.jsonl after the runs
        fail(GuildError(f"--out {out}: cannot write ({e.strerror or e})"))
    except GuildError as e:
        fail(e)
    if as_json:
        print(rep["jsonl"], end="")
    else:
        print(rep["markdown"])
        warning = rep["warning"]
        if warning:
            err.print(f"[yellow]{escape(warning)}[/]", soft_wrap=True)
        err.print(f"[dim]written to {escape(str(out / 'bench.md'))} and {escape(str(out / 'bench.jsonl'))}[/]")
