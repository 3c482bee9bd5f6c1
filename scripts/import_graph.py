"""The import graph of guild's source (guild/, kernels/ as guild.kernels, calib/ as guild.calib), read from the
code with `ast`: module-level and function-level imports alike. Fails (exit 1) on an import cycle.

    python scripts/import_graph.py            # cycles (if any) and counts
    python scripts/import_graph.py --edges    # every edge, `a -> b`, function-level ones marked (fn)
    python scripts/import_graph.py --local    # every function-level import of a project module, with its line

Only explicitly written imports count (not the implicit import of a parent package).
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# source folder -> package name (pyproject's package-dir)
PACKAGES = {"guild": "guild", "kernels": "guild.kernels", "calib": "guild.calib"}


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Module name -> file, for every .py file of the three packages."""
    out = {}
    for folder, pkg in PACKAGES.items():
        for f in sorted((root / folder).rglob("*.py")):
            rel = f.relative_to(root / folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            out[".".join([pkg, *parts])] = f
    return out


def _resolve(name: str, mods: dict) -> str | None:
    """The project module an import names: the longest prefix of `name` that is one of ours."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        cand = ".".join(parts[:n])
        if cand in mods:
            return cand
    return None


def edges(root: Path = ROOT) -> list[tuple[str, str, bool, int]]:
    """(importer, imported, function_level, line) for every import of a project module."""
    mods = modules(root)
    out = []
    for mod, f in mods.items():
        is_pkg = f.name == "__init__.py"
        tree = ast.parse(f.read_text(), str(f))
        top = set(id(n) for n in tree.body)
        # imports inside `if TYPE_CHECKING:` / try blocks at module level are still module level
        for node in tree.body:
            if isinstance(node, (ast.If, ast.Try)):
                top.update(id(n) for n in ast.walk(node))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
                    base = base[: len(base) - (node.level - 1)]
                    prefix = ".".join(base + ([node.module] if node.module else []))
                else:
                    prefix = node.module or ""
                names = [f"{prefix}.{a.name}" for a in node.names]
                names = [n if _resolve(n, mods) == n else prefix for n in names]
            else:
                continue
            for n in dict.fromkeys(names):
                target = _resolve(n, mods)
                if target is not None and target != mod:
                    out.append((mod, target, id(node) not in top, node.lineno))
    return out


def cycles(es) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    graph: dict[str, set[str]] = {}
    for a, b, _, _ in es:
        graph.setdefault(a, set()).add(b)
        graph.setdefault(b, set())
    index, low, stack, on, comps = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return comps


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--edges", action="store_true", help="print every edge")
    ap.add_argument("--local", action="store_true", help="print every function-level import of a project module")
    a = ap.parse_args(argv)
    es = edges()
    if a.edges:
        for x, y, fn, line in sorted(set(es)):
            print(f"{x} -> {y}" + (f"  (fn, line {line})" if fn else ""))
    if a.local:
        mods = modules()
        for x, y, fn, line in es:
            if fn:
                print(f"{mods[x].relative_to(ROOT)}:{line}: {y}")
    cyc = cycles(es)
    n_fn = sum(1 for e in es if e[2])
    print(f"{len(modules())} modules, {len(es)} project imports ({n_fn} function-level), {len(cyc)} cycles")
    for c in cyc:
        print("cycle: " + " <-> ".join(c))
    return 1 if cyc else 0


if __name__ == "__main__":
    sys.exit(main())
