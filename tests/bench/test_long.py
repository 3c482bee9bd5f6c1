"""The long case: a W10 run at a populated context under YaRN and a typed KV cache (prefill, decode, memory added,
V(T)), adaptive held to normal's tokens, runners in child processes, bad flags as one-line errors."""

import json

import pytest

from guild.bench import harness
from guild.bench import main as bench

SMALL = ["--sizes", "256", "--tokens", "6", "--cache-type", "f16", "--threads", "1"]


def _child(capsys, runner, *extra):
    assert bench.main(["long", *SMALL, *extra, "--child", runner, "--point", '{"size": 256}']) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_guild_runners_measure_w10_and_agree(capsys):
    normal = _child(capsys, "normal", "--vt", "1")
    adaptive = _child(capsys, "adaptive")
    assert 240 <= normal["extra"]["prompt"] <= 300  # W10 cut to 256 tokens, then the question under the template
    f = normal["figures"]
    assert f["prefill_tok_s"] > 0 and f["decode_tok_s"] > 0 and f["rss_added_mb"] > 0
    assert len(normal["tokens"]) == 6 and adaptive["tokens"] == normal["tokens"]
    assert sorted(map(int, f["window_ms"])) == [1, 2, 3, 4] and all(v > 0 for v in f["window_ms"].values())


def test_parity_failure_stops_the_run(monkeypatch, capsys):
    got = {"normal": [1, 2, 3], "adaptive": [1, 2, 4]}

    def fake(runner, case, argv):
        return harness.Runner(runner.name, lambda pt: harness.Run({"decode_tok_s": 1.0}, got[runner.name]),
                              runner.exact, runner.reference)

    monkeypatch.setattr(bench, "in_child", fake)
    assert bench.main(["long", "--sizes", "512", "--runners", "normal,adaptive"]) == 2
    assert "parity failure: long {'size': 512}: adaptive differs from normal at token 2" in capsys.readouterr().err


@pytest.mark.parametrize("flags", [["--cache-type", "q4_0"], ["--sizes", "4k"], ["--sizes", "32"],
                                   ["--runners", "normal,vllm"], ["--tokens", "1"], ["--rounds", "0"]])
def test_bad_flags_are_one_line_errors(flags, capsys):
    assert bench.main(["long", *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ")


def test_without_llama_cpp_guild_runs_alone_and_says_so(monkeypatch):
    from guild.bench import runners
    from guild.bench.cases import long

    monkeypatch.setattr(runners.importlib.util, "find_spec", lambda name: None)
    a = bench.parser("long", long).parse_args(["--runners", "normal,llama.cpp"])
    a.notices = []
    long.check(a)
    assert [r.name for r in long.runners(a)] == ["normal"] and a.notices == [runners.NO_LLAMA_CPP]
