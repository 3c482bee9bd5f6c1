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


def test_layers():
    """The engine, models and drafters never import the application, calibration or tools; calibration never
    imports the application; nothing but the CLI imports the tools and benchmarks; kernels import kernels (and guild.errors,
    guild.formats.files); no library module imports the CLI (the options its flags become are the library's,
    guild.engine.options and guild.text.options): only `python -m guild` (guild.__main__) does."""
    app = ("guild.cli", "guild.text.chat", "guild.serve", "guild.load")
    edges = list(import_graph.edges())
    assert any(b.startswith("guild.cli") for _, b, _, _ in edges)  # the graph sees the CLI's importers
    for a, b, _, line in edges:
        where = f"{a} imports {b} (line {line})"
        if a.startswith(("guild.engine", "guild.models", "guild.speculative", "guild.kernels")):
            assert not b.startswith(("guild.calib", "guild.tools", "guild.bench") + app), where
        if a.startswith("guild.calib"):
            assert not b.startswith(("guild.tools", "guild.bench") + app), where
        if b.startswith(("guild.tools", "guild.bench")):
            assert a.startswith(("guild.tools", "guild.bench", "guild.cli")), where
        if b.startswith("guild.cli"):
            assert a.startswith("guild.cli") or a == "guild.__main__", where
        if a.startswith("guild.kernels"):
            assert b.startswith(("guild.kernels", "guild.errors", "guild.formats.files")), where


def test_window_limit_is_the_kernels_row_invariant_path():
    from guild.kernels.cpu.quant import GEMV_MAX_ROWS, ROW_INVARIANT_ROWS
    from guild.window import MAX_DRAFT, MAX_WINDOW

    assert MAX_DRAFT == MAX_WINDOW - 1 and MAX_WINDOW <= GEMV_MAX_ROWS <= ROW_INVARIANT_ROWS
