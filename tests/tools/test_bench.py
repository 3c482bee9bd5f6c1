"""guild bench: runs workloads x strategies, checks parity, writes markdown and JSON."""

import json
import subprocess
import sys

import pytest

from guild.errors import BadFlagError
from guild.tools.bench import ParityError, RunRecord, _check_parity, bench


def test_bench_small_run(tmp_path, dense_path, monkeypatch):
    import guild.tools.bench as b

    calls = []
    run = b.run_workload
    monkeypatch.setattr(b, "run_workload", lambda lm, w, o, rep=0: calls.append((o.strategy, o.max_tokens))
                        or run(lm, w, o, rep))
    rep = bench("smollm2-135m", ["W9"], ["lookup", "retrieval"], max_tokens=12, out=tmp_path, progress=False)
    # each strategy ran once unmeasured (its kernels' first load or compile is not in its time), then measured
    warm = [(s, b.WARMUP_TOKENS) for s in ("normal", "lookup", "retrieval")]
    assert calls[:3] == warm and calls[3:] == [("normal", 12), ("lookup", 12), ("retrieval", 12), ("normal", 12)]
    rows = {(r["workload"], r["strategy"]): r for r in rep["rows"]}
    assert set(rows) == {("W9", "normal"), ("W9", "lookup"), ("W9", "retrieval")}
    assert rows[("W9", "normal")]["speedup"] == 1.0
    for r in rows.values():
        assert r["tok_s"] > 0 and r["generated"] == rows[("W9", "normal")]["generated"]
    data = json.loads((tmp_path / "bench.json").read_text())
    assert data["info"]["cpu"] and len(data["runs"]) == 3 and all(r["tokens"] for r in data["runs"])
    noise = data["info"]["noise"]
    assert len(noise["check_runs"]) == 1 and noise["cv"]["W9"] is not None and len(noise["load_start"]) == 3
    assert "| W9 | lookup |" in (tmp_path / "bench.md").read_text()


def test_bench_prints_adaptives_share_of_the_oracles_gain(dense_path):
    """With adaptive, each workload is also recorded and replayed by the oracle: adaptive's row carries the oracle's
    speedup and the share of its gain adaptive won, printed beside its speedup; no other row does."""
    rep = bench("smollm2-135m", ["W3"], ["adaptive"], max_tokens=24, out=None, progress=False, noise_check=False)
    rows = {r["strategy"]: r for r in rep["rows"]}
    a = rows["adaptive"]
    assert a["oracle"] >= 1.0
    if a["oracle"] > 1.0:
        assert a["captured"] * (a["oracle"] - 1) == pytest.approx(a["speedup"] - 1, abs=0.01)
    assert "oracle" not in rows["normal"]
    assert a["captured"] is None if a["oracle"] <= 1.0 else f"% of {a['oracle']:.2f}×" in rep["markdown"]
    off = bench("smollm2-135m", ["W9"], ["adaptive"], max_tokens=4, out=None, progress=False, noise_check=False,
                oracle=False)
    assert all("oracle" not in r for r in off["rows"])


def test_parity_failure_is_loud():
    a = RunRecord("W1", "normal", 0, [[1, 2, 3]], 2, 1.0, 0, 0)
    b = RunRecord("W1", "lookup", 0, [[1, 2, 4]], 2, 1.0, 3, 1)
    with pytest.raises(ParityError, match="W1 lookup repeat 0 turn 1 differs from normal at generated token 2"):
        _check_parity(b, a)


def test_strategies_without_what_they_need_are_refused():
    from guild.models.mtp import MtpError

    with pytest.raises(BadFlagError, match="unknown strategy 'nope'"):
        bench(None, ["W9"], ["nope"], out=None, progress=False)
    with pytest.raises(MtpError, match="has no MTP head"):  # the dense model ships none: before any work
        bench("smollm2-135m", ["W9"], ["mtp"], out=None, progress=False)


