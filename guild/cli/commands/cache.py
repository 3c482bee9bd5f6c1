"""`guild cache`: what the repack cache holds (a repacked copy per model, guild.formats.repack_cache), its limit,
and removing entries (guild.formats.cache_store)."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ...errors import BadFlagError, GuildError
from ..options import flag
from ..output import fail

SETTINGS = dict(help=(
    "The repack cache: the first run of a GGUF writes a repacked copy of its weights (about its size) under "
    "$GUILD_CACHE_DIR/repack, which later runs map in seconds. `list` shows each copy, its model, size and last "
    "use; `prune` removes copies whose GGUF is gone or changed, then the least recently used until the cache is "
    "under its limit (GUILD_CACHE_MAX, e.g. 40G; default half of the disk's room for it); `rm MODEL` removes a "
    "model's copy (a GGUF path, or an entry's file name)."))
ACTIONS = ("list", "prune", "rm")


def command(
    action: str = typer.Argument("list", help="list, prune or rm."),
    model: str | None = typer.Argument(None, help="rm: the GGUF whose copy goes, or the entry's file name."),
    max_size: str | None = typer.Option(None, "--max", help="prune: the limit to prune to (e.g. 20G; 0 empties the "
                                        "cache), instead of GUILD_CACHE_MAX."),
    as_json: bool = flag("as_json", help="Print the result as one JSON object."),
):
    """The repack cache: list, prune or rm (see the help above)."""
    from ...formats import cache_store as cs

    try:
        if action not in ACTIONS:
            raise BadFlagError(f"guild cache: the action must be one of {', '.join(ACTIONS)}, got '{action}'")
        if model is not None and action != "rm":
            raise BadFlagError(f"guild cache {action} takes no MODEL")
        if max_size is not None and action != "prune":
            raise BadFlagError("--max goes with `guild cache prune`")
        if action == "rm":
            if model is None:
                raise BadFlagError("guild cache rm needs a MODEL (a GGUF path or an entry's file name)")
            gone = _remove(cs, model)
        elif action == "prune":
            gone = cs.prune(max_bytes=cs.parse_size(max_size, "--max") if max_size is not None else "env")
        else:
            gone = None
        es = cs.entries()
        out = {"directory": str(cs.directory()), "limit_bytes": cs.limit(es), "used_bytes": cs.used_bytes(es),
               "entries": [e.as_dict() for e in es]}
    except GuildError as e:
        fail(e)
    if gone is not None:
        out["removed"] = [e.as_dict() for e in gone]
    if as_json:
        print(json.dumps(out))
        return
    console = Console(highlight=False)
    if gone is not None:
        for e in gone:
            console.print(escape(f"removed {e.path.name} ({e.size / 1e9:.2f} GB, {e.source or 'model unknown'})"))
        if not gone:
            console.print("nothing to remove")
    _table(cs, es, out, console)


def _remove(cs, model: str) -> list:
    """The entries of `model` (a GGUF path: those made from it; else an entry's file name or its digest prefix)."""
    target = str(Path(model).expanduser().resolve())
    es = [e for e in cs.entries() if e.source == target or e.path.name == model
          or (len(model) >= 8 and e.path.name.startswith(model))]
    if not es:
        raise BadFlagError(f"guild cache rm: no cache entry for '{model}' (guild cache list shows them)")
    return [e for e in es if cs.remove(e, "guild cache rm")]


def _table(cs, es, out: dict, console: Console) -> None:
    cap = out["limit_bytes"]
    t = Table(title=escape(f"repack cache {out['directory']} · {out['used_bytes'] / 1e9:.2f} GB of "
                           + ("no limit" if cap is None else f"{cap / 1e9:.1f} GB")), title_justify="left")
    for c in ("model", "size", "last used", "state", "entry"):
        t.add_column(c)
    for e in reversed(es):  # most recent first
        t.add_row(escape(e.source or "unknown (an older guild's entry)"), f"{e.size / 1e9:.2f} GB",
                  cs.since(e.last_used), "orphan: its GGUF is gone or changed" if e.orphan else "ok",
                  escape(e.path.name))
    console.print(t)
