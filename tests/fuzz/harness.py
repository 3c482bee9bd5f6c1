"""Fuzz runner: worker processes (4 GiB address space each, RLIMIT_AS) run cases that the parent hands out one
at a time with a limit on the CPU time the worker spends on it (read from /proc; a loaded machine stretches
the wall time, not this) and a wall-clock backstop many times longer for a case blocked off the CPU; a worker
that overruns either is killed (a hang), one that dies is a crash by signal. Outcomes: ok, clean (a GuildError:
input validation refused the case), crash (any other exception, with its traceback: guild's own code failing,
which no broad except re-wraps as a GuildError), hang, signal, and garbage (a model run that returned non-finite
logits). All but ok and clean fail a run."""

from __future__ import annotations

import argparse
import json
import os
import resource
import selectors
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np

AS_LIMIT = 4 * 2**30
CATEGORIES = ("gguf", "plan", "template", "input")
CAT_ID = {c: i + 1 for i, c in enumerate(CATEGORIES)}
ROOT = Path(__file__).resolve().parents[2]
_TICK = os.sysconf("SC_CLK_TCK")
# a case blocked off the CPU (a deadlock) never reaches its CPU limit: it is a hang after this many times the
# limit in wall time (at least a minute), far beyond what any case takes on a loaded machine
WALL_BACKSTOP = 30


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of process pid so far (proc(5) /proc/pid/stat fields 14 and 15)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICK


# ------------------------------------------------------------------------------------------------ worker side
class Worker:
    """In-process case runner (what each worker process holds: seeds written, a tokenizer, a base model)."""

    def __init__(self, d: Path):
        from guild.formats.gguf import GGUFFile
        from guild.text.tokenizer import Tokenizer

        from . import gen

        self.d, self.gen = d, gen
        self.seeds = gen.write_seeds(d / "seeds")
        self.seed_bytes = {k: Path(p).read_bytes() for k, p in self.seeds.items()}
        self.plan_seed = gen.seed_plan()
        self.tok = Tokenizer.from_metadata(GGUFFile(self.seeds["llama"]).metadata)
        self.template = self.tok.chat_template
        self._base = None
        # every kernel compiled (or read from Numba's cache) before timing; each worker starts at its own share of
        # the seeds and types, so that cold workers compile different kernels at once and then read the others'
        share = _rotation()
        seeds = list(enumerate(gen.GGUF_SEEDS))
        for i, name in _rotated(seeds, share):
            assert self.run_gguf(i, None) == "ok", name
        _warm_quant_kernels(share)

    def base(self):
        if self._base is None:
            from guild.models import load_model

            self._base = load_model(str(self.seeds["llama"]))
        return self._base

    def case(self, cat: str, idx: int):
        rng = np.random.default_rng([CAT_ID[cat], idx])
        return getattr(self, "run_" + cat)(idx, rng)

    def run_gguf(self, idx, rng):
        name = self.gen.GGUF_SEEDS[idx % len(self.gen.GGUF_SEEDS)]
        data = self.seed_bytes[name] if rng is None else self.gen.mutate_gguf(self.seed_bytes[name], rng)
        p = self.d / f"case_{name}.gguf"
        p.write_bytes(data)
        if name == "mtp":
            from guild.models.mtp import find_mtp_head

            base = self.base()
            head = find_mtp_head(base, p, draft_vocab=None if rng is None else int(rng.choice([0, 32, 64])) or None)
            cache = head.new_cache(32)
            _, logits = head.forward(np.array([1, 2, 3]), np.zeros((3, base.args.dim), np.float32), cache, 1)
            return "ok" if np.isfinite(logits).all() else "garbage"
        from guild.formats.gguf import GGUFFile
        from guild.models import load_model
        from guild.text.tokenizer import Tokenizer

        g = GGUFFile(p)
        tok = Tokenizer.from_metadata(g.metadata)
        model = load_model(g)
        st = model.new_state(32)
        ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": "hi"}]))[:12] or [0]
        logits = model.forward(np.array(ids), st)
        st.commit(len(ids))
        logits2 = model.forward(np.array([ids[-1]]), st, last_only=True)
        return "ok" if np.isfinite(logits).all() and np.isfinite(logits2).all() else "garbage"

    def run_plan(self, idx, rng):
        import io

        from rich.console import Console

        from guild.cli.inspect import inspect
        from guild.plans.plan import read_plan

        p = self.d / "case.gexec"
        p.write_bytes(self.gen.mutate_plan(self.plan_seed, rng))
        plan = read_plan(p)
        plan.draft_costs()
        con = Console(file=io.StringIO(), width=120)
        d = inspect(p, full=True, console=con)
        json.dumps(d)
        return "ok"

    def run_template(self, idx, rng):
        t = self.tok
        t.chat_template = self.gen.mutate_template(rng)
        t._template_cache = None
        msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "hello"}, {"role": "user", "content": "again"}]
        out = t.apply_chat_template(msgs)
        t.encode(out[:100_000])
        return "ok"

    def run_input(self, idx, rng):
        kind, payload = self.gen.make_input(rng)
        self.tok.chat_template, self.tok._template_cache = self.template, None  # the seed's, not a fuzzed one
        try:
            from guild.text import inputs
        except ImportError:  # a guild (PYTHONPATH) without input checks: prompts and files pass through unchecked
            inputs = None
        if kind == "prompt":
            text = os.fsdecode(payload)  # what sys.argv holds for these bytes
            if inputs is not None:
                text = inputs.prompt_text(text, "-p/--prompt")
            turns = [text]
        else:
            p = self.d / "conv.yaml"
            if kind == "zeros":
                p.unlink(missing_ok=True)
                with open(p, "wb") as f:
                    f.truncate(payload)
            else:
                p.write_bytes(payload)
            turns = inputs.conversation_turns(p)[1]  # the user turns `guild run --conversation` reads
        for tx in turns:
            self.tok.encode(self.tok.apply_chat_template([{"role": "user", "content": tx}]))
        return "ok"


