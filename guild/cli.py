"""guild command line: thin Typer commands, each calling one library function."""

from __future__ import annotations

import json
import secrets
import sys
from pathlib import Path

import typer
from rich.console import Console

from .errors import GuildError

app = typer.Typer(
    help="guild: run Mixture-of-Experts GGUF models on the CPU (and GPU), with exact speculative decoding.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
err = Console(stderr=True, highlight=False)

SAMPLING = "Sampling (llama.cpp names; chain: penalties → top-k → top-p → min-p → temperature)"
MODEL_HELP = "GGUF path or tag: smollm2-135m-moe (default, built once from the embedded model) or smollm2-135m."


def _fail(e: GuildError) -> None:
    err.print(f"[bold red]error:[/] {e}", markup=True, soft_wrap=True)
    raise typer.Exit(1)


@app.command()
def run(
    model: str | None = typer.Argument(None, help=MODEL_HELP),
    prompt: str = typer.Option(..., "-p", "--prompt", help="Prompt text."),
    chat: bool = typer.Option(False, "--chat", help="Wrap the prompt in the model's chat template."),
    max_tokens: int = typer.Option(128, "-n", "--max-tokens", help="Tokens to generate at most."),
    threads: int | None = typer.Option(None, "-t", "--threads", help="CPU threads (default: all cores)."),
    context: int = typer.Option(4096, "--context", help="Context length in tokens (KV cache size)."),
    prefill_batch: int = typer.Option(512, "--prefill-batch", help="Prompt rows per prefill forward."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object (text, tokens, stats) instead."),
    temperature: float = typer.Option(0.0, "--temperature", "--temp", help="0 = greedy.", rich_help_panel=SAMPLING),
    top_k: int = typer.Option(40, "--top-k", help="Keep the k most likely tokens (0 = off).", rich_help_panel=SAMPLING),
    top_p: float = typer.Option(0.95, "--top-p", help="Nucleus: smallest set with this mass (1 = off).",
                                rich_help_panel=SAMPLING),
    min_p: float = typer.Option(0.05, "--min-p", help="Drop tokens below min_p x the top probability (0 = off).",
                                rich_help_panel=SAMPLING),
    repeat_penalty: float = typer.Option(1.0, "--repeat-penalty", help="1 = off.", rich_help_panel=SAMPLING),
    repeat_last_n: int = typer.Option(64, "--repeat-last-n", help="History the penalties see (-1 = all).",
                                      rich_help_panel=SAMPLING),
    frequency_penalty: float = typer.Option(0.0, "--frequency-penalty", rich_help_panel=SAMPLING),
    presence_penalty: float = typer.Option(0.0, "--presence-penalty", rich_help_panel=SAMPLING),
    seed: int | None = typer.Option(None, "--seed", help="Seed of the position-keyed draws (default: random).",
                                       rich_help_panel=SAMPLING),
):
    """Generate text from a prompt, streaming it, then print decode statistics (greedy unless --temperature)."""
    from .run import run as run_prompt
    from .sampling import SamplingParams

    def stream(s: str) -> None:
        sys.stdout.write(s)
        sys.stdout.flush()

    try:
        sampling = SamplingParams(
            temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, repeat_penalty=repeat_penalty,
            penalty_last_n=repeat_last_n, frequency_penalty=frequency_penalty, presence_penalty=presence_penalty,
            seed=secrets.randbits(63) if seed is None else seed,
        )
        res = run_prompt(
            model, prompt, chat=chat, max_tokens=max_tokens, threads=threads, context=context,
            prefill_batch=prefill_batch, sampling=sampling, on_text=None if as_json else stream,
        )
    except GuildError as e:
        _fail(e)
    if as_json:
        print(json.dumps(res.as_dict()))
        return
    s = res.stats
    sys.stdout.write("\n")
    err.print(
        f"[dim]{Path(res.model).name} · {res.threads} threads · load {res.load_s:.2f} s\n"
        f"prompt {s.prompt_tokens} tok · prefill {s.prefill_tok_s:.1f} tok/s · "
        f"generated {s.generated_tokens} tok · decode {s.decode_tok_s:.1f} tok/s · "
        f"{s.ms_per_token:.2f} ms/token · stop: {s.stop_reason}"
        + ("" if sampling.greedy else f" · seed {sampling.seed}")
        + "[/]"
    )


@app.command()
def upcycle(
    dense: str | None = typer.Argument(None, help="Dense llama GGUF (default: the embedded SmolLM2-135M)."),
    out: Path | None = typer.Option(None, "-o", "--out", help="Output GGUF (default: the user cache)."),
    experts: int = typer.Option(8, "--experts", help="Number of experts."),
    top_k: int = typer.Option(2, "--top-k", help="Experts used per token."),
    seed: int = typer.Option(0, "--seed", help="Seed of the perturbations and the router."),
):
    """Build a Mixtral-style MoE GGUF from a dense llama GGUF by sparse upcycling."""
    from . import upcycle as up

    try:
        if dense is None and out is None and (experts, top_k, seed) == (8, 2, 0):
            path = up.ensure_embedded_moe()
        else:
            src = up.resolve_model(dense) if dense else up.embedded_dense_path()
            if out is None:
                raise GuildError("upcycle: --out is required unless building the default embedded MoE")
            path = up.upcycle(src, out, n_experts=experts, top_k=top_k, seed=seed)
    except GuildError as e:
        _fail(e)
    print(path)


def main() -> None:  # pragma: no cover
    app()
