"""`guild bench` (the workloads case): workloads × strategies in one process, parity against normal, the paired
speedup, the noise check and the oracle's share, records as JSON Lines and the markdown table."""

import argparse
import json
import subprocess
import sys

import pytest

from guild.bench import noise, runners
from guild.bench.cases import workloads as W
from guild.bench.cases.workloads_table import NOISE, noise_cv, notes, table, warning
from guild.bench.command import bench
from guild.bench.harness import ParityError, measure
from guild.bench.record import Record, series, stats
from guild.engine.options import DecodeOptions
from guild.errors import BadFlagError
from guild.tools.replay import captured
from guild.workloads import load_workloads


def _by(rep):
    return {r.runner: r for r in rep["records"]}


def test_bench_small_run(tmp_path, dense_path, monkeypatch):
    calls = []
    run = runners.guild_workload
    monkeypatch.setattr(runners, "guild_workload", lambda lm, w, o: calls.append((o.strategy, o.max_tokens))
                        or run(lm, w, o))
    rep = bench("smollm2-135m", ["W9"], ["lookup", "retrieval"], max_tokens=12, out=tmp_path, progress=False)
    # each strategy ran once unmeasured (its kernels' first load or compile is not in its time), then measured,
    # then normal once more: the noise check
    warm = [(s, W.WARMUP_TOKENS) for s in ("normal", "lookup", "retrieval")]
    assert calls[:3] == warm and calls[3:] == [("normal", 12), ("lookup", 12), ("retrieval", 12), ("normal", 12)]
    by = _by(rep)
    assert list(by) == ["normal", "lookup", "retrieval", NOISE] and by["normal"].median("speedup") == 1.0
    for r in by.values():
        assert r.median("decode_tok_s") > 0 and r.parity is True  # every run's tokens are normal's
        assert r.median("generated_tokens") == by["normal"].median("generated_tokens")
    lines = (tmp_path / "bench.jsonl").read_text().splitlines()
    recs = [json.loads(x) for x in lines]
    assert len(recs) == 4 and all(r["commit"] and r["host"]["cpu"] and len(r["load"]) == 3 for r in recs)
    assert noise_cv(rep["records"])[("W9", 4)] is not None
    assert "| W9 | lookup |" in (tmp_path / "bench.md").read_text() and "noise: CV of normal's tok/s W9" in \
        rep["markdown"]


def test_bench_prints_adaptives_share_of_the_oracles_gain(dense_path):
    """With adaptive, each workload is also recorded and replayed by the oracle (one round): its record carries the
    oracle's speedup, and adaptive's row prints the share of that gain it won beside its speedup."""
    rep = bench("smollm2-135m", ["W3"], ["adaptive"], max_tokens=24, out=None, progress=False, noise_check=False)
    by = _by(rep)
    o, a = by["oracle"].median("oracle_speedup"), by["adaptive"].median("speedup")
    assert o >= 1.0 and by["oracle"].parity is True  # the recording's tokens are normal's
    assert all("oracle_speedup" not in r.figures for n, r in by.items() if n != "oracle")
    share = captured(a, o)  # the gain adaptive won over the oracle's: None where the oracle gained nothing
    assert (share is None) == (o <= 1.0) and (share is None or f"{share * 100:.0f}% of {o:.2f}×" in rep["markdown"])
    off = bench("smollm2-135m", ["W9"], ["adaptive"], max_tokens=4, out=None, progress=False, noise_check=False,
                oracle=False)
    assert "oracle" not in _by(off)


def test_parity_failure_is_loud(monkeypatch):
    monkeypatch.setattr(runners, "guild_workload", lambda lm, w, o: runners.WorkloadRun(
        [1, 2, 3] if o.strategy == "normal" else [1, 2, 4], 2, 1.0))
    a = argparse.Namespace(lm=None, instances={"W1": load_workloads(["W1"])[0]}, base=DecodeOptions(),
                           max_tokens=None, overrides={}, strategy_list=["normal", "lookup"], oracle=False,
                           noise_check=False, rounds=1)
    with pytest.raises(ParityError, match="W1.*lookup differs from normal at token 2"):
        measure("workloads", [{"workload": "W1", "max_draft": 4}], W.runners(a), 1, {})


def test_strategies_without_what_they_need_are_refused():
    from guild.models.mtp import MtpError

    with pytest.raises(BadFlagError, match="unknown strategy 'nope'"):
        bench(None, ["W9"], ["nope"], out=None, progress=False)
    with pytest.raises(MtpError, match="has no MTP head"):  # the dense model ships none: before any work
        bench("smollm2-135m", ["W9"], ["mtp"], out=None, progress=False)
    with pytest.raises(BadFlagError, match="--repeats must be >= 1"):
        bench(None, ["W9"], ["lookup"], repeats=0, out=None, progress=False)


