"""`guild inspect`: a .gexec plan or a GGUF model, as tables, JSON or a cost-curve plot (guild.cli.inspect)."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.markup import escape

from ...errors import GuildError
from ..options import flag
from ..output import err, fail, writable


def command(
    path: Path = typer.Argument(..., help="A .gexec plan, or a GGUF model (path or tag)."),
    plan: bool = typer.Option(False, "--plan", help="Every table of a plan: placement, CPU tuning, speculative "
                              "costs and the verify curve."),
    as_json: bool = flag("as_json", help="Print every field as JSON."),
    plot: Path | None = typer.Option(None, "--plot", help="Write the cost curves as a PNG (needs matplotlib: "
                                     "pip install 'guild\\[plot]')."),
):
    """Show a plan (identity, placement, CPU tuning, speculative costs) or a GGUF model."""
    from ..inspect import inspect as show  # deferred: numba

    try:
        writable(plot, "--plot")
        d = show(path, full=plan, as_json=as_json, plot_to=None if plot is None else str(plot))
    except GuildError as e:
        fail(e)
    if as_json:
        print(json.dumps(d))
    elif plot is not None:
        err.print(f"[dim]plot written to {escape(str(plot))}[/]")
