"""The repack cache as a managed store (guild/formats/cache_store.py, `guild cache`): the limit and least recently
used eviction, orphans (their GGUF gone or changed), the free-space refusal, a model larger than the limit, and
the command's list / prune / rm."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest
from typer.testing import CliRunner

import guild.formats.cache_store as cs
import guild.formats.repack_cache as rc
from guild.cli import app
from guild.errors import BadFlagError
from guild.formats.gguf import GGUFFile
from guild.models import load_model
from guild.tools.tiny import write_tiny_model


@pytest.fixture(scope="module")
def ggufs(tmp_path_factory):
    d = tmp_path_factory.mktemp("store")
    return [write_tiny_model(d / f"m{i}.gguf", "llama", n_experts=4, qtype="Q4_0", seed=i) for i in range(3)]


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("GUILD_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(rc.ENV_SWITCH, raising=False)
    monkeypatch.delenv(cs.ENV_MAX, raising=False)
    return tmp_path / "cache" / "repack"


def _load(path) -> str:
    return rc.load_cached(GGUFFile(path), load_model)[1]


def _sources(store) -> set[str]:
    return {e.source for e in cs.entries()}


def test_entries_name_their_gguf_and_last_use(ggufs, store):
    assert _load(ggufs[0]) == "built"
    (e,) = cs.entries()
    assert e.source == str(ggufs[0].resolve()) and not e.orphan and e.size == e.path.stat().st_size > 0
    os.utime(e.path, (1, 1))  # used long ago
    assert _load(ggufs[0]) == "cache"
    assert cs.entries()[0].last_used > 1  # a load that maps it is a use


def test_least_recently_used_goes_when_the_limit_is_passed(ggufs, store, monkeypatch):
    for p in ggufs[:2]:
        assert _load(p) == "built"
    sizes = {e.source: e.size for e in cs.entries()}
    a, b = (str(p.resolve()) for p in ggufs[:2])
    os.utime(cs.entries()[[e.source for e in cs.entries()].index(a)].path, (1, 1))  # a: the older use
    monkeypatch.setenv(cs.ENV_MAX, str(sizes[a] + sizes[b] + 1000))  # room for two entries, not three
    assert _load(ggufs[2]) == "built"
    assert _sources(store) == {b, str(ggufs[2].resolve())}  # a went, b stayed
    assert cs.used_bytes() <= cs.limit()
    assert _load(ggufs[1]) == "cache"  # the survivor still maps


def test_orphans_go_first(ggufs, store, tmp_path, monkeypatch):
    gone = shutil.copy(ggufs[0], tmp_path / "gone.gguf")
    changed = shutil.copy(ggufs[1], tmp_path / "changed.gguf")
    for p in (gone, changed, ggufs[2]):
        assert _load(p) == "built"
    os.unlink(gone)
    with open(changed, "ab") as f:  # the GGUF changed since: its entry can never be used again
        f.write(b"\0" * 64)
    states = {e.source: e.orphan for e in cs.entries()}
    assert states == {str(gone.resolve()): True, str(changed.resolve()): True, str(ggufs[2].resolve()): False}
    removed = cs.prune()
    assert sorted(e.source for e in removed) == sorted([str(gone.resolve()), str(changed.resolve())])
    assert _sources(store) == {str(ggufs[2].resolve())}


def test_a_model_larger_than_the_limit_is_repacked_into_memory(ggufs, store, monkeypatch, caplog):
    monkeypatch.setenv(cs.ENV_MAX, "1K")
    ref = load_model(ggufs[0]).forward([1, 2, 3], load_model(ggufs[0]).new_state(8))
    with caplog.at_level("WARNING", logger=rc.__name__):
        m, how = rc.load_cached(GGUFFile(ggufs[0]), load_model)
    assert how == "memory" and np.array_equal(m.forward([1, 2, 3], m.new_state(8)), ref)
    (w,) = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert "larger than the repack cache's limit" in w and "GUILD_CACHE_MAX" in w
    assert not cs.entries()


def test_too_little_disk_is_one_line_and_writes_nothing(ggufs, store, monkeypatch):
    monkeypatch.setattr(rc, "_free_bytes", lambda d: 10 << 20)
    with pytest.raises(cs.CacheSpaceError) as e:
        _load(ggufs[0])
    msg = str(e.value)
    assert "\n" not in msg and "needs" in msg and "GB free" in msg and "GUILD_REPACK_CACHE=0" in msg
    assert not store.exists() or list(store.iterdir()) == []


@pytest.mark.parametrize("text,want", [("40G", 40 << 30), ("512M", 512 << 20), ("1.5K", 1536), ("2GiB", 2 << 30),
                                       ("123", 123), ("none", None)])
def test_sizes(text, want):
    assert cs.parse_size(text) == want


def test_bad_size_is_one_line(store, monkeypatch):
    with pytest.raises(BadFlagError, match="'lots' is not a size"):
        cs.parse_size("lots")
    monkeypatch.setenv(cs.ENV_MAX, "lots")
    r = CliRunner().invoke(app, ["cache", "list"])
    assert r.exit_code == 1 and "GUILD_CACHE_MAX: 'lots' is not a size" in r.output and "Traceback" not in r.output


def test_command_list_rm_prune(ggufs, store):
    runner = CliRunner()
    for p in ggufs:
        _load(p)
    r = runner.invoke(app, ["cache", "list", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert sorted(e["source"] for e in d["entries"]) == sorted(str(p.resolve()) for p in ggufs)
    assert d["used_bytes"] == sum(e["bytes"] for e in d["entries"]) and d["directory"] == str(store)
    r = runner.invoke(app, ["cache", "rm", str(ggufs[0]), "--json"])
    assert r.exit_code == 0 and [e["source"] for e in json.loads(r.output)["removed"]] == [str(ggufs[0].resolve())]
    r = runner.invoke(app, ["cache", "rm", str(ggufs[0])])
    assert r.exit_code == 1 and "no cache entry" in r.output
    r = runner.invoke(app, ["cache", "prune", "--max", "0"])
    assert r.exit_code == 0 and r.output.count("removed ") == 2 and not cs.entries()
    for bad in (["cache", "bogus"], ["cache", "list", "x"], ["cache", "list", "--max", "1G"], ["cache", "rm"]):
        r = runner.invoke(app, bad)
        assert r.exit_code == 1 and r.output.startswith("error:") and r.output.count("\n") == 1, (bad, r.output)


def test_the_flag_is_over_the_environment(ggufs, store, monkeypatch, caplog):
    """--cache-max (cs.set_limit) wins over GUILD_CACHE_MAX, is named where the limit is reported, and unset
    hands the limit back to the environment."""
    monkeypatch.setenv(cs.ENV_MAX, "none")
    try:
        cs.set_limit("1K")
        assert cs.limit() == 1024 and cs.describe_limit().endswith("--cache-max")
        with caplog.at_level("WARNING", logger=rc.__name__):
            assert _load(ggufs[0]) == "memory"
        (w,) = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
        assert "--cache-max" in w and not cs.entries()
        with pytest.raises(BadFlagError, match="--cache-max: '1X' is not a size"):
            cs.set_limit("1X")
    finally:
        cs.set_limit(None)
    assert cs.limit() is None and _load(ggufs[0]) == "built"
