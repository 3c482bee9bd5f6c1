"""guild beside llama.cpp on one GGUF at the shapes users run (make one with `python -m guild.tools.synth`):
decode tok/s after a short prompt and prefill tok/s of a 512-token prompt, for guild under each --numerics
and for llama.cpp (llama-cpp-python) when importable, alternated round by round in one process; medians.

    python -m guild.tools.synth qwen3-30b-a3b --layers 4 --type Q4_K_M -o /tmp/q3.gguf
    python -m guild.tools.perf_shapes /tmp/q3.gguf [--rounds 3] [--tokens 32] [--threads 2] [--json]

Under `f32` every type runs the fp32 dequant-dot (and prefill BLAS), under `i8` the int8 kernels where the type
has them: the two side by side show what the int8 path brings on that file.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

from ..calib.timing import median
from ..engine.session import GuildSession
from ..errors import BadFlagError, GuildError
from ..load import load
from .perf import open_llama_cpp

PREFILL = 512


def _guild_run(model, ids: list[int], n: int) -> tuple[float, float]:
    _, st = GuildSession(model, n_ctx=len(ids) + n + 8).generate(ids, n)
    return st.decode_tok_s, st.prefill_tok_s


def _llama_run(llm, ids: list[int], n: int) -> tuple[float, float]:
    llm.reset()  # no reuse of the previous run's prompt cache
    got, t0, t1 = 0, time.perf_counter(), None
    for _ in llm.generate(ids, temp=0.0, top_k=1, reset=True):
        t1 = t1 or time.perf_counter()
        got += 1
        if got == n:
            break
    return (n - 1) / (time.perf_counter() - t1), len(ids) / (t1 - t0)


def measure(path: str, rounds: int = 3, tokens: int = 32, threads: int = 2, numerics=("i8", "f32"),
            llama: bool = True) -> dict:
    """{name: {"decode": tok/s, "prefill": tok/s}} for guild under each numerics and llama.cpp."""
    runners = {}
    vocab = None
    for mode in numerics:
        lm = load(path, threads=threads, numerics=mode, progress=False)
        vocab = lm.model.args.vocab_size
        runners[f"guild {mode}"] = lambda ids, n, m=lm.model: _guild_run(m, ids, n)
    if llama:
        try:
            llm = open_llama_cpp(path, n_ctx=PREFILL + tokens + 16, n_threads=threads, n_threads_batch=threads,
                                 n_batch=PREFILL)
            runners["llama.cpp"] = lambda ids, n: _llama_run(llm, ids, n)
        except ImportError:
            pass
    rng = np.random.default_rng(0)
    short = [int(t) for t in rng.integers(100, vocab - 100, 8)]
    long = [int(t) for t in rng.integers(100, vocab - 100, PREFILL)]
    for run in runners.values():  # warm: compile, caches
        run(short, 4)
        run(long, 2)
    res = {k: {"decode": [], "prefill": []} for k in runners}
    names = list(runners)
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            res[name]["decode"].append(runners[name](short, tokens)[0])
            res[name]["prefill"].append(runners[name](long, 2)[1])
    return {k: {m: round(median(v[m]), 2) for m in v} for k, v in res.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m guild.tools.perf_shapes", description=__doc__.splitlines()[0])
    ap.add_argument("gguf", help="the model file (e.g. written by python -m guild.tools.synth)")
    ap.add_argument("--rounds", type=int, default=3, help="alternated rounds (medians over them)")
    ap.add_argument("--tokens", type=int, default=32, help="tokens decoded per decode run")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-llama", action="store_true", help="skip llama.cpp even when importable")
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout")
    a = ap.parse_args(argv)
    try:
        if a.rounds < 1 or a.tokens < 2:
            raise BadFlagError("--rounds must be >= 1 and --tokens >= 2")
        if not os.path.isfile(a.gguf):
            raise BadFlagError(f"{a.gguf}: no such file")
        before = os.getloadavg()
        out = measure(a.gguf, a.rounds, a.tokens, a.threads, llama=not a.no_llama)
        report = {"file": a.gguf, "threads": a.threads, "rounds": a.rounds, "load_before": before,
                  "load_after": os.getloadavg(), "results": out}
    except GuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if a.json:
        print(json.dumps(report))
        return 0
    ref = out.get("llama.cpp")
    for name, v in out.items():
        rel = (f" ({v['decode'] / ref['decode']:.2f}x, {v['prefill'] / ref['prefill']:.2f}x llama.cpp)"
               if ref and name != "llama.cpp" else "")
        print(f"{name:10s} decode {v['decode']:8.2f} tok/s   prefill-{PREFILL} {v['prefill']:8.2f} tok/s{rel}")
    print(f"load average before {before[0]:.2f}, after {report['load_after'][0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
