"""The counts table of docs/testing.md, from one collection of the suite (`pytest --collect-only`, nothing run):
tests per marker (gpu, oracle, slow) and per top-level tests/ directory, written between the markers
<!-- test-counts --> and <!-- /test-counts -->.

    python scripts/test_counts.py           # rewrite the table
    python scripts/test_counts.py --check   # exit 1 when the committed table is not the suite's

One collection, each test's markers read from it: the same counts as `pytest --collect-only -q -m MARKER` per marker,
in one pass (about 6 s of CPU on 2 cores). A module skipped at collection (an optional module missing) would be
left out of the counts, so then nothing is written and the exit status is 2.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "testing.md"
BEGIN, END = "<!-- test-counts -->", "<!-- /test-counts -->"
MARKERS = ("gpu", "oracle", "slow")


class _Collector:
    def __init__(self):
        self.items: list[tuple[str, set[str]]] = []
        self.skipped: list[str] = []

    def pytest_collectreport(self, report):
        if report.skipped:
            self.skipped.append(report.nodeid)

    def pytest_collection_modifyitems(self, items):
        self.items = [(it.nodeid, {m.name for m in it.iter_markers()}) for it in items]


def collect() -> list[tuple[str, set[str]]]:
    """(node id, marker names) of every test the suite collects."""
    import pytest

    c = _Collector()
    with open(os.devnull, "w") as null, contextlib.redirect_stdout(null):
        rc = pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", str(ROOT / "tests")], plugins=[c])
    if rc != 0:
        raise SystemExit(f"collection failed (pytest exit {rc})")
    if c.skipped:
        print(f"skipped at collection, so not counted: {', '.join(c.skipped)}", file=sys.stderr)
        raise SystemExit(2)
    return c.items


def table(items) -> str:
    by_dir = Counter(n.split("/")[1] if n.count("/") > 1 else n.split("/")[-1].split("::")[0] for n, _ in items)
    rows = ["| tests | count |", "| --- | ---: |", f"| all | {len(items):,} |"]
    rows += [f"| `-m {m}` | {sum(m in ms for _, ms in items):,} |" for m in MARKERS]
    rows += [f"| `-m \"not slow\"` | {sum('slow' not in ms for _, ms in items):,} |"]
    rows += [f"| `tests/{d}` | {k:,} |" for d, k in sorted(by_dir.items())]
    return "\n".join(rows)


def rewrite(text: str, tab: str) -> str:
    i, j = text.index(BEGIN), text.index(END)
    return text[: i + len(BEGIN)] + "\n" + tab + "\n" + text[j:]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when docs/testing.md's table is out of date")
    a = ap.parse_args(argv)
    text = DOC.read_text()
    new = rewrite(text, table(collect()))
    if a.check:
        if new != text:
            print("docs/testing.md: the test counts are out of date (python scripts/test_counts.py)", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
