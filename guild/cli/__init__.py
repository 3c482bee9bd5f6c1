"""guild command line: the Typer app and its command table. Each command is one module of guild/cli/commands/
(its `command` function and, where it has any, its Typer `SETTINGS`); a new command is one module plus one line in
COMMANDS. The flags several commands take are declared once, in guild/cli/options.py.

Each command imports what it runs inside its body: the engine pulls in Numba and compiles kernels, and
`guild --help` (or a typo) should answer at once."""

from __future__ import annotations

import importlib

import typer

from .. import __version__
from .last_resort import run_cli

COMMANDS = (  # (name, module of guild/cli/commands/), in `guild --help` order
    ("run", "run"),
    ("serve", "serve"),
    ("chat", "chat"),
    ("bench", "bench"),
    ("optimize", "optimize"),
    ("inspect", "inspect"),
    ("upcycle", "upcycle"),
    ("train-mtp", "train_mtp"),
    ("cache", "cache"),
    ("warmup", "warmup"),
)


def _plain_flag_metavar() -> None:
    """Help shows no `<bool>` for flags (they take no value); other options keep their `<int>`, `<path>`..."""
    from typer.core import TyperOption

    shown = getattr(TyperOption, "display_type_rich", None)
    if shown is None:  # a Typer before this hook renders flags its own way: nothing to change
        return

    def display_type_rich(self, ctx):
        return None if self.is_flag and self.metavar is None else shown(self, ctx)

    TyperOption.display_type_rich = display_type_rich


_plain_flag_metavar()


class GuildApp(typer.Typer):
    """The CLI; calling it (the `guild` script) turns whatever escapes a command into one line (last_resort)."""

    def __call__(self, *args, **kwargs):
        return run_cli(super().__call__, *args, **kwargs)


app = GuildApp(
    help="guild: run Mixture-of-Experts GGUF models on the CPU (and GPU), with exact speculative decoding. "
         "Errors print one line; --debug (anywhere) or GUILD_DEBUG=1 adds the traceback.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        print(f"guild {__version__}")
        raise typer.Exit(0)


@app.callback()
def _main(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="Print guild's version and exit.")):
    pass


for _name, _module in COMMANDS:  # imported by full name: `run` and `inspect` are also modules of guild/cli/
    _mod = importlib.import_module(f"{__name__}.commands.{_module}")
    app.command(_name, **getattr(_mod, "SETTINGS", {}))(_mod.command)
