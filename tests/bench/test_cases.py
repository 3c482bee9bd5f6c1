"""The model cases end to end on a small synthetic real-architecture file (qwen3-30b-a3b's layout, scaled):
decode, windows and step through `python -m guild.bench`'s main, records as JSON Lines; bad flags are one-line
errors."""

import json

import pytest

from guild.bench import main as bench
from guild.tools import synth


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    path = tmp_path_factory.mktemp("shapes") / "q3.gguf"
    synth.main(["qwen3-30b-a3b", "--layers", "1", "--scale", "0.0625", "--type", "Q4_K_M", "-o", str(path)])
    return str(path)


def _records(capsys, *argv):
    assert bench.main(list(argv)) == 0
    return [json.loads(x) for x in capsys.readouterr().out.splitlines()]


def test_decode_both_numerics(small, capsys):
    recs = _records(capsys, "decode", "--models", small, "--numerics", "i8,f32", "-r", "1", "-n", "3", "-p", "16",
                    "--no-llama", "-t", "1", "--json")
    assert [r["runner"] for r in recs] == ["guild i8", "guild f32"]
    for r in recs:
        f = r["figures"]
        assert r["point"] == {"model": "q3.gguf"} and r["commit"] and r["host"]["threads"] == 1
        assert f["decode_tok_s"]["median"] > 0 and f["prefill_tok_s"]["median"] > 0 and f["ttft_ms"]["median"] > 0
        assert r["command"].startswith("python -m guild.bench decode --models ")
    assert recs[0]["parity"] is True  # the reference: f32's greedy tokens may differ, reported only


def test_decode_after_a_depth_of_text(small, capsys):
    """--depth N: decoding starts after N tokens of text (the context ik_llama.cpp's -gp N,n measures at)."""
    from types import SimpleNamespace

    from guild.bench.cases import decode

    a = SimpleNamespace(depth=20, threads=1)
    assert len(decode._prompt(a, small)) == 20 and decode._prompt(SimpleNamespace(depth=0, threads=1), small)
    (r,) = _records(capsys, "decode", "--models", small, "-r", "1", "-n", "3", "-p", "16", "--depth", "20",
                    "--no-llama", "-t", "1", "--json")
    assert r["figures"]["decode_tok_s"]["median"] > 0 and "--depth 20" in r["command"]
    assert r["point"] == {"model": "q3.gguf", "depth": 20}  # a report keeps it apart from the chat-prompt runs


def test_windows_curve_experts_and_bound(small, capsys):
    (r,) = _records(capsys, "windows", "--models", small, "-r", "1", "--repeats", "1", "--no-llama", "-t", "1",
                    "--json")
    f = r["figures"]
    assert sorted(map(int, f["window_ms"]["series"])) == list(range(1, 9))
    assert f["window_ratio"]["series"]["1"]["median"] == 1.0
    assert all(1 <= s["median"] <= 8 * int(T) for T, s in f["distinct_experts"]["series"].items())  # top-8 of 128
    assert f["bound_tok_s"]["median"] > 0 and 0 < f["bound_share"]["median"] < 10


def test_step_breakdown(small, capsys):
    (r,) = _records(capsys, "step", "--models", small, "-r", "1", "--steps", "3", "-t", "1", "--json")
    f = r["figures"]
    assert 0 < f["python_share"]["median"] < 1 and 0 < f["verifier_share"]["median"] < 1
    assert {"matmul", "experts", "decode_layers"} <= set(f["op_ms"]["series"])  # a decode row's layers: one call


@pytest.mark.parametrize("argv", [["decode", "--models", "/nonexistent.gguf"], ["decode", "--models", ""],
                                  ["decode", "-r", "0"], ["nosuchcase"], ["decode", "--numerics", "f16"],
                                  ["decode", "--llama-bench", "ik"], ["decode", "--llama-bench", "ik=/nonexistent"],
                                  ["decode", "--depth", "-1"]])