def test_cli_bench_errors_are_one_line():
    """In-process: the command's own error reporting (test_cli_bench_json_and_sampling_flags runs the program)."""
    from typer.testing import CliRunner

    from guild.cli import app

    for args, needle in ((["--workloads", "W99"], "W99"), (["--top-p", "3"], "--top-p")):
        r = CliRunner().invoke(app, ["bench", "smollm2-135m", *args])
        assert r.exit_code == 1 and type(r.exception) is SystemExit, (r.output, r.exception)  # no traceback
        assert needle in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_bench_two_sessions(dense_path):
    rep = bench("smollm2-135m", ["W9"], ["lookup"], max_tokens=10, out=None, progress=False, sessions=2)
    by = _by(rep)
    assert rep["records"][0].meta["settings"]["sessions"] == 2 and "round_ms" in by["lookup"].figures
    assert by["normal"].median("generated_tokens") == by["lookup"].median("generated_tokens")
    assert by["normal"].median("generated_tokens") == 2 * 9  # two sessions x (10 tokens - the prefill's first)


META = {"commit": "c", "host": {"cores": 2, "threads": 2}, "load": [5.0, 1, 1], "load_end": [1.0, 1, 1]}


def _rec(runner, tok_s, speedup=None, windows=None):
    figs = {"decode_tok_s": stats(tok_s), "windows": series({k: [v] for k, v in (windows or {"normal": 99}).items()}),
            "distinct_experts": stats([2.0])}
    if speedup is not None:
        figs["speedup"] = stats([speedup])
    return Record("workloads", {"workload": "W1", "max_draft": 4}, runner, figs, True, META)


def test_noise_marks_ratios_within_it():
    recs = [_rec("normal", [50.0], 1.0), _rec("lookup", [52.0], 1.04, {"lookup": 20, "normal": 40, "mtp": 0}),
            _rec("adaptive", [75.0], 1.5, {"normal": 61, "lookup": 10}),
            _rec(NOISE, [46.0], 0.92)]  # the noise-check rerun: CV of (50, 46) = 5.9%
    assert noise_cv(recs) == {("W1", 4): pytest.approx(0.0589, abs=1e-4)}
    assert noise.within(1.04, 0.0589) and not noise.within(1.5, 0.0589) and not noise.within(1.04, None)
    warn = warning(recs)
    assert "load average 5.0 besides the bench's 2 threads on 2 cores" in warn and "1 ratio(s) within the noise" in warn
    assert noise.load_warning((0.5, 1, 1), (0.7, 1, 1), 2, 2, 0) is None
    # the end's load average counts the bench's own threads: 2.0 of them on 2 cores is a quiet machine, 3.5 is not
    assert noise.load_warning((0.5, 1, 1), (2.0, 1, 1), 2, 2, 0) is None
    assert "load average 1.5 besides" in noise.load_warning((0.5, 1, 1), (3.5, 1, 1), 2, 2, 0)
    assert noise.load_warning((3.0, 1, 1), (5.0, 1, 1), 16, 2, 0) is None  # cores to spare
    a = argparse.Namespace(drafts=[4], rounds=1, settings={"model": "m", "device": "cpu", "kv": ["f32", "f32"],
                                                           "rope": None, "sessions": 1, "sampling": "s"})
    md = "\n".join([table(recs, a), *notes(recs, a)])
    assert "| W1 | lookup | 52.0 | 19.2 | 1.04× (noise) |" in md and "| 1.50× |" in md and f"| W1 | {NOISE} |" not in md
    assert "| lookup 20, normal 40 |" in md and "| normal 61, lookup 10 |" in md
    assert "CV of normal's tok/s W1 5.9%" in md and "load average 5.00 at start, 1.00 at end" in md
    assert f"**{warn}**" in md
    assert "experts/layer: distinct routed experts" in md and "mean T:" in md  # the legend


def test_cli_bench_json_and_sampling_flags(tmp_path):
    r = subprocess.run([sys.executable, "-m", "guild", "bench", "smollm2-135m", "--workloads", "W9", "--strategies",
                        "lookup", "-n", "4", "-t", "1", "--device", "cpu", "--out", str(tmp_path), "--json",
                        "--temp", "0.5", "--top-k", "10", "-s", "3"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("{")  # nothing before the records (the progress goes to stderr)
    recs = [json.loads(x) for x in r.stdout.splitlines()]
    assert {x["runner"] for x in recs} == {"normal", "lookup", NOISE} and all(x["commit"] and x["host"] for x in recs)
    assert "temperature=0.5, top_k=10, seed=3" in recs[0]["settings"]["sampling"]
    assert recs[0]["command"].startswith("python -m guild bench smollm2-135m")
    assert all(float(w["median"]).is_integer() for x in recs for w in x["figures"]["windows"]["series"].values())
    assert (tmp_path / "bench.jsonl").read_text() == r.stdout
