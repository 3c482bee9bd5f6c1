"""guild bench: runs workloads x strategies, checks parity, writes markdown and JSON."""

import json
import subprocess
import sys

import pytest

from guild.errors import BadFlagError
from guild.tools.bench import ParityError, RunRecord, _check_parity, bench


def test_bench_small_run(tmp_path, dense_path):
    rep = bench("smollm2-135m", ["W9"], ["lookup", "retrieval"], max_tokens=12, out=tmp_path, progress=False)
    rows = {(r["workload"], r["strategy"]): r for r in rep["rows"]}
    assert set(rows) == {("W9", "normal"), ("W9", "lookup"), ("W9", "retrieval")}
    assert rows[("W9", "normal")]["speedup"] == 1.0
    for r in rows.values():
        assert r["tok_s"] > 0 and r["generated"] == rows[("W9", "normal")]["generated"]
    data = json.loads((tmp_path / "bench.json").read_text())
    assert data["info"]["cpu"] and len(data["runs"]) == 3
    assert "| W9 | lookup |" in (tmp_path / "bench.md").read_text()


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
    r = subprocess.run([sys.executable, "-m", "guild", "bench", "smollm2-135m", "--workloads", "W99"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 1 and "Traceback" not in r.stderr and "W99" in r.stderr


def test_bench_two_sessions(tmp_path, dense_path):
    rep = bench("smollm2-135m", ["W9"], ["lookup"], max_tokens=10, out=None, progress=False, sessions=2)
    rows = {r["strategy"]: r for r in rep["rows"]}
    assert rep["info"]["sessions"] == 2 and rows["normal"]["generated"] == rows["lookup"]["generated"]
    assert rows["normal"]["generated"] == 2 * 9  # two sessions x (10 tokens - the prefill's first)