def _rotation() -> float:
    """This worker's starting point in its warm-up lists, a fraction in [0, 1) (the parent sets it per worker)."""
    return float(os.environ.get("GUILD_FUZZ_WARM_FROM", "0"))


def _rotated(items: list, share: float) -> list:
    k = int(share * len(items))
    return items[k:] + items[:k]


def _warm_quant_kernels(share: float = 0.0) -> None:
    """A mutated file may give a tensor any supported quant type: compile each type's matmul and row lookup now
    (1 and 3 rows), so that a first-time Numba compile is not timed as a hang."""
    from gguf.constants import GGML_QUANT_SIZES

    from guild.formats.gguf import SUPPORTED_QTYPES
    from guild.kernels.cpu.quant import dequantize_rows, matmul, pack

    for qt in _rotated(list(SUPPORTED_QTYPES), share):
        bs, ts = GGML_QUANT_SIZES[qt]
        w = pack(qt, np.zeros((4, 256 // bs * ts), np.uint8), 4, 256)
        for t in (1, 3):
            matmul(w, np.ones((t, 256), np.float32), np.empty((t, 4), np.float32))
        dequantize_rows(w, np.array([1, 2]), np.empty((2, 256), np.float32))


def _peak_reset() -> None:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM (proc(5), /proc/pid/clear_refs)
    except OSError:
        pass


def _peak_kb() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


def run_one(w: Worker, cat: str, idx: int) -> dict:
    from guild.errors import GuildError

    _peak_reset()
    t0 = time.perf_counter()
    rec = {"cat": cat, "idx": idx}
    try:
        rec["outcome"] = w.case(cat, idx)
    except GuildError as e:
        msg = str(e)
        rec.update(outcome="clean", exc=type(e).__name__, msg=msg[:300], multiline="\n" in msg.strip())
    except BaseException as e:  # noqa: BLE001 - the point is to see every other exception
        if isinstance(e, KeyboardInterrupt):
            raise
        tb = traceback.extract_tb(e.__traceback__)
        where = f"{Path(tb[-1].filename).name}:{tb[-1].lineno}" if tb else "?"
        rec.update(outcome="crash", exc=type(e).__name__, msg=(str(e).splitlines() or [""])[0][:200], where=where,
                   traceback="".join(traceback.format_exception(e, limit=-25))[-6000:])
    rec["s"] = round(time.perf_counter() - t0, 3)
    rec["peak_kb"] = _peak_kb()
    return rec


def worker_main() -> None:
    out = os.fdopen(os.dup(1), "w", buffering=1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)  # what the code under test prints goes nowhere
    w = Worker(Path(tempfile.mkdtemp(prefix="guild-fuzz-")))
    import guild

    out.write(json.dumps({"ready": True, "guild": guild.__file__}) + "\n")
    for line in sys.stdin:
        cat, idx = line.split()
        out.write(json.dumps(run_one(w, cat, int(idx))) + "\n")


# ------------------------------------------------------------------------------------------------ parent side
def _limit():
    resource.setrlimit(resource.RLIMIT_AS, (AS_LIMIT, AS_LIMIT))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


class _Proc:
    def __init__(self, env):
        self.p = subprocess.Popen([sys.executable, "-m", "tests.fuzz.harness", "--worker"],
                                  cwd=tempfile.gettempdir(), env=env, stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                  text=True, bufsize=1, preexec_fn=_limit)
        self.case = None
        self.deadline = 0.0
        self.cpu0 = None  # the worker's CPU seconds when its case was handed out
        self.ready = False

    def kill(self):
        self.p.kill()
        self.p.wait()


def run_cases(cases: list[tuple[str, int]], workers: int = 2, cpu_limit: float = 10.0, env: dict | None = None,
              start_timeout: float = 900.0, progress=None) -> list[dict]:
    """Run (category, index) cases over `workers` processes; returns one record per case. `cpu_limit`: CPU
    seconds a case may take (the worker's, /proc), with WALL_BACKSTOP times that in wall time as a backstop.
    The workers' temporary files (their seeds, written models) and guild cache (repacked copies of the mutated
    models) are in a directory of this run, removed at its end (a killed worker cannot clean up after itself);
    a GUILD_CACHE_DIR set by the caller is used instead and kept."""
    own = tempfile.mkdtemp(prefix="guild-fuzz-run-")
    tmp = os.path.join(own, "tmp")
    os.mkdir(tmp)
    env = {**(env or {}), "TMPDIR": tmp}
    if "GUILD_CACHE_DIR" not in {**os.environ, **env}:
        env["GUILD_CACHE_DIR"] = os.path.join(own, "cache")
    try:
        return _run_cases(cases, workers, cpu_limit, env, start_timeout, progress)
    finally:
        shutil.rmtree(own, ignore_errors=True)


def _run_cases(cases, workers, cpu_limit, env, start_timeout, progress) -> list[dict]:
    # workers run outside the checkout so that a PYTHONPATH given here (another guild, e.g. the code before a
    # fix) comes first; this checkout after it provides tests.fuzz
    env = {**os.environ, "NUMBA_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(
        x for x in (os.environ.get("PYTHONPATH", ""), str(ROOT)) if x), **(env or {})}
    todo = list(reversed(cases))
    results = []
    sel = selectors.DefaultSelector()
    procs = []

    def spawn():
        pr = _Proc({**env, "GUILD_FUZZ_WARM_FROM": str(len(procs) / max(1, workers))})
        pr.deadline = time.monotonic() + start_timeout
        sel.register(pr.p.stdout, selectors.EVENT_READ, pr)
        procs.append(pr)

    def retire(pr):
        sel.unregister(pr.p.stdout)
        pr.kill()
        procs.remove(pr)

    def feed(pr):
        if todo:
            pr.case = todo.pop()
            pr.cpu0 = _cpu_s(pr.p.pid)
            pr.deadline = time.monotonic() + max(60.0, WALL_BACKSTOP * cpu_limit)  # wall: backstop for a blocked case
            pr.p.stdin.write(f"{pr.case[0]} {pr.case[1]}\n")
            pr.p.stdin.flush()
        else:
            pr.case = None

    for _ in range(min(workers, len(cases))):
        spawn()
    while procs:
        now = time.monotonic()
        for pr in list(procs):
            over = pr.case is not None and _cpu_s(pr.p.pid) - pr.cpu0 > cpu_limit
            if over or now > pr.deadline:  # wall: the backstop set above
                if pr.case is None:
                    raise RuntimeError("fuzz worker did not start")
                results.append({"cat": pr.case[0], "idx": pr.case[1], "outcome": "hang", "s": cpu_limit})
                if progress:
                    progress(results[-1])
                retire(pr)
                if todo:
                    spawn()
        # the CPU limit is polled: wake at least every 0.2 s while a case runs
        wait = max(0.05, min(0.2, min((pr.deadline for pr in procs), default=now + 1) - time.monotonic()))
        for key, _ in sel.select(timeout=wait):
            pr = key.data
            line = pr.p.stdout.readline()
            if not line:  # the worker died
                rc = pr.p.wait()
                if pr.case is None:
                    raise RuntimeError(f"fuzz worker exited ({rc}) before its first case")
                results.append({"cat": pr.case[0], "idx": pr.case[1], "outcome": "signal" if rc < 0 else "crash",
                                "exc": f"exit {rc}", "msg": "worker died"})
                if progress:
                    progress(results[-1])
                retire(pr)
                if todo:
                    spawn()
                continue
            rec = json.loads(line)
            if "ready" not in rec:
                results.append(rec)
                if progress:
                    progress(rec)
            feed(pr)
            if pr.case is None:
                retire(pr)
    return results


def plan_cases(n: int, start: int = 0, only: str | None = None) -> list[tuple[str, int]]:
    """n cases spread over the categories (GGUF half, the rest a sixth each), interleaved."""
    share = {"gguf": 0.5, "plan": 1 / 6, "template": 1 / 6, "input": 1 / 6}
    if only:
        share = {only: 1.0}
    per = {c: max(1, round(n * s)) if c in share else 0 for c, s in {**dict.fromkeys(CATEGORIES, 0), **share}.items()}
    out = []
    for i in range(max(per.values())):
        out += [(c, start + i) for c in CATEGORIES if i < per[c]]
    return out


def summary(results: list[dict]) -> dict:
    by = defaultdict(Counter)
    crashes = defaultdict(Counter)
    tracebacks: dict = defaultdict(dict)  # one example per crash kind
    peak = defaultdict(int)
    for r in results:
        by[r["cat"]][r["outcome"]] += 1
        by[r["cat"]]["cases"] += 1
        if r["outcome"] in ("crash", "signal"):
            kind = f"{r.get('exc')} at {r.get('where', '?')}"
            crashes[r["cat"]][kind] += 1
            if r.get("traceback"):
                tracebacks[r["cat"]].setdefault(kind, f"case {r['cat']}:{r['idx']}\n{r['traceback']}")
        if r.get("multiline"):
            by[r["cat"]]["multiline"] += 1
        peak[r["cat"]] = max(peak[r["cat"]], r.get("peak_kb", 0))
    return {c: {**dict(by[c]), "peak_mb": round(peak[c] / 1024), "crash_kinds": dict(crashes[c].most_common(12)),
                "crash_tracebacks": {k: tracebacks[c][k] for k, _ in crashes[c].most_common(12) if k in tracebacks[c]}}
            for c in sorted(by)}


FAILING = ("crash", "hang", "signal", "garbage")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.fuzz.harness")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("-n", "--cases", type=int, default=10000)
    ap.add_argument("--start", type=int, default=0, help="first case number of each category")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=10.0, help="CPU seconds per case")
    ap.add_argument("--json", type=Path, help="write every record here")
    ap.add_argument("--only", choices=CATEGORIES, help="one category")
    ap.add_argument("--jsonl", type=Path, help="append each record here as it comes (a long run read midway)")
    ap.add_argument("--replay", help="CATEGORY:INDEX: run one case in this process, with its traceback")
    ap.add_argument("--summarize", type=Path, help="print the summary of a --jsonl file and exit")
    a = ap.parse_args(argv)
    if a.worker:
        worker_main()
        return 0
    if a.summarize:
        recs = [json.loads(x) for x in a.summarize.read_text().splitlines() if x.strip()]
        print(json.dumps({**summary(recs), "_total": {"cases": len(recs)}}, indent=1))
        return 0
    if a.replay:
        cat, idx = a.replay.split(":")
        w = Worker(Path(tempfile.mkdtemp(prefix="guild-fuzz-")))
        print(w.case(cat, int(idx)))
        return 0
    t0 = time.time()
    done = [0]

    log = open(a.jsonl, "a") if a.jsonl else None  # noqa: SIM115 - open for the whole run

    def progress(rec):
        if log:
            log.write(json.dumps(rec) + "\n")
            log.flush()
        done[0] += 1
        if done[0] % 500 == 0:
            print(f"{done[0]} cases, {time.time() - t0:.0f} s", file=sys.stderr, flush=True)

    res = run_cases(plan_cases(a.cases, a.start, a.only), a.workers, a.timeout, progress=progress)
    s = summary(res)
    s["_total"] = {"cases": len(res), "seconds": round(time.time() - t0, 1),
                   "NUMBA_BOUNDSCHECK": os.environ.get("NUMBA_BOUNDSCHECK", "")}
    if a.json:
        a.json.write_text(json.dumps({"summary": s, "results": res}, indent=1))
    print(json.dumps({c: {k: v for k, v in x.items() if k != "crash_tracebacks"} for c, x in s.items()}, indent=1))
    for c, x in s.items():
        for kind, tb in x.get("crash_tracebacks", {}).items():
            print(f"\n--- {c}: {kind}\n{tb}", file=sys.stderr)
    bad = sum(v.get(o, 0) for k, v in s.items() if k != "_total" for o in FAILING)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
