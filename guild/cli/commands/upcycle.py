"""`guild upcycle`: a Mixtral-style MoE GGUF from a dense llama GGUF by sparse upcycling (guild.upcycle)."""

from __future__ import annotations

from pathlib import Path

import typer

from ...errors import GuildError
from ..output import fail, writable


def command(
    dense: str | None = typer.Argument(None, help="Dense llama GGUF (default: the embedded SmolLM2-135M)."),
    out: Path | None = typer.Option(None, "-o", "--out", help="Output GGUF (default: the user cache)."),
    experts: int = typer.Option(8, "--experts", help="Number of experts."),
    top_k: int = typer.Option(2, "--top-k", help="Experts used per token."),
    seed: int = typer.Option(0, "--seed", help="Seed of the perturbations and the router."),
):
    """Build a Mixtral-style MoE GGUF from a dense llama GGUF by sparse upcycling."""
    from ... import upcycle as up  # deferred: numba

    try:
        if dense is None and out is None and (experts, top_k, seed) == (8, 2, 0):
            path = up.ensure_embedded_moe()
        else:
            src = up.resolve_model(dense) if dense else up.embedded_dense_path()
            if out is None:
                raise GuildError("upcycle: --out is required unless building the default embedded MoE")
            writable(out, "-o/--out")
            path = up.upcycle(src, out, n_experts=experts, top_k=top_k, seed=seed)
    except GuildError as e:
        fail(e)
    print(path)
