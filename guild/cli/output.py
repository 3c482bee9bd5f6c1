"""What every command shares on its way out: the stderr console, a GuildError as one line with the flag that
changes the outcome, start-up notes, and output paths checked before the work that ends by writing them."""

from __future__ import annotations

import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

from ..errors import ContextOverflowError, DeviceOutOfMemoryError, DeviceUnavailableError, GpuPathError, GuildError
from ..formats.files import check_writable

err = Console(stderr=True, highlight=False)

# engine errors speak in engine terms; here they get the flag that changes the outcome
_HINTS = (
    (ContextOverflowError, lambda e: f"--context {e.n_ctx}; raise it" if e.n_ctx else "raise --context"),
    (DeviceUnavailableError, lambda e: "--device cpu runs without a GPU"),
    (DeviceOutOfMemoryError, lambda e: "a smaller --context, a plan with fewer GPU layers (guild optimize), or "
                                       "--device cpu"),
    (GpuPathError, lambda e: "--device cpu runs everything on the CPU"),
)


def fail(e: GuildError) -> None:
    hint = next((h(e) for cls, h in _HINTS if isinstance(e, cls)), None)
    msg = str(e) + (f" ({hint})" if hint else "")
    err.print(f"[bold red]error:[/] {escape(msg)}", markup=True, soft_wrap=True)
    raise typer.Exit(1)


def note(msg: str) -> None:
    err.print(f"[dim]{escape(msg)}[/]", soft_wrap=True)


def notes(verbose: bool):
    """Start-up notes (loading, compiling kernels, a full context) on stderr when it is a terminal or --verbose."""
    return note if verbose or sys.stderr.isatty() else None


def writable(path: Path | None, what: str, error=GuildError) -> None:
    """An output path checked before the work that ends by writing it (guild.formats.files.check_writable)."""
    if path is not None:
        check_writable(path, what, error)
