"""One module per `guild` command, each defining `command` (and `SETTINGS`, Typer's command settings, where it has
any); guild/cli/__init__.py registers them from its command table. Heavy imports stay inside `command`."""
