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
    monkeypatch.setattr(perf_long, "_run_child", lambda a, r, n: {"tokens": got[r], "prompt": 512})
    a = perf_long.argparse.Namespace(sizes="512", runners="normal,adaptive")
    with pytest.raises(GuildError, match="parity failure at 512 tokens"):
        perf_long.measure(a, progress=lambda s: None)


@pytest.mark.parametrize("flags", [["--cache-type", "q4_0"], ["--sizes", "4k"], ["--sizes", "32"],
                                   ["--runners", "normal,vllm"], ["--tokens", "1"]])
def test_bad_flags_are_one_line_errors(flags, capsys):
    assert perf_long.main(flags) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --")


def test_without_llama_cpp_guild_runs_alone(monkeypatch):
    ran, said = [], []
    monkeypatch.setattr(perf_long.importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(perf_long, "_run_child", lambda a, r, n: ran.append(r) or {"tokens": [1], "prompt": 64})
    a = perf_long.argparse.Namespace(sizes="64", runners="normal,llama.cpp")
    assert list(perf_long.measure(a, progress=said.append)[64]) == ["normal"]
    assert ran == ["normal"] and any("not installed" in s for s in said)
