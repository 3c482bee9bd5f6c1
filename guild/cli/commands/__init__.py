"""One module per `guild` command, each defining `command` (and `SETTINGS`, Typer's command settings, where it has
any); guild/cli/__init__.py registers the modules imported here from its command table. Heavy imports stay inside
`command`."""

# bound here, not in guild.cli, where run and inspect would shadow the modules guild/cli/run.py, inspect.py
from . import bench, chat, inspect, optimize, run, serve, train_mtp, upcycle  # noqa: F401
