"""The tree's rules, checked from the source: no import cycles (function-level imports included), the
library below the application, tools used by nothing."""

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# scripts/ is not a package: load the checker from its file
_spec = importlib.util.spec_from_file_location("import_graph", ROOT / "scripts" / "import_graph.py")
import_graph = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(import_graph)


def test_no_import_cycles():
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "import_graph.py")], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 cycles" in r.stdout


def test_the_cycle_finder_finds_a_cycle():
    es = [("a", "b", False, 1), ("b", "c", True, 2), ("c", "a", False, 3), ("c", "d", False, 4)]
    assert import_graph.cycles(es) == [["a", "b", "c"]]


# the library's floors, lowest first: each imports only its own floor and those below it
FLOORS = ("guild.speculative", "guild.plans", "guild.engine", "guild.models")


def broken_rules(edges) -> list[str]:
    """The edges (import_graph.edges rows) that break the tree's rules, each in words."""
    app = ("guild.cli", "guild.text.chat", "guild.serve", "guild.load")
    out = []
    for a, b, _, line in edges:
        where = f"{a} imports {b} (line {line})"
        ok = True
        if a.startswith(("guild.engine", "guild.models", "guild.speculative", "guild.kernels")):
            ok &= not b.startswith(("guild.calib", "guild.tools", "guild.bench") + app)
        if a.startswith("guild.calib"):
            ok &= not b.startswith(("guild.tools", "guild.bench") + app)
        if b.startswith(("guild.tools", "guild.bench")):
            ok &= a.startswith(("guild.tools", "guild.bench", "guild.cli"))
        if b.startswith("guild.cli"):
            ok &= a.startswith("guild.cli") or a == "guild.__main__"
        if a.startswith("guild.kernels"):
            ok &= b.startswith(("guild.kernels", "guild.errors", "guild.formats.files"))
        for i, floor in enumerate(FLOORS):
            if a.startswith(floor):
                ok &= not b.startswith(FLOORS[i + 1 :])
        if not ok:
            out.append(where)
    return out


def test_layers():
    """The engine, models and drafters never import the application, calibration or tools; calibration never
    imports the application; nothing but the CLI imports the tools and benchmarks; kernels import kernels (and
    guild.errors, guild.formats.files); no library module imports the CLI (the options its flags become are the
    library's, guild.engine.options and guild.text.options): only `python -m guild` (guild.__main__) does. No
    arrow back up the library's FLOORS: the drafters import no plan, engine or model, plans no engine, the engine
    no model."""
    edges = list(import_graph.edges())
    assert any(b.startswith("guild.cli") for _, b, _, _ in edges)  # the graph sees the CLI's importers
    assert broken_rules(edges) == []


def test_a_back_import_breaks_the_floors():
    """Each floor importing one above it is caught; importing one below is the rule."""
    planted = [("guild.engine.gpu", "guild.models.llama", False, 1), ("guild.plans.plan", "guild.engine", True, 2),
               ("guild.speculative.base", "guild.plans.plan", False, 3),
               ("guild.models.llama", "guild.engine", False, 4)]
    assert broken_rules(planted) == [f"{a} imports {b} (line {n})" for a, b, _, n in planted[:3]]


def test_window_limit_is_the_kernels_row_invariant_path():
    from guild.kernels.cpu.quant import GEMV_MAX_ROWS, ROW_INVARIANT_ROWS
    from guild.window import MAX_DRAFT, MAX_WINDOW

    assert MAX_DRAFT == MAX_WINDOW - 1 and MAX_WINDOW <= GEMV_MAX_ROWS <= ROW_INVARIANT_ROWS


def test_every_package_is_installed():
    """pyproject.toml lists its packages by name: a package folder missing there would be left out of a wheel."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {m for m, f in import_graph.modules().items() if f.name == "__init__.py"}
    assert found == listed
