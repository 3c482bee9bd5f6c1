"""`guild train-mtp`: train a multi-token-prediction draft head for a base model (guild.tools.train_mtp)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from ...errors import GuildError
from ..options import MODEL, flag
from ..output import err, fail, writable

SETTINGS = dict(help=(
    "Train a multi-token-prediction (MTP) draft head for a base model, the base frozen → a GGUF head file. "
    "Training data: Python standard library sources and Python's documentation (pydoc_data.topics), both under the "
    "PSF License, and the base's own greedy generations on guild's training prompts (kept disjoint from the "
    "benchmark workloads); targets are the base's greedy tokens (self-distillation), ~5% of the documents are held "
    "out for the acceptance figure. The defaults take about an hour on the embedded smollm2-135m-moe with 2 "
    "threads. Needs torch: pip install 'guild\\[train]'."))


def command(
    model: str | None = MODEL,
    output: Path = typer.Option(..., "-o", "--output", help="The MTP head to write (GGUF). Checkpoints and the "
                                "teacher data go to OUTPUT.ckpt/."),
    steps: int = typer.Option(300, "--steps", help="Optimizer steps."),
    text_tokens: int = typer.Option(200000, "--text-tokens", help="Tokens of Python standard library sources and "
                                    "Python documentation, teacher-forced through the base."),
    gen_tokens: int = typer.Option(60000, "--gen-tokens", help="Tokens the base generates (greedy, chat template) "
                                   "on guild's training prompts, then teacher-forced."),
    seq_len: int = typer.Option(512, "--seq-len", help="Tokens per teacher-forced chunk (state reset per chunk)."),
    batch: int = typer.Option(8, "--batch", help="Chunks per optimizer step."),
    lr: float = typer.Option(1e-3, "--lr", help="Peak AdamW learning rate (warmup, cosine decay to 10%)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the data selection, the held-out split and the init."),
    depth: int = typer.Option(2, "--depth", help="Draft depths trained (training-time test: depth d learns to "
                              "chain on the head's own output d-1 times, as chained drafting runs it); 1..4."),
    fuse: bool = typer.Option(True, "--fuse/--no-fuse", help="Feed the head a low, a middle and a high layer's "
                              "output rows fused with the final hidden (EAGLE-3), not the final hidden alone."),
    threads: int | None = flag("threads"),
    resume: bool = typer.Option(True, "--resume/--no-resume", help="Continue from OUTPUT.ckpt/ when it holds the "
                                "same configuration (--no-resume: start over, teacher data included)."),
    as_json: bool = flag("as_json", help="Print the summary as one JSON object."),
):
    """Train an MTP head (see the help above)."""
    from ...tools.train_mtp import train_mtp as run_train  # deferred: torch, numba

    try:
        writable(output, "-o/--output")
        s = run_train(model, output, steps=steps, text_tokens=text_tokens, gen_tokens=gen_tokens, seq_len=seq_len,
                      batch=batch, lr=lr, seed=seed, depth=depth, fuse=fuse, threads=threads, resume=resume)
    except GuildError as e:
        fail(e)
    if as_json:
        print(json.dumps({k: v for k, v in s.items() if k != "history"}))
        return
    print(s["output"])
    err.print(f"[dim]held-out acceptance {s['heldout_acceptance']:.3f} (step 0: {s['heldout_acceptance_step0']:.3f}"
              f"; second draft {s['heldout_acceptance_d2']:.3f})"
              f" over {s['heldout_rows']} rows · {s['rows']} training rows · {s['steps']} steps · "
              f"{s['bytes'] / 1e6:.1f} MB · {s['seconds'] / 60:.1f} min[/]")
    err.print("[dim]phases: " + " · ".join(f"{k} {v:.0f} s" for k, v in s["phases"].items()) + "[/]")
