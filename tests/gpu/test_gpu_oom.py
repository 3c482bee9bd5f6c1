"""A device allocation that fails (the GPU fuller than when it was measured: another process took memory) while
placing a model's weights, growing a KV cache or recurrent state, or placing the MTP head: one line naming what
did not fit, the bytes it needed and the bytes free; `guild run` exits non-zero without a traceback; nothing is
half-written (no trace file, a state that was not grown stays as it was and still runs).

The fake device (HostBackend.fake_device with a capacity, as GUILD_FAKE_GPU sizes it) counts its arrays and
weights and refuses an allocation past its capacity with an OutOfMemoryError, as CuPy does on a full GPU."""

from __future__ import annotations

import re

import numpy as np
import pytest
from typer.testing import CliRunner

from guild.cli import app
from guild.engine import gpu
from guild.engine.backends import HostBackend
from guild.engine.gpu import split_onto_device
from guild.engine.placement import GpuSplit
from guild.errors import DeviceOutOfMemoryError
from guild.models import load_model
from guild.models.mtp import load_mtp_head
from guild.tools.tiny import write_tiny_model, write_tiny_mtp_head
from guild.tools.tiny_hybrid import write_tiny_hybrid

pytestmark = pytest.mark.gpu  # the GPU path, on the fake device

ALL = GpuSplit(2, True, True)  # both layers, embeddings and output on the device


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("oom")
    path = write_tiny_model(d / "tiny.gguf", n_experts=4, top_k=2, qtype="Q8_0", context=4096, seed=5)
    write_tiny_mtp_head(path, d / "tiny.mtp.gguf")
    return str(path)


def placed_bytes(model, split=ALL) -> int:
    """What placing `model` holds on a device (an unlimited fake device's count)."""
    dev = HostBackend.fake_device(1 << 40)
    eng = split_onto_device(model, dev, split)
    assert eng is not None
    return dev.used


def one_line_oom(e: DeviceOutOfMemoryError, what: str) -> None:
    msg = str(e)
    assert "\n" not in msg and what in e.what and e.what in msg, msg
    assert e.needed > e.free >= 0, msg
    assert f"{e.needed:,} bytes" in msg and f"{e.free:,} bytes" in msg and "fake-gpu" in msg, msg


def test_placing_the_weights(tiny):
    m = load_model(tiny)
    need = placed_bytes(m)
    dev = HostBackend.fake_device(need - 1)  # one byte short: the last weight placed does not fit
    with pytest.raises(DeviceOutOfMemoryError) as ei:
        split_onto_device(m, dev, ALL)
    one_line_oom(ei.value, "output")
    assert ei.value.free == need - 1 - (need - ei.value.needed)


def test_a_kv_cache_and_the_mtp_head(tiny):
    m = load_model(tiny)
    need = placed_bytes(m)
    dev = HostBackend.fake_device(need + 65536)
    eng = split_onto_device(m, dev, ALL)
    eng.new_state(64)  # a small cache fits (and is freed with its state)
    with pytest.raises(DeviceOutOfMemoryError) as ei:
        eng.new_state(4096)
    one_line_oom(ei.value, "KV cache 1 of 2 (4096 tokens")
    assert dev.used == need  # the first layer's cache, allocated before the second failed, is freed again
    with pytest.raises(DeviceOutOfMemoryError) as ei:
        load_mtp_head(eng, tiny.replace(".gguf", ".mtp.gguf"))
    one_line_oom(ei.value, "the MTP head's ")


def test_growing_a_recurrent_state_is_all_or_nothing(tmp_path):
    """A snapshot pool that cannot grow (a longer window than any before) leaves every layer's pool as it was, and
    the state still runs the windows that fit, with the CPU model's logits."""
    path = write_tiny_hybrid(tmp_path / "h.gguf", arch="qwen35moe", n_layers=4, seed=2)
    m = load_model(str(path))
    dev = HostBackend.fake_device(1 << 40)
    eng = split_onto_device(m, dev, GpuSplit(4, True, True))
    st, ref = eng.new_state(64), m.new_state(64)
    toks = np.array([5, 77, 12, 200, 31, 9], np.int64)
    assert (eng.forward(toks[:1], st) == m.forward(toks[:1], ref)).all()
    st.commit(1)
    ref.commit(1)
    pools = [S.shape for S in st.S]
    one_pool = int(st.S[0].nbytes) // 2 * 5  # the first layer's pool grown to 5 states fits, the second's not
    dev.capacity = dev.used + one_pool
    with pytest.raises(DeviceOutOfMemoryError) as ei:
        eng.forward(toks[1:5], st)
    one_line_oom(ei.value, "the snapshot pool of layer 1 (5 states)")
    assert [S.shape for S in st.S] == pools
    st.commit(0)  # the window that failed is dropped
    for t in toks[1:]:
        assert (eng.forward(np.array([t]), st) == m.forward(np.array([t]), ref)).all()
        st.commit(1)
        ref.commit(1)


@pytest.mark.parametrize("what, room, extra", [
    ("output_norm", None, ()),  # one byte short of the weights: the last placed does not fit
    # room for the weights and 8 caches of 64 tokens (the run's own, the adaptive decoder's), not one of 4096
    (r"KV cache 1 of 2 \(4096 tokens", 8, ("--context", 4096)),
    ("the MTP head's ", 2, ("--decode-strategy", "mtp", "--context", 64)),  # weights and caches fit, the head not
])
def test_guild_run_says_what_did_not_fit(tiny, tmp_path, monkeypatch, what, room, extra):
    """`guild run --device cuda` on a device fuller than it said: exit 1, one line, no traceback, no trace file."""
    m = load_model(tiny)
    need = placed_bytes(m)
    cache = split_onto_device(m, HostBackend.fake_device(1 << 40), ALL).new_state(64).nbytes
    capacity = need - 1 if room is None else need + room * cache
    monkeypatch.setenv("GUILD_FAKE_GPU", "8192")
    monkeypatch.setattr(gpu, "device_backend", lambda index=0: HostBackend.fake_device(capacity))
    trace = tmp_path / "trace.jsonl"
    r = CliRunner().invoke(app, ["run", tiny, "-p", "abc abc", "-n", "4", "--device", "cuda", "--trace", str(trace),
                                 *map(str, extra)])
    assert r.exit_code == 1, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: out of GPU memory on fake-gpu"), r.output
    assert "Traceback" not in r.output, r.output
    assert re.search(rf"{what}.* needs [\d,]+ bytes .*, [\d,]+ bytes \(.*\) free", lines[0]), r.output
    assert not trace.exists()
