"""A MoE larger than its memory (`make bench-beyond-ram`): guild with its experts read from disk through an expert
cache bounded below the model's size (guild.engine.experts), beside the disk's bound and llama.cpp.

The model: the 128-expert top-8 upcycle `smollm2-135m-moe128` (6.4 GB; built under /tmp/guild-beyond-ram, or
$GUILD_CACHE_DIR, on first use) or --model. Steps: load with an expert cache of --expert-cache-mem (default: 45%
of the repack cache file); drop the GGUF's and the repack cache's pages from the page cache (POSIX_FADV_DONTNEED);
measure the disk's read speed with expert-sized reads at random experts, IO_THREADS at a time (what a cache miss
does); decode N greedy tokens per strategy; print decode tok/s beside the disk bound (read speed / bytes read per
token), the hit rate and bytes read per token. llama.cpp (llama-cpp-python, `make setup-oracle`) decodes the same
prompt in a subprocess, from dropped pages too, with the same memory (the expert cache plus the model's
non-expert part) under `systemd-run --scope -p MemoryMax=` where systemd runs, else uncapped (the report says
which).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

PROMPT = "Write a short story about a robot who learns to paint."
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
    """Bytes per second reading whole experts (gate|up and down spans) at random, IO_THREADS reads in flight, as
    the expert cache's misses do; the pages read are dropped again."""
    from ..engine.experts import IO_THREADS

    spans = [(int(off), kind.span) for L in cache.layers.values() for kind in (L.gu, L.down)
             for off in kind.file_off]
    random.Random(0).shuffle(spans)
    todo, total = [], 0
    for off, n in spans:
        if total >= READ_PROBE_BYTES:
            break
        todo.append((off, n))
        total += n
    lock = threading.Lock()

    def worker():
        buf = np.empty(max(n for _, n in todo), np.uint8)
        fd = os.open(cache.path, os.O_RDONLY)
        try:
            while True:
                with lock:
                    if not todo:
                        return
                    off, n = todo.pop()
                view, done = memoryview(buf)[:n], 0
                while done < n:
                    done += os.preadv(fd, [view[done:]], off + done)
                os.posix_fadvise(fd, off, n, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(IO_THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return total / (time.perf_counter() - t0)


def peak_rss() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))


def run_guild(lm, ids: list, n: int, strategy: str, max_draft: int) -> dict:
    """N greedy tokens with `strategy`; the cache's counters over the decode (after the prompt's prefill)."""
    from dataclasses import replace

    from ..speculative.options import DraftOptions

    cache = lm.model.expert_cache
    n_ctx = len(ids) + n + 16
    drafter = None if strategy == "normal" else lm.drafter(replace(DraftOptions(), strategy=strategy), n_ctx)
    marks = []

    def on_token(_):
        if not marks:
            marks.append(dict(cache.stats.__dict__))

    s = lm.session(n_ctx)
    toks, st = s.generate(ids, n, on_token, drafter=drafter, max_draft=max_draft if drafter else 0)
    end, start = cache.stats.__dict__, marks[0]
    d = {k: end[k] - start[k] for k in start}
    steps = max(1, len(toks) - 1)
    lookups = d["hits"] + d["misses"]
    return {"strategy": strategy, "tokens": [int(t) for t in toks], "decode_tok_s": st.decode_tok_s,
            "hit_rate": d["hits"] / lookups if lookups else None, "bytes_read_per_token": d["bytes_read"] / steps,
            "misses_per_token": d["misses"] / steps, "prefetched_per_token": d["prefetched"] / steps,
            "prefetch_used": d["prefetch_used"], "evictions": d["evictions"],
            "windows": len(st.windows), "drafted": st.summary()["drafted"], "accepted": st.summary()["accepted"]}


# -- llama.cpp, in its own process ---------------------------------------------------------------------
def _can_cap() -> bool:
    if shutil.which("systemd-run") is None:
        return False
    r = subprocess.run(["systemd-run", "--scope", "--quiet", "-p", "MemoryMax=1G", "true"], capture_output=True)
    return r.returncode == 0


def probe_llama(path: str, n: int, threads: int) -> dict:
    from ..text.tokenizer import Tokenizer
    from .perf import llama_cpp_decode

    tok = Tokenizer.from_gguf(path)
    ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": PROMPT}]), add_special=True)
    dec, pre, toks = llama_cpp_decode(path, ids, n, threads, 1)
    return {"decode_tok_s": dec, "prefill_tok_s": pre, "tokens": [int(t) for t in toks], "peak_rss": peak_rss()}


