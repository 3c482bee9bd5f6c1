"""`python -m guild.bench CASE [flags]`: one harness, every benchmark a case of it.

    python -m guild.bench list                          the cases
    python -m guild.bench decode --rounds 3             a case; --json prints its records as JSON Lines
    python -m guild.bench report results/*.jsonl        the current-figures table (docs/benchmarks.md);
                                                        --baseline RUNNER first: beside another runner

Flags every case shares: --threads, --rounds (alternated: the runners' order reverses every other round), --out
(CASE.jsonl and CASE.md written there), --json. The rest are the case's own (`python -m guild.bench CASE -h`).
Exit status: 2 on a bad flag or a parity failure; 1 when the case's failed(a) says so after its report (e.g. a
json_schema reply that does not validate).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shlex
import sys

from ..errors import GuildError
from . import output
from .harness import CHILD_FLAG, child_main, in_child, measure
from .host import provenance

# case name -> module under guild.bench.cases; a new benchmark is a module there and one line here
CASES = {
    "decode": "decode",
    "windows": "windows",
    "long": "long",
    "fresh": "fresh",
    "workloads": "workloads",
    "drafters": "drafters",
    "step": "step",
    "agreement": "agreement",
    "hybrid": "hybrid",
    "scale": "scale",
    "quant": "quant",
    "kernels": "kernels",
    "json_schema": "json_schema",
    "serve": "serve",
    "beyond_ram": "beyond_ram",
}
REPORT_FIGURES = ("decode_tok_s", "prefill_tok_s", "ttft_ms", "rss_added_mb")


def case_module(name: str):
    if name not in CASES:
        raise GuildError(f"unknown case '{name}' (choose from {', '.join(CASES)}, or list, report)")
    return importlib.import_module(f"{__package__}.cases.{CASES[name]}")


def parser(name: str, mod) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=f"python -m guild.bench {name}", description=mod.__doc__.split("\n\n")[0])
    ap.add_argument("-t", "--threads", type=int, default=getattr(mod, "THREADS", None) or os.cpu_count(),
                    help="threads for every runner (default: %(default)s)")
    ap.add_argument("-r", "--rounds", type=int, default=getattr(mod, "ROUNDS", 3),
                    help="alternated rounds; figures are medians over them (default: %(default)s)")
    ap.add_argument("--out", default=None, help="folder for CASE.jsonl and CASE.md")
    ap.add_argument("--json", action="store_true", help="the records as JSON Lines on stdout")
    ap.add_argument(CHILD_FLAG, help=argparse.SUPPRESS)
    ap.add_argument("--point", help=argparse.SUPPRESS)
    mod.add_args(ap)
    return ap


def run_case(name: str, argv: list[str]) -> int:
    mod = case_module(name)
    a = parser(name, mod).parse_args(argv)
    if a.threads < 1 or a.rounds < 1:
        raise GuildError("--threads and --rounds must be >= 1")
    a.notices = []  # what a case wants said: a runner left out, and why
    mod.check(a)
    if a.child:  # one measurement in this fresh process (harness.in_child)
        child_main(next(r for r in mod.runners(a) if r.name == a.child), json.loads(a.point))
        return 0
    records, md = run(name, mod, a, argv, command=shlex.join(["python", "-m", "guild.bench", name, *argv]))
    print(output.jsonl(records) if a.json else md, end="" if a.json else "\n")
    return 1 if getattr(mod, "failed", lambda a: False)(a) else 0


def run(name: str, mod, a, argv: list[str], stem: str | None = None,
        progress=lambda s: print(s, file=sys.stderr, flush=True), command: str | None = None) -> tuple[list, str]:
    """A checked case measured: its records and its table (the case's own `table`, else output.markdown), both
    written to --out as STEM.jsonl and STEM.md (STEM: the case's name). `a.settings`, where the case sets it, is
    what it ran under (model, options) and goes into every record. `command` reproduces the run (default: this
    process's command line)."""
    runners = mod.runners(a)
    notices = getattr(a, "notices", [])
    for n in notices:
        progress(f"{name}: {n}")
    if getattr(mod, "CHILD", False):
        passed = [x for x in argv if x != "--json"]
        runners = [in_child(r, name, passed) for r in runners]
    meta = {**provenance(a.threads, command), **({"settings": a.settings} if getattr(a, "settings", None) else {})}
    records = measure(name, mod.points(a), runners, a.rounds, meta, progress, getattr(mod, "SPEEDUP_OF", None))
    meta["load_end"] = [round(x, 2) for x in os.getloadavg()]
    table = getattr(mod, "table", lambda r, a: output.markdown(r, getattr(mod, "BASELINE", None)))
    notes = getattr(mod, "notes", lambda r, a: [])(records, a)
    md = "\n".join([table(records, a), *notes, *notices, "", output.footer(meta)])
    if a.out:
        output.write(records, a.out, stem or name, md)
    return records, md


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        if not argv or argv[0] in ("-h", "--help"):
            print(__doc__)
            return 0 if argv else 1
        if argv[0] == "list":
            for name in CASES:  # each case's first sentence
                first = " ".join(case_module(name).__doc__.split("\n\n")[0].split()).split(". ")[0].rstrip(".")
                print(f"{name:12s} {first}")
            return 0
        if argv[0] == "report":  # report [--baseline RUNNER] FILE.jsonl ...
            base, files = "llama.cpp", argv[1:]
            if files[:1] == ["--baseline"]:
                base, files = (files[1] if len(files) > 1 else ""), files[2:]
            if not base or not files:
                raise GuildError("report: give [--baseline RUNNER] FILE.jsonl ...")
            print(output.current(output.read(files), REPORT_FIGURES, base))
            return 0
        return run_case(argv[0], argv[1:])
    except GuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
