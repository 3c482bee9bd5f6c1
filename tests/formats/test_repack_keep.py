"""A first load that keeps the packed arrays it writes (a model read into memory anyway, resident.py): the same
model as one loaded from the cache afterwards, the same file, one copy of the weights, and the writer that puts
the kept buffer on disk (O_DIRECT or not)."""

from __future__ import annotations

import errno
import gc
import os
import threading
from pathlib import Path

import numpy as np
import pytest

import guild.formats.repack_cache as rc
import guild.formats.repack_writer as rc_writer
from guild.formats import resident
from guild.formats.gguf import GGUFFile
from guild.models import load_model
from guild.tools.tiny import write_tiny_model
from tests.formats.test_repack_cache import _load_growth
from tests.formats.test_resident import _mapping_of, needs_proc

TOKENS = [1, 5, 9, 300, 7]


@pytest.fixture
def kept(tmp_path, monkeypatch):
    monkeypatch.setenv("GUILD_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(rc.ENV_SWITCH, raising=False)
    monkeypatch.setattr(resident, "_FLAG", [False])
    return tmp_path / "cache" / "repack"


def _root(model) -> np.ndarray:
    """The array that the model's first expert matrix is a view of."""
    a = model.layers[0].experts_gu[0].arrays[0]
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


@needs_proc
@pytest.mark.parametrize("arch,qtype", [("llama", "Q4_K"), ("qwen3moe", "Q5_1")])
def test_the_model_kept_at_the_build_is_the_one_the_cache_gives(tmp_path, kept, arch, qtype):
    """Built and kept, then the file just written mapped, then read into memory in a process that no longer holds
    the kept copy: bitwise the same logits as each other and as a plain repack; the kept buffer is byte for byte the
    file's data section, in anonymous memory."""
    path = write_tiny_model(tmp_path / "m.gguf", arch, n_experts=4, qtype=qtype, dim=256, ffn=256, seed=7)
    plain = load_model(path)
    ref = plain.forward(TOKENS, plain.new_state(16))
    m1, how = rc.load_cached(GGUFFile(path), load_model)
    assert how == "built" and _mapping_of(_root(m1).ctypes.data) == ""
    (cache_file,) = kept.glob("*.rpk")
    with open(cache_file, "rb") as f:
        _, data_end = rc.read_header(f, cache_file.stat().st_size)
    root = _root(m1)
    assert root.size == data_end and root.tobytes() == cache_file.read_bytes()[:data_end]
    logits1 = m1.forward(TOKENS, m1.new_state(16))
    resident.set_mmap(True)
    m2, how2 = rc.load_cached(GGUFFile(path), load_model)
    assert how2 == "cache" and Path(_mapping_of(m2.layers[0].experts_gu[0].arrays[0].ctypes.data)) == cache_file
    resident.set_mmap(False)
    del m1, root
    gc.collect()
    m3, how3 = rc.load_cached(GGUFFile(path), load_model)
    assert how3 == "cache" and _mapping_of(_root(m3).ctypes.data) == ""
    for m in (m2, m3):
        assert np.array_equal(m.forward(TOKENS, m.new_state(16)), logits1)
    assert np.array_equal(logits1, ref)


def test_a_load_after_the_build_shares_the_kept_copy(tmp_path, kept):
    """The process that built the cache holds its bytes already: a second load of the model uses that copy (as
    two loads of one cache do), not a second one read from the file."""
    path = write_tiny_model(tmp_path / "m.gguf", "qwen3moe", n_experts=4, qtype="Q4_K", dim=256, ffn=256, seed=5)
    m1, how1 = rc.load_cached(GGUFFile(path), load_model)
    m2, how2 = rc.load_cached(GGUFFile(path), load_model)
    assert (how1, how2) == ("built", "cache") and _root(m1) is _root(m2)


@needs_proc
def test_a_kept_first_load_holds_one_copy(moe_path, tmp_path):
    """Peak resident memory of first loads of the embedded 8-expert MoE (447 MB): kept (read into memory) less
    mapped (--mmap, one matrix at a time) is one copy of the weights (measured 0.94x the file), never the kept
    buffer and the packers' own arrays or the file's pages as well (a second copy: 1.9x)."""
    growth = {}
    for mode in ("1", "0"):
        env = dict(os.environ, GUILD_CACHE_DIR=str(tmp_path / f"cache{mode}"), NUMBA_NUM_THREADS="1",
                   GUILD_MMAP=mode)
        env.pop(rc.ENV_SWITCH, None)
        first = _load_growth(moe_path, env)
        assert first["how"] == "built"
        growth[mode] = first["growth"]
    assert 0.8 * first["size"] <= growth["0"] - growth["1"] <= 1.1 * first["size"], (growth, first["size"])


@pytest.mark.parametrize("direct", ["taken", "refused at open", "refused at write"])
def test_the_flusher_writes_the_buffer_as_it_is_packed(tmp_path, monkeypatch, direct):
    """The kept buffer reaches the file byte for byte, written in pieces as the packed prefix grows, whether the
    file system takes O_DIRECT, refuses it when the file is opened, or only when written."""
    rng = np.random.default_rng(1)
    buf = resident.anonymous(7 * 4096 + 777)
    buf[:] = rng.integers(0, 256, buf.size, dtype=np.uint8)
    path = tmp_path / "f.part"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    used, pwrite, open_ = [], os.pwrite, os.open

    def refuse_open(p, flags, *a):
        if flags & getattr(os, "O_DIRECT", 0):
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
        return open_(p, flags, *a)

    def logged(f, data, offset):
        if direct == "refused at write" and f != fd:
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
        used.append(f)
        return pwrite(f, data, offset)

    monkeypatch.setattr(rc_writer._Flusher, "CHUNK", 2 * 4096)
    monkeypatch.setattr(rc_writer.os, "pwrite", logged)
    if direct == "refused at open":
        monkeypatch.setattr(rc_writer.os, "open", refuse_open)
    try:
        fl = rc_writer._Flusher(fd, path, buf)
        direct_fd = fl.direct
        for n in (100, 3 * 4096 + 5, 3 * 4096 + 9, 6 * 4096):
            fl.upto(n)
        fl.finish(buf.size)
    finally:
        os.close(fd)
    assert path.read_bytes() == buf.tobytes()
    if direct == "refused at open":
        assert direct_fd is None and set(used) == {fd}
    elif direct_fd is not None:  # this file system takes O_DIRECT: the aligned bulk went through it
        assert (direct_fd in used) == (direct == "taken") and used[-1] == fd


def test_the_file_written_past_the_page_cache_is_read_back_in_whole(tmp_path, kept, monkeypatch):
    """After a kept build, the new file is read into the page cache for the next load: WILLNEED over every step
    of the file (Linux reads at most the device's read-ahead per call, so one call for the file reads its start)."""
    calls = []
    monkeypatch.setattr(rc, "_WILLNEED_STEP", 4096)
    monkeypatch.setattr(rc.os, "posix_fadvise", lambda fd, off, n, advice: calls.append((off, n, advice)))
    path = write_tiny_model(tmp_path / "m.gguf", "qwen3moe", n_experts=4, qtype="Q4_K", dim=256, ffn=256, seed=5)
    _, how = rc.load_cached(GGUFFile(path), load_model)
    for t in threading.enumerate():
        if t.name == "guild-prefetch":
            t.join()
    (cache_file,) = kept.glob("*.rpk")
    steps = [(off, n) for off, n, advice in calls if advice == os.POSIX_FADV_WILLNEED and n == 4096]
    assert how == "built" and steps == [(o, 4096) for o in range(0, cache_file.stat().st_size, 4096)]
