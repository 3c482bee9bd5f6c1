"""`guild inspect MODEL`'s account of a first load (guild.formats.repack_cache.survey): the matrices it repacks,
their bytes and layouts, and the tensors used from the GGUF's bytes, against the cache a real load writes."""

import json

import numpy as np
from typer.testing import CliRunner

import guild.formats.repack_cache as rc
from guild.cli import app
from guild.formats.gguf import GGUFFile
from guild.models import load_model
from guild.tools.tiny import write_tiny_model


def test_inspect_says_what_a_load_repacks(tmp_path, monkeypatch):
    monkeypatch.setenv("GUILD_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(rc.ENV_SWITCH, raising=False)
    path = write_tiny_model(tmp_path / "m.gguf", "qwen3moe", n_experts=4, qtype="Q4_K", dim=256, ffn=256, seed=1)
    r = CliRunner().invoke(app, ["inspect", str(path), "--json"])
    assert r.exit_code == 0, r.output
    got = json.loads(r.output)["repack"]

    g = GGUFFile(path)
    assert rc.load_cached(g, load_model)[1] == "built"
    with open(rc.cache_path(g.identity_digest()), "rb") as f:
        hdr, _ = rc.read_header(f, f.seek(0, 2))
    nbytes = sum(nb for q, n, k, _ in hdr["matrices"] for *_, nb in rc._sized_layout(q, n, k, "i8"))
    assert got["matrices"] == len(hdr["matrices"]) and got["bytes"] == nbytes
    assert sum(v["matrices"] for v in got["layouts"].values()) == got["matrices"]
    assert got["layouts"]["int8 tiles"]["types"]["Q4_K"] > 0
    # every tensor is either repacked or used from the file's bytes; the norms (F32 vectors) are never repacked
    assert got["tensors_repacked"] + got["from_gguf"]["tensors"] == len(g.tensors)
    norms = [n for n, t in g.tensors.items() if n.endswith("norm.weight") and np.asarray(t.data).ndim == 1]
    assert norms and set(norms) <= set(got["from_gguf"]["names"])

    text = CliRunner().invoke(app, ["inspect", str(path)]).output
    assert f"{got['matrices']} matrices" in text and "int8 tile layout" in text and "from the GGUF" in text