def run_llama(path: str, n: int, threads: int, mem: int) -> dict | None:
    try:
        import llama_cpp  # noqa: F401  (optional: the llama.cpp anchor)
    except ImportError:
        return None
    drop_pages(path)
    cmd = [sys.executable, "-m", "guild.tools.beyond_ram", "--probe-llama", "--model", path, "-n", str(n),
           "--threads", str(threads)]
    cap = _can_cap()
    if cap:
        cmd = ["systemd-run", "--scope", "--quiet", "-p", f"MemoryMax={mem}", *cmd]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"beyond_ram: llama.cpp failed:\n{r.stderr[-3000:]}")
    out = json.loads(r.stdout.strip().splitlines()[-1])
    out["cap"] = f"systemd-run scope, MemoryMax={mem}" if cap else "none (no systemd scope here: uncapped)"
    return out


# -- the report ----------------------------------------------------------------------------------------
def report(rep: dict) -> str:
    gb = 1e9
    c = rep["cache"]
    lines = [f"**{Path(rep['model']).name}**: repack cache {rep['file_bytes'] / gb:.2f} GB, of which experts "
             f"{c['expert_bytes'] / gb:.2f} GB; expert cache {c['resident_bytes'] / gb:.2f} GB ({c['n_slots']} slots "
             f"of {c['slot_bytes'] / 1e6:.2f} MB); {rep['threads']} threads, {rep['n']} greedy tokens; disk "
             f"{rep['read_gb_s']:.2f} GB/s in expert-sized random reads; peak RSS {rep['peak_rss'] / gb:.2f} GB", "",
             "| engine | strategy | decode tok/s | disk bound tok/s | share of bound | hit rate | MB read/token |",
             "|---" * 7 + "|"]
    for r in rep["guild"]:
        mb = r["bytes_read_per_token"] / 1e6
        bound = rep["read_gb_s"] * gb / r["bytes_read_per_token"] if r["bytes_read_per_token"] else float("inf")
        hr = "" if r["hit_rate"] is None else f"{r['hit_rate']:.2f}"
        lines.append(f"| guild | {r['strategy']} | {r['decode_tok_s']:.2f} | {bound:.2f} | "
                     f"{r['decode_tok_s'] / bound:.0%} | {hr} | {mb:.1f} |")
    ll = rep.get("llama")
    if ll is not None:
        lines.append(f"| llama.cpp | normal ({ll['cap']}) | {ll['decode_tok_s']:.2f} | | | | |")
    else:
        lines.append("\nllama.cpp: not measured (`llama_cpp` is not importable here: `make setup-oracle`)")
    toks = [r["tokens"] for r in rep["guild"]]
    lines.append(f"\nstrategies emit the same tokens: {all(t == toks[0] for t in toks)}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m guild.tools.beyond_ram", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="GGUF path or tag (default: the 128-expert upcycle)")
    ap.add_argument("--expert-cache-mem", dest="mem", default=None,
                    help="expert cache size (default: 45%% of the repack cache file)")
    ap.add_argument("-n", type=int, default=48, help="greedy tokens per run")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--strategies", default="normal,adaptive")
    ap.add_argument("--max-draft", type=int, default=4)
    ap.add_argument("--no-llama", action="store_true", help="skip llama.cpp")
    ap.add_argument("--json", action="store_true", help="print the JSON report instead of the table")
    ap.add_argument("--probe-llama", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.probe_llama:
        print(json.dumps(probe_llama(a.model, a.n, a.threads)))
        return 0
    os.environ.setdefault("GUILD_CACHE_DIR", SCRATCH)
    from ..engine.experts import expert_cache_mem
    from ..errors import GuildError
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
        speed = read_speed(cache)
        ids = lm.tokenizer.encode(lm.tokenizer.apply_chat_template([{"role": "user", "content": PROMPT}]),
                                  add_special=True)
        runs = []
        for s in [s for s in a.strategies.split(",") if s]:
            runs.append(run_guild(lm, ids, a.n, s, a.max_draft))
        rep = {"model": path, "file_bytes": rpk.stat().st_size, "threads": a.threads, "n": a.n,
               "read_gb_s": speed / 1e9,
               "cache": {"bound": mem, "resident_bytes": cache.resident_bytes, "n_slots": cache.n_slots,
                         "slot_bytes": cache.slot_bytes, "expert_bytes": cache.expert_bytes,
                         "totals": cache.stats.as_dict()},
               "guild": runs, "peak_rss": peak_rss()}
        cache.close()
        if not a.no_llama:  # the same memory as guild's: the expert cache and the rest of the model
            rep["llama"] = run_llama(path, a.n, a.threads, mem + rep["file_bytes"] - cache.expert_bytes)
    except GuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(json.dumps(rep) if a.json else report(rep))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
