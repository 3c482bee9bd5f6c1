"""No test holds guild to the wall clock: a limit in real seconds fails on a loaded machine and passes on a broken
one. Limits are CPU time (time.process_time, resource.getrusage, a child's /proc CPU time) or counted work,
schedulers run on a fixed clock (tests/conftest.py `fixed_clock`), and speeds belong to the benchmarks.

What the scan below flags, in the code (not strings) of every file under tests/:
1. a wall-clock read (time.time, time.perf_counter, time.monotonic and their _ns forms, datetime.now/utcnow)
   inside an `assert` or a comparison, e.g. `assert time.perf_counter() - t0 < 60`, `while time.time() < end`;
2. a comparison or `assert` that uses a name assigned from a wall-clock read, e.g. `dt = time.monotonic() - t0`
   then `assert dt < 2`, or `deadline = time.time() + 60` then `now > deadline`;
3. a call's `timeout=` under 60 s given as a number: a timeout is a hang guard, many times what the call takes on
   a loaded machine, never the bound a test checks.
A line may carry `# wall: <why>` where a wall-clock bound is only a backstop for a case blocked off the CPU and
far beyond any run (the fuzz harness's); nothing else is exempt.
"""

import ast
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
CLOCKS = {"time", "perf_counter", "monotonic", "time_ns", "perf_counter_ns", "monotonic_ns", "now", "utcnow"}
MIN_TIMEOUT_S = 60
# wall-clock waits allowed while their fix is pending, as (file, line text); an entry that no longer matches fails
PENDING: set[tuple[str, str]] = set()


def _is_clock(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call):
        return False
    f = node.func
    if isinstance(f, ast.Attribute):  # time.perf_counter(), datetime.now(), datetime.datetime.now()
        base = f.value.attr if isinstance(f.value, ast.Attribute) else getattr(f.value, "id", "")
        return f.attr in CLOCKS and base in ("time", "datetime")
    return isinstance(f, ast.Name) and f.id in CLOCKS - {"time", "now"}  # from time import perf_counter


def _reads_clock(node: ast.AST, derived: set) -> bool:
    return any(_is_clock(n) or (isinstance(n, ast.Name) and n.id in derived)
               or (isinstance(n, ast.Attribute) and n.attr in derived) for n in ast.walk(node))


def wall_clock_asserts(source: str) -> list[tuple[int, str]]:
    """(line, reason) of every wall-clock assertion in a test file's source (rules 1-3 above)."""
    tree = ast.parse(source)
    lines = source.splitlines()
    derived: set = set()  # names and attributes assigned from a clock read
    for n in ast.walk(tree):
        if isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and n.value is not None \
                and any(_is_clock(c) for c in ast.walk(n.value)):
            targets = list(n.targets if isinstance(n, ast.Assign) else [n.target])
            while targets:  # the names bound, not those read on the way (`pr` of `pr.deadline = ...`)
                t = targets.pop()
                if isinstance(t, ast.Name):
                    derived.add(t.id)
                elif isinstance(t, ast.Attribute):
                    derived.add(t.attr)
                elif isinstance(t, (ast.Tuple, ast.List)):
                    targets += t.elts
    found = []
    for n in ast.walk(tree):
        if isinstance(n, (ast.Assert, ast.Compare)) and _reads_clock(n.test if isinstance(n, ast.Assert) else n,
                                                                      derived):
            found.append((n.lineno, "a wall-clock reading compared"))
        elif isinstance(n, ast.Call):
            for kw in n.keywords:
                if kw.arg == "timeout" and isinstance(kw.value, ast.Constant) \
                        and isinstance(kw.value.value, (int, float)) and kw.value.value < MIN_TIMEOUT_S:
                    found.append((n.lineno, f"timeout={kw.value.value} s used as a limit"))
    return sorted({(ln, why) for ln, why in found if "# wall:" not in lines[ln - 1]})


def _scan() -> list[tuple[str, int, str, str]]:
    out = []
    for p in sorted(TESTS.rglob("*.py")):
        src = p.read_text()
        lines = src.splitlines()
        rel = p.relative_to(TESTS).as_posix()
        out += [(rel, ln, why, lines[ln - 1].strip()) for ln, why in wall_clock_asserts(src)]
    return out


def test_no_wall_clock_assertion_in_the_tests():
    found = _scan()
    bad = [f"tests/{rel}:{ln}: {why}: {text}" for rel, ln, why, text in found if (rel, text) not in PENDING]
    assert not bad, "\n".join(bad)
    assert {(rel, text) for rel, _, _, text in found} == PENDING  # a fixed pending entry leaves the list


@pytest.mark.parametrize("planted", [
    "import time\nt0 = time.perf_counter()\nrun()\nassert time.perf_counter() - t0 < 60\n",
    "import time\nt0 = time.monotonic()\nrun()\ndt = time.monotonic() - t0\nassert dt < 2\n",
    "from time import perf_counter\nend = perf_counter() + 5\nwhile perf_counter() < end:\n    poll()\n",
    "import subprocess\nsubprocess.run(['guild'], timeout=10)\n",
    "import datetime\nstart = datetime.datetime.now()\nrun()\nok = (datetime.datetime.now() - start).seconds < 9\n",
])
def test_the_scan_finds_planted_wall_clock_asserts(planted):
    assert wall_clock_asserts(planted)


@pytest.mark.parametrize("allowed", [
    "import time\nc0 = time.process_time()\nrun()\nassert time.process_time() - c0 < 60\n",
    "import time\nt0 = time.perf_counter()\nrun()\nprint(f'{time.perf_counter() - t0:.1f} s')\n",
    "import subprocess\nsubprocess.run(['guild'], timeout=600)\n",
    "import time\nend = time.monotonic() + 600  # wall: a backstop\nstuck = time.monotonic() > end  # wall: same\n",
])
def test_the_scan_allows_cpu_time_reports_and_hang_guards(allowed):
    assert wall_clock_asserts(allowed) == []
