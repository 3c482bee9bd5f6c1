"""The harness: rounds alternated (order reversed every other round), medians and spread per figure and per T,
parity held for exact runners (a failure stops the bench) and reported for the rest, runners in child processes."""

import json

import pytest

from guild.bench import harness
from guild.bench.harness import ParityError, Run, Runner, alternate, measure


def test_rounds_alternate_and_reverse():
    assert [n for _, n in alternate(["a", "b", "c"], 3)] == list("abccbaabc")
    assert [i for i, _ in alternate(["a", "b"], 2)] == [0, 0, 1, 1]


def _runner(name, values, tokens=(1, 2, 3), order=None, **kw):
    it = iter(values)

    def measure(point):
        if order is not None:
            order.append(name)
        return Run({"decode_tok_s": next(it), "window_ms": {1: 2.0, 2: 3.0}}, list(tokens))

    return Runner(name, measure, **kw)


def test_medians_spread_and_order():
    order = []
    rs = [_runner("normal", [10, 30, 20], order=order, reference=True),
          _runner("adaptive", [5, 7, 6], order=order, exact=True)]
    recs = measure("c", [{"size": 1}], rs, 3, {"commit": "x"})
    assert order == ["normal", "adaptive", "adaptive", "normal", "normal", "adaptive"]
    n, a = recs
    assert n.figures["decode_tok_s"] == {"median": 20.0, "min": 10.0, "max": 30.0, "runs": [10.0, 30.0, 20.0]}
    assert a.median("decode_tok_s") == 6.0 and a.parity is True and n.parity is True
    assert n.median("window_ms", 2) == 3.0 and n.meta == {"commit": "x"}


def test_exact_runner_that_differs_stops_the_bench():
    rs = [_runner("normal", [1], reference=True), _runner("adaptive", [1], tokens=(1, 2, 4), exact=True)]
    with pytest.raises(ParityError, match="adaptive differs from normal at token 2"):
        measure("c", [{}], rs, 1, {})


def test_inexact_runner_that_differs_is_reported():
    rs = [_runner("guild", [1], reference=True), _runner("llama.cpp", [1], tokens=(1, 5))]
    assert [r.parity for r in measure("c", [{}], rs, 1, {})] == [True, False]


def test_child_runner_round_trip(monkeypatch, capsys):
    """in_child runs `python -m guild.bench CASE ... --child NAME --point JSON` and reads the Run its child prints."""
    r = _runner("normal", [7.5], reference=True)
    harness.child_main(r, {"size": 3})
    printed = capsys.readouterr().out
    got = json.loads(printed)
    assert got["figures"]["decode_tok_s"] == 7.5 and got["figures"]["rss_added_mb"] >= 0
    seen = {}

    class Done:
        returncode, stdout, stderr = 0, printed, ""

    def fake_run(cmd, **kw):
        seen["cmd"] = cmd
        return Done

    monkeypatch.setattr(harness.subprocess, "run", fake_run)
    run = harness.in_child(r, "long", ["--sizes", "3"]).measure({"size": 3})
    assert seen["cmd"][1:] == ["-m", "guild.bench", "long", "--sizes", "3", "--child", "normal", "--point",
                               '{"size": 3}']
    assert run.figures["decode_tok_s"] == 7.5 and run.tokens == [1, 2, 3]
    kept = harness.in_child(Runner("oracle", r.measure, reference=True, once=True, warmup=print), "long", [])
    assert kept.reference and kept.once and kept.warmup is None  # a fresh process per measurement: no warm-up


def test_failed_child_is_one_line(monkeypatch):
    class Failed:
        returncode, stdout, stderr = 1, "", "Traceback...\nerror: out of memory"

    monkeypatch.setattr(harness.subprocess, "run", lambda cmd, **kw: Failed)
    r = harness.in_child(_runner("normal", [1]), "long", [])
    with pytest.raises(harness.GuildError, match="long: normal at size=3 failed: error: out of memory"):
        r.measure({"size": 3})


def test_speedup_is_paired_by_round_and_a_once_runner_runs_once():
    """speedup: a runner's figure over the reference's in the same round (not the ratio of medians); a `once`
    runner is measured in the first round only."""
    order = []
    rs = [_runner("normal", [10, 20, 40], order=order, reference=True),
          _runner("lookup", [20, 20, 20], order=order, exact=True),
          _runner("oracle", [3], order=order, exact=True, once=True)]
    n, lk, o = measure("c", [{}], rs, 3, {}, speedup_of="decode_tok_s")
    assert order == ["normal", "lookup", "oracle", "lookup", "normal", "normal", "lookup"]
    assert lk.figures["speedup"]["runs"] == [2.0, 1.0, 0.5] and n.median("speedup") == 1.0
    assert o.figures["decode_tok_s"]["runs"] == [3.0] and o.parity is True