def test_cli_bench_errors_are_one_line():
    """In-process: the command's own error reporting (test_cli_bench_json_and_sampling_flags runs the program)."""
    from typer.testing import CliRunner

    from guild.cli import app

    for args, needle in ((["--workloads", "W99"], "W99"), (["--top-p", "3"], "--top-p")):
        r = CliRunner().invoke(app, ["bench", "smollm2-135m", *args])
        assert r.exit_code == 1 and type(r.exception) is SystemExit, (r.output, r.exception)  # no traceback
        assert needle in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_bench_two_sessions(tmp_path, dense_path):
    rep = bench("smollm2-135m", ["W9"], ["lookup"], max_tokens=10, out=None, progress=False, sessions=2)
    rows = {r["strategy"]: r for r in rep["rows"]}
    assert rep["info"]["sessions"] == 2 and rows["normal"]["generated"] == rows["lookup"]["generated"]
    assert rows["normal"]["generated"] == 2 * 9  # two sessions x (10 tokens - the prefill's first)


def _rec(w, s, rep, tok_s, windows=None):
    r = RunRecord(w, s, rep, [[1, 2]], 100, 100 / tok_s, 0, 0)
    r.windows.update(windows or {"normal": 99})
    return r


def test_noise_marks_ratios_within_it():
    from guild.tools.bench import load_warning, markdown, noise, summarise

    recs = [_rec("W1", "normal", 0, 50.0), _rec("W1", "lookup", 0, 52.0, {"lookup": 20, "normal": 40}),
            _rec("W1", "adaptive", 0, 75.0, {"normal": 61, "lookup": 10})]
    checks = [_rec("W1", "normal", 0, 46.0)]  # the noise-check rerun: CV of (50, 46) = 5.9%
    cv = noise(recs, checks)
    assert cv == {"W1": pytest.approx(0.0589, abs=1e-4)}
    rows = {r["strategy"]: r for r in summarise(recs, cv)}
    assert rows["lookup"]["reliable"] is False and rows["adaptive"]["reliable"] is True  # 1.04x vs 1.50x
    assert rows["normal"]["reliable"] is None and rows["lookup"]["windows"] == {"lookup": 20, "normal": 40}
    assert all(type(v) is int for r in rows.values() for v in r["windows"].values())
    warn = load_warning((5.0, 1, 1), (1.0, 1, 1), 2, list(rows.values()), threads=2)
    assert "load average 5.0 besides the bench's 2 threads on 2 cores" in warn and "1 ratio(s) within the noise" in warn
    assert load_warning((0.5, 1, 1), (0.7, 1, 1), 2, [rows["adaptive"]], threads=2) is None
    # the end's load average counts the bench's own threads: 2.0 of them on 2 cores is a quiet machine, 3.5 is not
    assert load_warning((0.5, 1, 1), (2.0, 1, 1), 2, [rows["adaptive"]], threads=2) is None
    assert "load average 1.5 besides" in load_warning((0.5, 1, 1), (3.5, 1, 1), 2, [rows["adaptive"]], threads=2)
    assert load_warning((3.0, 1, 1), (5.0, 1, 1), 16, [rows["adaptive"]], threads=2) is None  # cores to spare
    info = {"guild": "0", "model": "m", "cpu": "c", "threads": 2, "sessions": 1, "repeats": 1, "sampling": "s",
            "noise": {"cv": cv, "load_start": [5.0, 1, 1], "load_end": [1.0, 1, 1], "cores": 2, "warning": warn}}
    md = markdown(list(rows.values()), info)
    assert "| W1 | lookup | 52.0 | 19.2 | 1.04× (noise) |" in md and "| 1.50× |" in md
    assert "CV of normal's tok/s W1 5.9%" in md and "load average 5.00 at start, 1.00 at end" in md
    assert "experts/layer: distinct routed experts" in md and "mean T:" in md  # the legend


def test_cli_bench_json_and_sampling_flags(tmp_path):
    r = subprocess.run([sys.executable, "-m", "guild", "bench", "smollm2-135m", "--workloads", "W9", "--strategies",
                        "lookup", "-n", "4", "-t", "1", "--device", "cpu", "--out", str(tmp_path), "--json",
                        "--temp", "0.5", "--top-k", "10", "-s", "3"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("{")  # nothing before the object (the progress bar goes to stderr)
    rep = json.loads(r.stdout)
    assert "temperature=0.5, top_k=10, seed=3" in rep["info"]["sampling"]
    assert all(type(v) is int for row in rep["rows"] for v in row["windows"].values())
