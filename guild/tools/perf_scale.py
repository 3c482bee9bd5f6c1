"""Scale benchmark (`make bench-full`): the 128-expert top-8 upcycle `smollm2-135m-moe128` (6.4 GB, built into
the cache on first use) — load time and peak resident memory (first and second load, each in a fresh process),
prefill and decode tok/s, window cost V(T) and distinct experts per layer for T = 1..8 — beside llama.cpp on
the same file (load time, peak memory, prefill and decode tok/s) when `llama_cpp` is importable.

Each measurement runs in its own subprocess (`--probe KIND`), so that peak resident memory (VmHWM) is that of
one load or one run, not of the benchmark. Results: results/scale.md and results/scale.json.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

from ..upcycle import TAG_MOE128, resolve_model
from .perf import write_results

PROMPT = "Write a short story about a robot who learns to paint."


def peak_rss() -> int:
    """Peak resident memory of this process in bytes (VmHWM; ru_maxrss where /proc is missing)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


# -- probes (each runs in a fresh process and prints one JSON line) ------------------------------------
def probe_guild_load(path: str) -> dict:
    from ..formats.gguf import GGUFFile
    from ..formats.repack_cache import load_cached
    from ..models import load_model
    from ..text.tokenizer import Tokenizer

    base = peak_rss()
    t0 = time.perf_counter()
    g = GGUFFile(path)
    _, how = load_cached(g, load_model)
    Tokenizer.from_metadata(g.metadata)
    return {"load_s": time.perf_counter() - t0, "how": how, "peak_rss": peak_rss(), "rss_before": base}


def probe_guild_run(path: str, tokens: int, repeats: int, threads: int | None) -> dict:
    from ..formats.repack_cache import cache_path, prefetch
    from ..load import load, set_threads
    from .perf import guild_decode, long_prompt_text, window_costs

    t0 = time.perf_counter()
    lm = load(path, progress=False)
    load_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    prefetch(cache_path(lm.gguf.identity_digest()), wait=True)  # timed apart: the weights in the page cache
    prefetch_s = time.perf_counter() - t0
    threads = set_threads(threads)
    ids = lm.tokenizer.encode(lm.tokenizer.apply_chat_template([{"role": "user", "content": PROMPT}]),
                              add_special=True)
    guild_decode(lm.model, ids[:8], 4, 1)  # warm-up: JIT and caches
    dec, pre, toks = guild_decode(lm.model, ids, tokens, repeats)
    ms, distinct = window_costs(lm.model, lm.tokenizer.encode(long_prompt_text()))
    return {"load_s": load_s, "prefetch_s": prefetch_s, "threads": threads, "prompt_tokens": len(ids),
            "decode_tok_s": dec, "prefill_tok_s": pre, "tokens": [int(t) for t in toks], "window_ms": ms,
            "distinct_experts": distinct, "peak_rss": peak_rss()}


def probe_llama(path: str, tokens: int, repeats: int, threads: int | None) -> dict | None:
    try:
        import llama_cpp  # noqa: F401  (optional: the llama.cpp anchor)
    except ImportError:
        return None
    from ..text.tokenizer import Tokenizer
    from .perf import llama_cpp_decode, open_llama_cpp

    tok = Tokenizer.from_gguf(path)
    ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": PROMPT}]), add_special=True)
    threads = threads or os.cpu_count() or 1
    t0 = time.perf_counter()
    llm = open_llama_cpp(path, n_ctx=64, n_threads=threads)
    load_s = time.perf_counter() - t0
    load_rss = peak_rss()
    del llm
    dec, pre, toks = llama_cpp_decode(path, ids, tokens, threads, repeats)
    return {"load_s": load_s, "load_peak_rss": load_rss, "threads": threads, "decode_tok_s": dec,
            "prefill_tok_s": pre, "tokens": [int(t) for t in toks], "peak_rss": peak_rss()}


