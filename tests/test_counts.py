"""docs/testing.md's table of test counts is the suite's: scripts/test_counts.py --check collects the suite (nothing
runs; about 6 s of CPU) and fails when the committed table differs. Where a module skips at collection (an optional
module missing) the counts cannot be checked here, and the test says so by skipping."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_the_committed_counts_are_the_suites():
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "test_counts.py"), "--check"], cwd=ROOT,
                       capture_output=True, text=True, timeout=600)
    if r.returncode == 2:
        pytest.skip(r.stderr.strip())
    assert r.returncode == 0, r.stderr + r.stdout[-2000:]


def test_the_table_is_rewritten_between_its_markers():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import test_counts as tc
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    items = [("tests/a/test_x.py::t1", {"gpu"}), ("tests/a/test_x.py::t2", {"slow", "oracle"}),
             ("tests/test_top.py::t", set())]
    tab = tc.table(items)
    assert "| all | 3 |" in tab and "| `-m gpu` | 1 |" in tab and "| `-m \"not slow\"` | 2 |" in tab
    assert "| `tests/a` | 2 |" in tab and "| `tests/test_top.py` | 1 |" in tab
    doc = f"before\n{tc.BEGIN}\nold\n{tc.END}\nafter\n"
    assert tc.rewrite(doc, tab) == f"before\n{tc.BEGIN}\n{tab}\n{tc.END}\nafter\n"
