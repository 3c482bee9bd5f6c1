"""A MoE larger than its memory (`make bench-beyond-ram`): guild with its experts read from disk through an expert
cache bounded below the model's size (guild.engine.experts), beside the disk's bound and llama.cpp.

The model: the 128-expert top-8 upcycle `smollm2-135m-moe128` (6.4 GB; built under /tmp/guild-beyond-ram, or
$GUILD_CACHE_DIR, on first use) or --model. Steps: load with an expert cache of --expert-cache-mem (default: 45%
of the repack cache file); drop the GGUF's and the repack cache's pages from the page cache (POSIX_FADV_DONTNEED);
measure the disk's read speed with expert-sized reads at random experts, IO_THREADS at a time (what a cache miss
does); per workload (default W7, creative prose: nothing to copy, and W3, an extraction that quotes its input),
decode N greedy tokens per strategy, each from an emptied expert cache (so no run inherits another's experts),
strategies alternated over --rounds; print decode tok/s beside the disk bound (read speed / bytes read per
token), the hit rate, bytes read per token, the drafts per window and where each token's time went. llama.cpp
(llama-cpp-python, `make setup-oracle`) decodes the first workload's prompt in a subprocess, from dropped pages
too. Each engine runs in a memory cgroup of its own (a child of this process's, v2 or v1; no systemd needed)
sized to the expert cache, the model's non-expert part and RUNTIME_HEADROOM, page cache included; where none can
be made (or with --no-cap) the report says both ran uncapped.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import random
import resource
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

from ..errors import GuildError

WORKLOADS = "W7,W3"  # nothing to copy; an input-grounded extraction
SCRATCH = "/tmp/guild-beyond-ram"
DEFAULT_SHARE = 0.45  # the default cache: this share of the repack cache file (3 GB of the 6.4 GB model)
READ_PROBE_BYTES = 512 << 20  # bytes the read-speed probe reads (at most)


def drop_pages(path) -> None:
    """Ask the kernel to drop a file's pages from the page cache (clean pages go; what a process maps stays)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def read_speed(cache) -> float:
    """Bytes per second reading whole experts at random, IO_THREADS reads in flight, as the expert cache's misses
    do (its own read: O_DIRECT where it has it, else through the page cache, dropped after)."""
    from ..engine.experts import IO_THREADS

    kinds = [(kind, e) for L in cache.layers.values() for kind in (L.gu, L.down) for e in range(kind.file_off.size)]
    random.Random(0).shuffle(kinds)
    todo, total = [], 0
    for kind, e in kinds:
        if total >= READ_PROBE_BYTES:
            break
        todo.append((kind, e))
        total += kind.span
    lock = threading.Lock()
    got = [0]

    def worker():
        buf = np.frombuffer(mmap.mmap(-1, cache.slot_bytes), np.uint8)  # page-aligned, as a slot is
        while True:
            with lock:
                if not todo:
                    return
                kind, e = todo.pop()
            n = cache.read_kind(kind, e, buf)
            with lock:
                got[0] += n

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(IO_THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return got[0] / (time.perf_counter() - t0)


def peak_rss() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))


