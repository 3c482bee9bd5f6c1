"""The command table and the shared flags (guild/cli/__init__.py, guild/cli/options.py): every command registered
from its module, a shared flag the same wherever its help is shared, the flag groups handed over as one value."""

import subprocess
import sys

import pytest
import typer
from typer.testing import CliRunner

from guild.cli import COMMANDS, app
from guild.cli import options as o


def _params(name):
    return {p.name: p for p in typer.main.get_command(app).commands[name].params}


def test_every_command_comes_from_the_table():
    group = typer.main.get_command(app)
    assert list(group.commands) == [name for name, _ in COMMANDS]
    for name, module in COMMANDS:
        assert group.commands[name].callback.__module__ == f"guild.cli.commands.{module}", name


def test_the_cli_imports_no_numba():
    code = "import sys, guild.cli; print('numba' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == "False", r.stdout + r.stderr


# optimize's --context and --prefill-batch are its own (no -c, -b aliases); its --device help adds a sentence
OWN_NAMES = {("optimize", "context"), ("optimize", "prefill_batch")}
OWN_HELP = {("optimize", "device")}


def test_a_shared_flag_reads_the_same_in_every_command():
    for name, _ in COMMANDS:
        for param, p in _params(name).items():
            if param not in o._FLAGS or (name, param) in OWN_NAMES:
                continue
            names, _, h, *_ = o._FLAGS[param]
            assert sorted(p.opts) == sorted(names), (name, param)
            if h is not None and (name, param) not in OWN_HELP:
                assert p.help == h, (name, param)


def test_groups_are_handed_over_as_one_value():
    got = {}
    demo = typer.Typer()

    @demo.command()
    @o.takes(sampling=o.BENCH_SAMPLING, rope=o.ROPE)
    def cmd(n: int = typer.Option(1, "-n"), *, sampling: dict, rope: tuple):
        got.update(n=n, sampling=sampling, rope=rope)

    r = CliRunner().invoke(demo, ["-n", "3", "--temp", "0.5", "--repeat-last-n", "8", "--rope-scale", "2"])
    assert r.exit_code == 0, r.output
    # flags not given stay out of the sampling keywords; repeat_last_n is SamplingParams' penalty_last_n
    assert got == {"n": 3, "sampling": {"temperature": 0.5, "penalty_last_n": 8},
                   "rope": (None, 2.0, None, None, None)}


def test_an_older_typer_without_the_metavar_hook(monkeypatch):
    """Typer releases before `TyperOption.display_type_rich` (pyproject allows them): the CLI still builds and
    patches nothing."""
    import typer.core

    import guild.cli as cli

    class OldOption:
        pass

    monkeypatch.setattr(typer.core, "TyperOption", OldOption)
    cli._plain_flag_metavar()
    assert not hasattr(OldOption, "display_type_rich")


@pytest.mark.parametrize("cmd", ["run", "serve", "chat"])
def test_a_bad_cache_max_is_a_usage_error(cmd):
    """--cache-max is read as GUILD_CACHE_MAX is (cache_store.parse_size): a bad size is one line naming the flag,
    exit status 2, before any model loads."""
    r = subprocess.run([sys.executable, "-m", "guild", cmd, "--cache-max", "lots"], capture_output=True, text=True,
                       timeout=120)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert "--cache-max" in lines[0] and "'lots' is not a size" in lines[0] and "Traceback" not in r.stderr


def test_cache_max_sets_the_limit_of_the_process(monkeypatch):
    from guild.formats import cache_store as cs

    monkeypatch.setenv(cs.ENV_MAX, "40G")
    try:
        o.set_process_flags("i8", None, "512M")
        assert cs.limit() == 512 << 20
        o.set_process_flags("i8")  # no flag: the environment's
        assert cs.limit() == 40 << 30
    finally:
        cs.set_limit(None)