def _probe(kind: str, path: str, a) -> dict | None:
    cmd = [sys.executable, "-m", "guild.tools.perf_scale", "--probe", kind, "--model", path,
           "--tokens", str(a.tokens), "--repeats", str(a.repeats)]
    if a.threads:
        cmd += ["--threads", str(a.threads)]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"perf_scale: probe {kind} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# -- the report ----------------------------------------------------------------------------------------
def _gb(n: float) -> str:
    return f"{n / 1e9:.2f} GB"


def report(path: str, size: int, loads: list, run: dict, llama: dict | None) -> str:
    """The markdown table of one scale run (also used by the tests on a tiny model)."""
    lines = [f"**{Path(path).name}** ({_gb(size)}), {run['threads']} threads, {len(run['tokens'])} greedy tokens, "
             f"{run['prompt_tokens']}-token chat prompt", "",
             "| engine | load | load s | peak RSS after load | × file | prefill tok/s | decode tok/s | peak RSS run |",
             "|---" * 8 + "|"]
    for i, ld in enumerate(loads):
        lines.append(f"| guild | {'first' if i == 0 else 'second'} ({ld['how']}) | {ld['load_s']:.2f} | "
                     f"{_gb(ld['peak_rss'])} | {ld['peak_rss'] / size:.2f} | | | |")
    lines.append(f"| guild | run (+{run['prefetch_s']:.1f} s reading the cache into the page cache) | "
                 f"{run['load_s']:.2f} | | | {run['prefill_tok_s']:.1f} | {run['decode_tok_s']:.1f} | "
                 f"{_gb(run['peak_rss'])} ({run['peak_rss'] / size:.2f}×) |")
    if llama is not None:
        same = sum(int(x == y) for x, y in zip(run["tokens"], llama["tokens"], strict=False))
        lines.append(f"| llama.cpp | mmap | {llama['load_s']:.2f} | {_gb(llama['load_peak_rss'])} | "
                     f"{llama['load_peak_rss'] / size:.2f} | {llama['prefill_tok_s']:.1f} | "
                     f"{llama['decode_tok_s']:.1f} | {_gb(llama['peak_rss'])} |")
        lines.append(f"\nguild / llama.cpp decode: {run['decode_tok_s'] / llama['decode_tok_s']:.2f}×; same greedy "
                     f"tokens: {same}/{len(run['tokens'])}")
    else:
        lines.append("\nllama.cpp: not measured (`llama_cpp` is not importable here)")
    ms = {int(k): v for k, v in run["window_ms"].items()}
    dx = {int(k): v for k, v in run["distinct_experts"].items()}
    lines += ["", "guild window cost at a ~600-token context (median ms), mean distinct experts per layer:", "",
              "| T | " + " | ".join(str(t) for t in ms) + " |", "|---" * (len(ms) + 1) + "|",
              "| ms | " + " | ".join(f"{v:.1f}" for v in ms.values()) + " |",
              "| V(T)/V(1) | " + " | ".join(f"{v / ms[1]:.2f}" for v in ms.values()) + " |",
              "| experts | " + " | ".join(f"{dx[t]:.2f}" for t in ms) + " |"]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m guild.tools.perf_scale", description=__doc__)
    ap.add_argument("--model", default=TAG_MOE128, help=f"tag or GGUF path (default {TAG_MOE128})")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="results")
    ap.add_argument("--probe", choices=("load", "run", "llama"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.probe:
        fn = {"load": lambda: probe_guild_load(a.model),
              "run": lambda: probe_guild_run(a.model, a.tokens, a.repeats, a.threads),
              "llama": lambda: probe_llama(a.model, a.tokens, a.repeats, a.threads)}[a.probe]
        print(json.dumps(fn()))
        return 0
    path = str(resolve_model(a.model))  # a tag is built here, outside the timed loads
    size = os.path.getsize(path)
    loads = [_probe("load", path, a), _probe("load", path, a)]
    run = _probe("run", path, a)
    llama = _probe("llama", path, a)
    write_results(a.out, "scale", {"model": path, "size": size, "loads": loads, "run": run, "llama": llama},
                  report(path, size, loads, run, llama))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
