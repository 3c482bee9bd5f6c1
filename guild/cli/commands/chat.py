"""`guild chat`: `guild run -i` under its own name, every run flag passed through."""

from __future__ import annotations

import typer

SETTINGS = dict(context_settings={"ignore_unknown_options": True, "allow_extra_args": True}, add_help_option=False,
                help="Chat in the terminal: the same as `guild run -i` (every run flag applies, e.g. guild chat MODEL "
                     "--system TEXT; -h shows them); /help inside lists the commands.")


def command(ctx: typer.Context):
    # the root context's command is the `guild` group this command belongs to
    ctx.find_root().command.main(["run", "-i", *ctx.args], prog_name="guild", standalone_mode=False)