def test_bad_flags_are_one_line_errors(argv, capsys):
    assert bench.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ")


def test_llama_bench_binary_as_a_runner(small, tmp_path, capsys):
    """Any llama-bench given by path is a runner: its JSON tests read as prefill (pp) and decode (the last tg)."""
    fake = tmp_path / "llama-bench"
    fake.write_text("#!/bin/sh\necho 'build info'\necho '[{\"n_prompt\": 16, \"n_gen\": 0, \"samples_ts\": [250.0]},"
                    " {\"n_prompt\": 0, \"n_gen\": 3, \"avg_ts\": 40.0}]'\n")
    fake.chmod(0o755)
    recs = _records(capsys, "decode", "--models", small, "-r", "1", "-n", "3", "-p", "16", "--no-llama", "-t", "1",
                    "--llama-bench", f"ik={fake}", "--json")
    ik = next(r for r in recs if r["runner"] == "ik")
    assert ik["figures"]["prefill_tok_s"]["median"] == 250.0 and ik["figures"]["decode_tok_s"]["median"] == 40.0


def test_decode_cache_type_reaches_every_runner(small, tmp_path, capsys, monkeypatch):
    """--cache-type f16: guild's sessions store f16 and a llama-bench binary is told -ctk/-ctv f16 (like with like:
    llama.cpp-family engines default to f16 caches, guild to f32)."""
    from guild.bench import runners
    from guild.kvtypes import KVTypes

    seen = []
    real = runners.GuildSession
    monkeypatch.setattr(runners, "GuildSession", lambda *a, **k: seen.append(k["kv"]) or real(*a, **k))
    args = tmp_path / "args"
    fake = tmp_path / "llama-bench"
    fake.write_text(f"#!/bin/sh\necho \"$@\" > {args}\necho '[{{\"n_prompt\": 0, \"n_gen\": 3, \"avg_ts\": 40.0}}]'\n")
    fake.chmod(0o755)
    (r, _) = _records(capsys, "decode", "--models", small, "-r", "1", "-n", "3", "-p", "16", "--no-llama", "-t", "1",
                      "--cache-type", "f16", "--llama-bench", f"ik={fake}", "--json")
    assert r["point"] == {"model": "q3.gguf", "kv": "f16"}
    assert seen and set(seen) == {KVTypes("f16", "f16")}
    assert "-ctk f16 -ctv f16" in args.read_text()
    assert runners.llama_kv_args("q8_0") == {"type_k": 8, "type_v": 8, "flash_attn": True}


@pytest.mark.slow
def test_fresh_processes_time_to_first_token(small, capsys):
    """A fresh `guild run` and a fresh `guild serve` (first request, later ones) each report a time to first
    token; llama.cpp left out is said."""
    recs = _records(capsys, "fresh", "--models", small, "-r", "1", "-t", "1", "--no-llama", "--json")
    assert [r["runner"] for r in recs] == ["guild run", "guild serve"]
    assert all(r["figures"]["ttft_ms"]["median"] > 0 for r in recs)
    assert recs[1]["figures"]["ttft_later_ms"]["median"] > 0


def test_one_model_is_held_at_a_time(monkeypatch):
    """The cases' model holder drops the model it holds before the next one loads, so two large models are never
    resident side by side (with a llama.cpp runner's own copy beside them)."""
    import weakref

    from guild.bench.cases import models

    class Model:
        pass

    held, alive_at_load = [], []

    def fake_load(path, **kw):
        alive_at_load.append([r() is not None for r in held])
        m = Model()
        held.append(weakref.ref(m))
        return m

    monkeypatch.setattr(models, "load", fake_load)
    monkeypatch.setattr(models, "_HELD", {})
    a = models.loaded("a.gguf", 1)
    assert models.loaded("a.gguf", 1) is a  # loaded once
    del a
    models.loaded("b.gguf", 1)
    models.loaded("a.gguf", 1, "f32")
    assert alive_at_load == [[], [False], [False, False]]
