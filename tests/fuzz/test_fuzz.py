"""A bounded fuzz run in CI: a few hundred mutated GGUFs, plans, chat templates and inputs, each in a worker
capped at 4 GiB of address space and 10 s of CPU time (a loaded machine stretches the wall time, not the CPU
time); every case must succeed or raise a one-line GuildError (input validation; an error from guild's own code
is a crash, non-finite logits garbage). The long run is `make fuzz`
(10,000 cases); a failure here replays with `python -m tests.fuzz.harness --replay CAT:IDX`."""

import tempfile
from pathlib import Path

import pytest

from .harness import CATEGORIES, plan_cases, run_cases, summary

pytestmark = pytest.mark.slow

N_CASES = 600
# a case's peak resident memory: the seeds and mutated files are kilobytes and a template render may grow by 256
# MiB, so ~700 MB at most is what the cases take (measured: 250-660 MB); the 4 GiB cap would only stop runaways
PEAK_MB = 1024


def test_hostile_inputs_work_or_fail_in_one_line():
    cases = plan_cases(N_CASES)
    before = set(Path(tempfile.gettempdir()).glob("guild-fuzz*"))
    res = run_cases(cases, workers=2, cpu_limit=10)
    assert len(res) == len(cases)
    assert set(Path(tempfile.gettempdir()).glob("guild-fuzz*")) <= before  # the workers' files went with the run
    bad = [r for r in res if r["outcome"] not in ("ok", "clean")]
    assert not bad, [(r["cat"], r["idx"], r["outcome"], r.get("exc"), r.get("where"), r.get("msg"), r.get("traceback"))
                     for r in bad[:8]]
    multiline = [r for r in res if r.get("multiline")]
    assert not multiline, [(r["cat"], r["idx"], r.get("msg")) for r in multiline[:8]]
    s = summary(res)
    for c in CATEGORIES:  # the mutators reach both sides: files that still work and files that are refused
        assert s[c].get("ok", 0) > 0 and s[c].get("clean", 0) > 0, (c, s[c])
    assert max(v["peak_mb"] for v in s.values()) < PEAK_MB, {c: v["peak_mb"] for c, v in s.items()}
