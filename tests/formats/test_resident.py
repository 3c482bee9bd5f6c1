"""Weights read into memory instead of mapped (guild/formats/resident.py): where the bytes live, that they are
the cache file's bytes, and when a load reads rather than maps."""

from __future__ import annotations

import os
import weakref
from pathlib import Path

import numpy as np
import pytest

import guild.formats.repack_cache as rc
from guild.engine import memory
from guild.errors import BadFlagError
from guild.formats import resident
from guild.formats.gguf import GGUFFile
from guild.models import load_model
from guild.tools.tiny import write_tiny_model


def _mapping_of(addr: int) -> str:
    """The /proc/self/maps path of the mapping holding addr ("" for anonymous memory)."""
    for line in open("/proc/self/maps"):
        parts = line.split(maxsplit=5)
        lo, hi = (int(v, 16) for v in parts[0].split("-"))
        if lo <= addr < hi:
            return parts[5].strip() if len(parts) > 5 else ""
    raise AssertionError(f"{addr:#x} is not mapped")


needs_proc = pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="reads /proc/self/maps")


def test_anonymous_is_zeroed_writable_and_starts_on_a_huge_page():
    a = resident.anonymous(5 << 20)
    assert a.nbytes == 5 << 20 and a.ctypes.data % resident.HUGE == 0
    assert not a.any()
    a[-1] = 7
    assert a[-1] == 7


def test_read_file_gives_the_file_bytes_and_refuses_a_short_file(tmp_path):
    data = np.random.default_rng(0).integers(0, 256, (resident._CHUNK * 2 + 12345), dtype=np.uint8)
    p = tmp_path / "f.bin"
    p.write_bytes(data.tobytes())
    fd = os.open(p, os.O_RDONLY)
    try:
        assert np.array_equal(resident.read_file(fd, data.size, threads=3), data)  # three chunks, three threads
        assert np.array_equal(resident.read_file(fd, 100), data[:100])
        with pytest.raises(OSError, match="file ends at"):
            resident.read_file(fd, data.size + 1)
    finally:
        os.close(fd)


def test_the_mmap_setting(monkeypatch):
    monkeypatch.setattr(resident, "_FLAG", [None])
    monkeypatch.delenv(resident.ENV, raising=False)
    assert not resident.mmap_forced()
    monkeypatch.setenv(resident.ENV, "1")
    assert resident.mmap_forced()
    resident.set_mmap(False)  # the flag over the environment
    assert not resident.mmap_forced()
    resident.set_mmap(None)
    monkeypatch.setenv(resident.ENV, "maybe")
    with pytest.raises(BadFlagError, match="GUILD_MMAP must be 0 or 1, not 'maybe'"):
        resident.mmap_forced()


def test_wanted_only_within_the_budget_and_never_under_mmap(monkeypatch):
    monkeypatch.setattr(resident, "_FLAG", [None])
    monkeypatch.delenv(resident.ENV, raising=False)
    monkeypatch.setattr(memory, "budget", lambda: 1000)
    assert resident.wanted(1000) and not resident.wanted(1001)
    resident.set_mmap(True)
    assert not resident.wanted(10)


@needs_proc
def test_a_load_reads_the_cache_into_anonymous_memory_with_the_mapped_logits(tmp_path, monkeypatch):
    """The same cache file, mapped (--mmap) and read into memory: bitwise the same logits; the loaded model's
    weights lie outside the file's mapping, the mapped one's inside it."""
    monkeypatch.setenv("GUILD_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(rc.ENV_SWITCH, raising=False)
    monkeypatch.setattr(resident, "_FLAG", [None])
    path = write_tiny_model(tmp_path / "m.gguf", "qwen3moe", n_experts=4, qtype="Q4_K", dim=256, ffn=256, seed=5)
    tokens = [1, 5, 9, 300, 7]
    runs = {}
    for forced in (True, False, False):  # build + map, read, read again
        resident.set_mmap(forced)
        model, how = rc.load_cached(GGUFFile(path), load_model)
        where = _mapping_of(model.layers[0].experts_gu[0].arrays[0].ctypes.data)
        runs.setdefault(forced, []).append((how, where, model.forward(tokens, model.new_state(16))))
    (cache_file,) = (tmp_path / "cache" / "repack").glob("*.rpk")
    (how_m, where_m, logits_m), = runs[True]
    assert how_m == "built" and Path(where_m) == cache_file
    for how, where, logits in runs[False]:
        assert how == "cache" and where == ""
        assert np.array_equal(logits, logits_m)


def test_an_expert_cache_model_is_mapped(tmp_path, monkeypatch):
    """read_ahead=False (an expert cache will read the experts from the file): mapped, whatever the budget."""
    monkeypatch.setenv("GUILD_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(rc.ENV_SWITCH, raising=False)
    monkeypatch.setattr(resident, "_FLAG", [None])
    calls = []
    monkeypatch.setattr(resident, "read_file", lambda *a, **k: calls.append(a))
    path = write_tiny_model(tmp_path / "m.gguf", "qwen3moe", n_experts=4, qtype="Q4_K", dim=256, ffn=256, seed=5)
    rc.load_cached(GGUFFile(path), load_model, read_ahead=False)
    rc.load_cached(GGUFFile(path), load_model, read_ahead=False)
    assert calls == []


def test_loads_of_one_file_share_one_copy_while_it_is_held(tmp_path):
    p = tmp_path / "f.bin"
    p.write_bytes(bytes(range(256)) * 64)
    fd = os.open(p, os.O_RDONLY)
    try:
        a = resident.read_shared(fd, 4096)
        assert resident.read_shared(fd, 4096) is a  # held: shared
        assert resident.read_shared(fd, 2048) is not a  # another length: its own
        del a
        b = resident.read_shared(fd, 4096)  # dropped: read again
        assert np.array_equal(b, np.frombuffer(p.read_bytes()[:4096], np.uint8))
        os.utime(p, ns=(0, 10**9))  # the file changed: a fresh copy
        assert resident.read_shared(fd, 4096) is not b
    finally:
        os.close(fd)


@needs_proc
def test_a_dropped_model_frees_its_weights(tmp_path, monkeypatch):
    """Nothing outside the model keeps a loaded model's weights alive (the kernels' expert tables live on the
    model's expert lists): a benchmark or server that drops a model gets its memory back."""
    import gc

    monkeypatch.setenv("GUILD_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(rc.ENV_SWITCH, raising=False)
    monkeypatch.delenv(resident.ENV, raising=False)
    monkeypatch.setattr(resident, "_FLAG", [None])
    path = write_tiny_model(tmp_path / "m.gguf", "qwen3moe", n_experts=4, qtype="Q4_K", dim=256, ffn=256, seed=5)
    rc.load_cached(GGUFFile(path), load_model)  # built (mapped); the next load reads
    model, _ = rc.load_cached(GGUFFile(path), load_model)
    model.forward([1, 5, 9], model.new_state(16))  # the expert tables are built
    root = model.layers[0].experts_gu[0].arrays[0]
    while isinstance(root.base, np.ndarray):
        root = root.base
    assert _mapping_of(root.ctypes.data) == ""  # read into memory
    held = weakref.ref(root)
    del model, root
    gc.collect()
    assert held() is None