def _counters(cap: Path | None) -> dict:
    """The process's clock, CPU time and page faults, and the cap's reclaim counters (v2 or v1 memory.stat)."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    out = {"wall_s": time.perf_counter(), "cpu_s": ru.ru_utime + ru.ru_stime, "sys_s": ru.ru_stime,
           "major_faults": ru.ru_majflt, "minor_faults": ru.ru_minflt}
    if cap is not None and (cap / "memory.stat").is_file():
        stat = dict(line.split() for line in (cap / "memory.stat").read_text().splitlines())
        for k in ("pgmajfault", "pgscan", "pgsteal", "workingset_refault_file", "total_pgmajfault",
                  "total_pgpgin", "total_pgpgout"):
            if k in stat:
                out["cap_" + k] = int(stat[k])
    return out


def breakdown(d: dict, steps: int) -> dict:
    """Milliseconds per token by cause over a decode (d: the differences of the cache's Stats and _counters)."""
    ms = {k: 1e3 * d[k] / steps for k in ("wall_s", "cpu_s", "sys_s", "wait_s", "predict_s", "read_s", "drop_s")}
    return {"ms_per_token": ms, "other_ms": ms["wall_s"] - ms["wait_s"] - ms["predict_s"],
            "sync_reads_per_token": d["sync_reads"] / steps, "reads_per_token": d["reads"] / steps,
            "mean_depth": d["depth_sum"] / d["reads"] if d["reads"] else None,
            "ms_per_read": 1e3 * d["read_s"] / d["reads"] if d["reads"] else None,
            **{k + "_per_token": d[k] / steps for k in d if "fault" in k or k.startswith("cap_")}}


def run_guild(lm, ids: list, n: int, strategy: str, max_draft: int, cap: Path | None = None) -> dict:
    """N greedy tokens with `strategy` from an emptied expert cache; the cache's counters and where the time
    went over the decode (after the prompt's prefill), and the draft lengths the scheduler chose."""
    from dataclasses import replace

    from ..speculative.options import DraftOptions

    cache = lm.model.expert_cache
    cache.clear()  # a cold start: no run inherits the experts another one read
    drop_pages(cache.path)
    n_ctx = len(ids) + n + 16
    drafter = None if strategy == "normal" else lm.drafter(replace(DraftOptions(), strategy=strategy), n_ctx)
    marks = []

    def on_token(_):
        if not marks:
            marks.append({**cache.stats.__dict__, **_counters(cap)})

    s = lm.session(n_ctx)
    toks, st = s.generate(ids, n, on_token, drafter=drafter, max_draft=max_draft if drafter else 0)
    end, start = {**cache.stats.__dict__, **_counters(cap)}, marks[0]
    d = {k: end[k] - start[k] for k in start}
    steps = max(1, len(toks) - 1)
    lookups = d["hits"] + d["misses"]
    return {"strategy": strategy, "tokens": [int(t) for t in toks], "decode_tok_s": st.decode_tok_s,
            "hit_rate": d["hits"] / lookups if lookups else None, "bytes_read_per_token": d["bytes_read"] / steps,
            "misses_per_token": d["misses"] / steps, "prefetched_per_token": d["prefetched"] / steps,
            "prefetch_used": d["prefetch_used"], "evictions": d["evictions"],
            "windows": len(st.windows), "drafted": st.summary()["drafted"], "accepted": st.summary()["accepted"],
            "draft_lengths": _histogram(w.k for w in st.windows), "breakdown": breakdown(d, steps)}


def _histogram(ks) -> dict:
    out: dict = {}
    for k in ks:
        out[int(k)] = out.get(int(k), 0) + 1
    return dict(sorted(out.items()))


def medians(runs: list) -> list:
    """Per (workload, strategy) in first-seen order, the run with the median decode tok/s (the lower of the
    middle two), its rounds' speeds under `rounds_tok_s`."""
    groups: dict = {}
    for r in runs:
        groups.setdefault((r["workload"], r["strategy"]), []).append(r)
    out = []
    for rs in groups.values():
        by = sorted(rs, key=lambda r: r["decode_tok_s"])
        out.append({**by[(len(by) - 1) // 2], "rounds_tok_s": [r["decode_tok_s"] for r in rs]})
    return out


# -- the memory cap: a cgroup of our own, under systemd or not -------------------------------------------
RUNTIME_HEADROOM = 512 << 20  # beyond the expert cache and the model's non-expert part: interpreter, KV, buffers


def _own_cgroup(controller: str) -> str | None:
    """This process's cgroup path in the v1 hierarchy of `controller`, or in the v2 one for ''."""
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, names, path = line.rstrip("\n").split(":", 2)
            if (controller and controller in names.split(",")) or (not controller and names == ""):
                return path
    return None


def make_cap(mem: int, engine: str) -> Path | None:
    """A child of this process's memory cgroup limited to `mem` bytes, page cache included (cgroup v2's
    memory.max or v1's memory.limit_in_bytes), or None where none can be made (no rights, no controller)."""
    name = f"guild-beyond-ram-{engine}-{os.getpid()}"
    for root, controller, limit in (("/sys/fs/cgroup", "", "memory.max"),
                                    ("/sys/fs/cgroup/unified", "", "memory.max"),
                                    ("/sys/fs/cgroup/memory", "memory", "memory.limit_in_bytes")):
        own = _own_cgroup(controller)
        if own is None or not Path(root).is_dir():
            continue
        d = Path(root) / own.lstrip("/") / name
        try:
            d.mkdir()
        except OSError:
            continue
        try:
            if (d / limit).is_file():  # the kernel made the controller's files: a cgroup, not a plain directory
                (d / limit).write_text(str(mem))
                return d
        except OSError:
            pass
        d.rmdir()
    return None


def join_cap(cap: Path, pid: int | None = None) -> None:
    """Move a process (this one by default) into the cap: what it allocates or reads from now on is charged."""
    (cap / "cgroup.procs").write_text(str(pid or os.getpid()))


def cap_peak(cap: Path) -> int | None:
    """The most the cap's processes held at once, page cache included (None where the kernel does not say)."""
    for f in ("memory.peak", "memory.max_usage_in_bytes"):
        if (cap / f).is_file():
            return int((cap / f).read_text())
    return None


def leave_cap(cap: Path) -> None:
    """Move this process back to the cap's parent and remove the cap (what it still holds is charged there)."""
    (cap.parent / "cgroup.procs").write_text(str(os.getpid()))
    cap.rmdir()


# -- llama.cpp, in its own process ---------------------------------------------------------------------
def probe_llama(path: str, workload: str, n: int, threads: int) -> dict:
    from ..text.tokenizer import Tokenizer
    from ..workloads import load_workloads
    from .perf import llama_cpp_decode

    ids = load_workloads([workload])[0].prompt_ids(Tokenizer.from_gguf(path))
    dec, pre, toks = llama_cpp_decode(path, ids, n, threads, 1)
    return {"decode_tok_s": dec, "prefill_tok_s": pre, "tokens": [int(t) for t in toks], "peak_rss": peak_rss()}


def run_llama(path: str, workload: str, n: int, threads: int, cap: Path | None) -> dict | None:
    """llama.cpp's decode in a subprocess that joins `cap` before it loads anything (uncapped when None)."""
    try:
        import llama_cpp  # noqa: F401  (optional: the llama.cpp anchor)
    except ImportError:
        return None
    drop_pages(path)
    cmd = [sys.executable, "-m", "guild.tools.beyond_ram", "--probe-llama", "--model", path, "-n", str(n),
           "--threads", str(threads), "--workloads", workload]
    if cap is not None:
        cmd = ["sh", "-c", f'echo $$ > "{cap}/cgroup.procs" && exec "$@"', "sh", *cmd]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise GuildError(f"llama.cpp failed (exit {r.returncode}{', killed by the cap' if r.returncode < 0 else ''}):"
                         f" {r.stderr.strip().splitlines()[-1] if r.stderr.strip() else 'no output'}")
    return json.loads(r.stdout.strip().splitlines()[-1])


# -- the report ----------------------------------------------------------------------------------------
def report(rep: dict) -> str:
    gb = 1e9
    c = rep["cache"]
    lines = [f"**{Path(rep['model']).name}**: repack cache {rep['file_bytes'] / gb:.2f} GB, of which experts "
             f"{c['expert_bytes'] / gb:.2f} GB; expert cache {c['resident_bytes'] / gb:.2f} GB ({c['n_slots']} slots "
             f"of {c['slot_bytes'] / 1e6:.2f} MB); {rep['threads']} threads, {rep['n']} greedy tokens per run, "
             f"{rep['rounds']} round(s) from an emptied cache, median; disk "
             f"{rep['read_gb_s']:.2f} GB/s in expert-sized random reads; peak RSS {rep['peak_rss'] / gb:.2f} GB; "
             f"kernel threads {'sleep' if c.get('passive_wait') else 'spin'} while waiting", "",
             _cap_line(rep), "",
             "| workload | engine | strategy | decode tok/s | disk bound tok/s | share of bound | hit rate "
             "| MB read/token | drafted/window | accepted/drafted | windows by draft length |", "|---" * 11 + "|"]
    med = medians(rep["guild"])
    for r in med:
        mb = r["bytes_read_per_token"] / 1e6
        bound = rep["read_gb_s"] * gb / r["bytes_read_per_token"] if r["bytes_read_per_token"] else float("inf")
        hr = "" if r["hit_rate"] is None else f"{r['hit_rate']:.2f}"
        acc = f"{r['accepted'] / r['drafted']:.0%}" if r["drafted"] else ""
        ks = " ".join(f"{k}:{n}" for k, n in r["draft_lengths"].items())
        lines.append(f"| {r['workload']} | guild | {r['strategy']} | {r['decode_tok_s']:.2f} | {bound:.2f} | "
                     f"{r['decode_tok_s'] / bound:.0%} | {hr} | {mb:.1f} | {r['drafted'] / r['windows']:.2f} | "
                     f"{acc} | {ks} |")
    ll = rep.get("llama")
    if ll is not None:
        g = med[0]
        lines.append(f"| {g['workload']} | llama.cpp | normal | {ll['decode_tok_s']:.2f} | | | | | | | |")
        lines.append(f"\nguild {g['strategy']} / llama.cpp on {g['workload']}: "
                     f"{g['decode_tok_s'] / ll['decode_tok_s']:.2f}×")
    else:
        lines.append("\nllama.cpp: not run (--no-llama, or `llama_cpp` is not importable here: `make setup-oracle`)")
    if rep["rounds"] > 1:
        lines.append("\nevery round's tok/s: " + "; ".join(
            f"{r['workload']} {r['strategy']} {', '.join(f'{v:.2f}' for v in r['rounds_tok_s'])}" for r in med))
    for r in med:
        b = r["breakdown"]
        ms = b["ms_per_token"]
        depth = "" if b["mean_depth"] is None else f", {b['mean_depth']:.1f} in flight, {b['ms_per_read']:.1f} ms each"
        lines.append(f"\n{r['workload']} {r['strategy']}: {ms['wall_s']:.0f} ms/token = waiting on reads "
                     f"{ms['wait_s']:.0f} "
                     f"({b['sync_reads_per_token']:.1f} read by the window, of {b['reads_per_token']:.1f}/token"
                     f"{depth}) + pre-gating {ms['predict_s']:.0f} + the rest {b['other_ms']:.0f}; CPU "
                     f"{ms['cpu_s']:.0f} ms/token (system {ms['sys_s']:.0f}), I/O threads in preadv {ms['read_s']:.0f}"
                     f" and fadvise {ms['drop_s']:.0f} ms/token; major faults {b['major_faults_per_token']:.1f}/token")
    same = all(r["tokens"] == next(q for q in rep["guild"] if q["workload"] == r["workload"])["tokens"]
               for r in rep["guild"])
    lines.append(f"\nstrategies emit the same tokens: {same}")
    return "\n".join(lines)


def _cap_line(rep: dict) -> str:
    cap = rep["cap"]
    if cap is None:
        return "memory: uncapped (no cgroup could be made here, or --no-cap); the expert cache bounds guild"
    peaks = ", ".join(f"{k.split('_')[0]} peak {v / 1e9:.2f} GB" for k, v in cap.items()
                      if k.endswith("_peak") and v is not None)
    return f"memory: each engine in its own cgroup of {cap['bytes'] / 1e9:.2f} GB, page cache included ({peaks})"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m guild.tools.beyond_ram", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="GGUF path or tag (default: the 128-expert upcycle)")
    ap.add_argument("--expert-cache-mem", dest="mem", default=None,
                    help="expert cache size (default: 45%% of the repack cache file)")
    ap.add_argument("-n", type=int, default=48, help="greedy tokens per run")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--strategies", default="normal,adaptive")
    ap.add_argument("--max-draft", type=int, default=4)
    ap.add_argument("--workloads", default=WORKLOADS,
                    help=f"workloads whose first turn is the prompt (default {WORKLOADS}; llama.cpp runs the first)")
    ap.add_argument("--rounds", type=int, default=1, help="runs per strategy and workload, alternated (median)")
    ap.add_argument("--no-llama", action="store_true", help="skip llama.cpp")
    ap.add_argument("--no-cap", action="store_true",
                    help="do not run the engines in a memory cgroup (default: both in one of the same size, "
                         "where this process may make one)")
    ap.add_argument("--json", action="store_true", help="print the JSON report instead of the table")
    ap.add_argument("--probe-llama", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.probe_llama:
        print(json.dumps(probe_llama(a.model, a.workloads, a.n, a.threads)))
        return 0
    from ..workloads import WorkloadError, load_workloads

    strategies = [s for s in a.strategies.split(",") if s]
    try:
        if a.rounds < 1:
            raise GuildError(f"--rounds must be at least 1, got {a.rounds}")
        workloads = load_workloads([w for w in a.workloads.split(",") if w])
    except (GuildError, WorkloadError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    os.environ.setdefault("GUILD_CACHE_DIR", SCRATCH)
    from ..engine.experts import expert_cache_mem, wait_passively

    wait_passively()  # this process streams: before the repack cache's build starts the kernels' threads
    from ..formats.gguf import GGUFFile
    from ..formats.repack_cache import cache_path, load_cached
    from ..kernels.cpu import quant
    from ..load import load
    from ..models import load_model
    from ..upcycle import TAG_MOE128, moe_cache_path, resolve_model

    try:
        if a.model is None:
            need = 2 * (7 << 30)  # the GGUF and its repack cache
            where = moe_cache_path(TAG_MOE128).parent
            where.mkdir(parents=True, exist_ok=True)
            if not moe_cache_path(TAG_MOE128).is_file() and shutil.disk_usage(where).free < need:
                raise GuildError(f"{where}: {shutil.disk_usage(where).free / 1e9:.1f} GB free, the 128-expert "
                                 f"model and its repack cache need {need / 1e9:.0f} GB")
        path = str(resolve_model(a.model or TAG_MOE128, progress=True))
        g = GGUFFile(path)
        load_cached(g, load_model, read_ahead=False)  # build the repack cache once, untimed
        rpk = cache_path(g.identity_digest(), quant.current_numerics())
        mem = int(rpk.stat().st_size * DEFAULT_SHARE) if a.mem is None else expert_cache_mem(a.mem)
        if not isinstance(mem, int):
            raise GuildError("--expert-cache-mem must be a size here (the point is a bound below the model)")
        for p in (path, rpk):
            drop_pages(p)
        lm = load(path, threads=a.threads, progress=False, expert_cache=mem)
        cache = lm.model.expert_cache
        # the same memory for both engines: the expert cache, the rest of the model, the runtime's headroom
        cap_bytes = mem + rpk.stat().st_size - cache.expert_bytes + RUNTIME_HEADROOM
        cap = None if a.no_cap else make_cap(cap_bytes, "guild")
        try:
            if cap is not None:  # joined before the first token: slots, reads and page cache are charged to it
                join_cap(cap)
                for p in (path, rpk):
                    drop_pages(p)
            speed = read_speed(cache)
            runs = []
            for w in workloads:
                ids = w.prompt_ids(lm.tokenizer)
                for r in range(a.rounds):  # alternated: the machine's drift falls on every strategy alike
                    for s in strategies if r % 2 == 0 else strategies[::-1]:
                        runs.append({**run_guild(lm, ids, a.n, s, a.max_draft, cap), "workload": w.id, "round": r})
            rep = {"model": path, "file_bytes": rpk.stat().st_size, "threads": a.threads, "n": a.n,
                   "rounds": a.rounds,
                   "read_gb_s": speed / 1e9,
                   "cap": None if cap is None else {"bytes": cap_bytes, "guild_peak": cap_peak(cap)},
                   "cache": {"bound": mem, "resident_bytes": cache.resident_bytes, "n_slots": cache.n_slots,
                             "passive_wait": cache.passive,
                             "slot_bytes": cache.slot_bytes, "expert_bytes": cache.expert_bytes,
                             "totals": cache.stats.as_dict()},
                   "guild": runs, "peak_rss": peak_rss()}
            cache.close()
        finally:
            if cap is not None:
                leave_cap(cap)
        del lm, cache
        if not a.no_llama:
            lcap = None if cap is None else make_cap(cap_bytes, "llama")  # capped only beside a capped guild
            try:
                rep["llama"] = run_llama(path, workloads[0].id, a.n, a.threads, lcap)
                if lcap is not None:
                    rep["cap"]["llama_peak"] = cap_peak(lcap)
            finally:
                if lcap is not None:
                    lcap.rmdir()
    except GuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(json.dumps(rep) if a.json else report(rep))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
