"""perf_long: a W10 run at a populated context under YaRN and a typed KV cache (prefill, decode, RSS, V(T)),
adaptive held to normal's tokens, bad flags as one-line errors."""

import json

import pytest

from guild.errors import GuildError
from guild.tools import perf_long

SMALL = ["--size", "256", "--tokens", "6", "--cache-type", "f16", "--threads", "1"]


def _child(capsys, runner, *extra):
    assert perf_long.main(["--child", runner, *SMALL, *extra]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_guild_runners_measure_w10_and_agree(capsys):
    normal = _child(capsys, "normal", "--vt", "1")
    adaptive = _child(capsys, "adaptive")
    assert 240 <= normal["prompt"] <= 300  # W10 cut to 256 tokens, then the question under the chat template
    assert normal["prefill"] > 0 and normal["decode"] > 0 and normal["rss_mb"] > 0
    assert len(normal["tokens"]) == 6 and adaptive["tokens"] == normal["tokens"]
    assert sorted(map(int, normal["vt_ms"])) == [1, 2, 3, 4] and all(v > 0 for v in normal["vt_ms"].values())


def test_parity_failure_stops_the_run(monkeypatch):
    got = {"normal": [1, 2, 3], "adaptive": [1, 2, 4]}
    monkeypatch.setattr(perf_long, "_run_child", lambda a, r, n, vt: {"tokens": got[r], "prompt": 512})
    a = perf_long.argparse.Namespace(sizes="512", runners="normal,adaptive", repeat=1, vt=0)
    with pytest.raises(GuildError, match="parity failure at 512 tokens"):
        perf_long.measure(a, progress=lambda s: None)


@pytest.mark.parametrize("flags", [["--cache-type", "q4_0"], ["--sizes", "4k"], ["--sizes", "32"],
                                   ["--runners", "normal,vllm"], ["--tokens", "1"], ["--repeat", "0"]])
def test_bad_flags_are_one_line_errors(flags, capsys):
    assert perf_long.main(flags) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --")


def test_without_llama_cpp_guild_runs_alone(monkeypatch):
    ran, said = [], []
    monkeypatch.setattr(perf_long.importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(perf_long, "_run_child", lambda a, r, n, vt: ran.append(r) or {"tokens": [1], "prompt": 64})
    a = perf_long.argparse.Namespace(sizes="64", runners="normal,llama.cpp", repeat=1, vt=0)
    assert list(perf_long.measure(a, progress=said.append)[64]) == ["normal"]
    assert ran == ["normal"] and any("not installed" in s for s in said)


def _fake_runs(monkeypatch, decode: dict, tokens: dict | None = None) -> list:
    """_run_child replaced: each runner's decode tok/s in turn (and tokens, else [1, 2]); returns the calls."""
    calls, dec = [], {r: iter(v) for r, v in decode.items()}
    toks = {r: iter(v) for r, v in (tokens or {}).items()}

    def run(a, r, n, vt):
        calls.append((r, vt))
        return {"tokens": next(toks[r]) if r in toks else [1, 2], "prompt": 64, "prefill": 100.0 + len(calls),
                "decode": next(dec[r]), "rss_mb": 5.0, "accepted": 1, "drafted": 2}

    monkeypatch.setattr(perf_long, "_run_child", run)
    return calls


def test_repeat_alternates_the_runners_and_reports_medians_and_pair_ratios(monkeypatch):
    calls = _fake_runs(monkeypatch, {"normal": [10.0, 14.0, 11.0], "adaptive": [12.0, 14.0, 16.5]})
    a = perf_long.argparse.Namespace(sizes="64", runners="normal,adaptive", repeat=3, vt=5, cache_type="f16",
                                     rope_scale=4.0, threads=2, tokens=8)
    res = perf_long.measure(a, progress=lambda s: None)
    assert [r for r, _ in calls] == ["normal", "adaptive", "adaptive", "normal", "normal", "adaptive"]  # AB BA AB
    assert [vt for _, vt in calls] == [5, 5, 0, 0, 0, 0]  # V(T) in the first round only: the one reported
    g = res[64]
    assert g["normal"]["decode"] == 11.0 and g["normal"]["decode_runs"] == [10.0, 14.0, 11.0]
    assert g["adaptive"]["decode"] == 14.0 and g["normal"]["prefill_runs"] == [101.0, 104.0, 105.0]
    assert g["adaptive"]["vs_normal_runs"] == [1.2, 1.0, 1.5] and g["adaptive"]["vs_normal"] == 1.2
    md = perf_long.markdown(res, a)
    assert "medians of 3 alternated rounds" in md
    assert "| 64 | adaptive / normal | | 1.20x (rounds: 1.20, 1.00, 1.50)" in md


def test_repeat_checks_parity_in_every_round(monkeypatch):
    _fake_runs(monkeypatch, {"normal": [1.0, 1.0], "adaptive": [1.0, 1.0]},
               tokens={"normal": [[1, 2], [1, 2]], "adaptive": [[1, 2], [1, 3]]})
    a = perf_long.argparse.Namespace(sizes="64", runners="normal,adaptive", repeat=2, vt=0)
    with pytest.raises(GuildError, match="parity failure at 64 tokens"):
        perf_long.measure(a, progress=lambda s: None)
