"""The `guild` script's outermost layer: any exception a command lets escape becomes one line on stderr and
exit status 1 (usage errors: status 2, as click uses); `--debug` anywhere on the command line or GUILD_DEBUG=1
prints the traceback too. Commands report their own GuildErrors; this is for everything else."""

from __future__ import annotations

import os
import sys
import traceback

from ..errors import GuildError


def _line(e: BaseException) -> str:
    s = str(e).strip()
    return f"{type(e).__name__}: {s.splitlines()[0][:300]}" if s else type(e).__name__


def _interrupted() -> int:
    """Ctrl-C: one line on stderr, exit status 130 (128 + SIGINT, as shells report it). What was streamed to
    stdout stays there; a reply may have been cut mid-line, so on a terminal the error starts a line of its own."""
    print(("\n" if sys.stderr.isatty() else "") + "error: interrupted", file=sys.stderr)
    return 130


def run_cli(call, *args, **kwargs):

    argv = sys.argv
    debug = os.environ.get("GUILD_DEBUG", "") not in ("", "0") or "--debug" in argv[1:]
    if "--debug" in argv[1:]:
        sys.argv = [argv[0], *[a for a in argv[1:] if a != "--debug"]]
    try:
        rc = call(*args, standalone_mode=False, **kwargs)
        if rc == 130:  # Typer returns Ctrl-C as a silent 130 (no guild command exits 130 itself): say it
            rc = _interrupted()
    except SystemExit:
        raise
    except KeyboardInterrupt:
        rc = _interrupted()
    except GuildError as e:
        if debug:
            traceback.print_exc()
        print(f"error: {str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__}", file=sys.stderr)
        rc = 1
    except Exception as e:  # noqa: BLE001 - the last resort: a bug or an unforeseen input, said in one line
        # click's own exceptions (typer vendors click as typer._click, so matched by shape, not by class)
        name = type(e).__name__
        if name == "Exit" and hasattr(e, "exit_code"):
            rc = e.exit_code
        elif name == "Abort":
            rc = _interrupted()
        elif hasattr(e, "format_message") and hasattr(e, "exit_code"):  # usage: one line, not the usage box
            msg = e.format_message().strip().splitlines()
            print(f"error: {msg[0] if msg else name} (see guild --help)", file=sys.stderr)
            rc = e.exit_code
        else:
            if debug:
                traceback.print_exc()
            print(f"error: {_line(e)} (internal error; --debug or GUILD_DEBUG=1 shows where)", file=sys.stderr)
            rc = 1
    sys.exit(rc if isinstance(rc, int) else 0)
