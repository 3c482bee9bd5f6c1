"""guild beside llama.cpp on GGUFs at the shapes users run (make them with `python -m guild.tools.synth`), one
process, the runners alternated round by round; medians.

Per file and runner (guild under each --numerics; llama.cpp through llama-cpp-python when importable): decode
tok/s after a short prompt, prefill tok/s of a 512-token prompt, time to first token of a 44-token chat prompt
(warm: the process has run before), and the verification-window curve V(T)/V(1) for T = 1..8. For guild under
i8 also the distinct experts a window of T rows routes to and the decode bandwidth bound: the bytes one token
reads (dense matrices, the routed experts, the KV cache) over this machine's measured copy bandwidth, with the
share of it reached.

    python -m guild.tools.perf_shapes FILE [FILE ...] [--rounds 3] [--tokens 32] [--threads 2] [--json]
    python -m guild.tools.perf_shapes --synth qwen3-30b-a3b --layers 4 --types Q4_K_M,Q3_K_M,IQ4_XS --dir DIR
    python -m guild.tools.perf_shapes --fresh smollm2-135m-moe   # time to first token of fresh `guild run`s

`--synth` writes each type's file into DIR once (random valid weights, `guild.tools.synth`) and measures them
in turn. `--fresh MODEL` starts `guild run --chat -n 1 --json` in new processes and reports the time to first
token they print, and the first streamed token a fresh `guild serve` sends one client, beside llama.cpp's warm
prefill of the same ids.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from ..calib.timing import median
from ..engine.session import GuildSession
from ..errors import BadFlagError, GuildError
from ..load import load
from .perf import machine_peaks, open_llama_cpp, window_bound, window_costs

PREFILL = 512
MAX_T = 8
# the chat prompt of the time-to-first-token rows: 44 tokens under the embedded models' template
CHAT_PROMPT = "Why is the sky blue during the day, and red at sunset?"
_SUBJECTS = ("sea", "lake", "ice", "snow", "glass", "smoke", "steam", "river", "ocean", "cloud", "bay", "pool")


def _chat_ids(lm) -> list[int]:
    tok = lm.tokenizer  # as `guild run --chat` and `guild serve` encode a one-message chat
    return tok.encode(tok.apply_chat_template([{"role": "user", "content": CHAT_PROMPT}]), add_special=True)


def _guild_run(model, ids: list[int], n: int) -> tuple[float, float]:
    _, st = GuildSession(model, n_ctx=len(ids) + n + 8).generate(ids, n)
    return st.decode_tok_s, st.prefill_tok_s


def _guild_ttft(model, ids: list[int]) -> float:
    t0 = time.perf_counter()
    GuildSession(model, n_ctx=len(ids) + 8).generate(ids, 1)
    return (time.perf_counter() - t0) * 1e3


def _llama_run(llm, ids: list[int], n: int) -> tuple[float, float]:
    llm.reset()  # no reuse of the previous run's prompt cache
    got, t0, t1 = 0, time.perf_counter(), None
    for _ in llm.generate(ids, temp=0.0, top_k=1, reset=True):
        t1 = t1 or time.perf_counter()
        got += 1
        if got == n:
            break
    return (n - 1) / (time.perf_counter() - t1), len(ids) / (t1 - t0)


def _llama_ttft(llm, ids: list[int]) -> float:
    llm.reset()
    t0 = time.perf_counter()
    for _ in llm.generate(ids, temp=0.0, top_k=1, reset=True):
        break
    return (time.perf_counter() - t0) * 1e3


def _llama_windows(llm, ids: list[int], repeats: int, vocab: int) -> dict:
    """Median ms of one llama.cpp batch of T tokens after the prompt, T = 1..MAX_T (the cache cut back after
    each: llama-cpp-python's eval drops the cells past n_tokens)."""
    llm.reset()
    llm.eval(ids)
    n0 = llm.n_tokens
    rng = np.random.default_rng(0)
    res = {T: [] for T in range(1, MAX_T + 1)}
    for r in range(repeats + 1):
        for T in res:
            win = [int(t) for t in rng.integers(100, vocab - 100, T)]
            llm.n_tokens = n0
            t0 = time.perf_counter()
            llm.eval(win)
            if r:
                res[T].append((time.perf_counter() - t0) * 1e3)
    llm.n_tokens = n0
    return {T: median(v) for T, v in res.items()}


def measure(path: str, rounds: int = 3, tokens: int = 32, threads: int = 2, numerics=("i8", "f32"),
            llama: bool = True, peaks: dict | None = None) -> dict:
    """{runner: {"decode", "prefill" (tok/s), "ttft_ms", "vt_ms" {T: ms}}}; guild i8 adds "distinct" {T: mean
    distinct experts per MoE layer} and, given the machine's peaks, "bound" (decode tok/s at the copy
    bandwidth), "bound_share" and "bytes_vt" (the bytes T rows read over one row's)."""
    runners, models = {}, {}
    vocab, chat = None, None
    for mode in numerics:
        lm = load(path, threads=threads, numerics=mode, progress=False)
        vocab, chat = lm.model.args.vocab_size, _chat_ids(lm)
        models[f"guild {mode}"] = lm.model
        runners[f"guild {mode}"] = (lambda ids, n, m=lm.model: _guild_run(m, ids, n),
                                    lambda ids, m=lm.model: _guild_ttft(m, ids))
    llm = None
    if llama:
        try:
            llm = open_llama_cpp(path, n_ctx=PREFILL + tokens + 16, n_threads=threads, n_threads_batch=threads,
                                 n_batch=PREFILL)
            runners["llama.cpp"] = (lambda ids, n: _llama_run(llm, ids, n), lambda ids: _llama_ttft(llm, ids))
        except ImportError:
            pass
    rng = np.random.default_rng(0)
    short = [int(t) for t in rng.integers(100, vocab - 100, 8)]
    long = [int(t) for t in rng.integers(100, vocab - 100, PREFILL)]
    for run, ttft in runners.values():  # warm: compile, caches, the context sizes used below
        run(short, 4)
        run(long, 2)
        ttft(chat)
    res = {k: {"decode": [], "prefill": [], "ttft_ms": []} for k in runners}
    names = list(runners)
    # like after like: every runner's decode, then every runner's prefill, then time to first token, so no decode
    # follows another runner's prefill (a heavy prefill slows the next few hundred ms on a boosting CPU)
    for r in range(rounds):
        order = names if r % 2 == 0 else names[::-1]
        for name in order:
            res[name]["decode"].append(runners[name][0](short, tokens)[0])
        for name in order:
            res[name]["prefill"].append(runners[name][0](long, 2)[1])
        for name in order:
            res[name]["ttft_ms"].append(runners[name][1](chat))
    out = {k: {m: round(median(v[m]), 2) for m in v} for k, v in res.items()}
    for name, model in models.items():
        vt, distinct = window_costs(model, short, repeats=max(3, rounds))
        out[name]["vt_ms"] = {T: round(v, 3) for T, v in vt.items()}
        if name == "guild i8":
            out[name]["distinct"] = {T: round(v, 2) for T, v in distinct.items()}
            if peaks is not None:
                wb = window_bound(model, len(short) + tokens // 2, distinct, peaks)
                mem_ms = wb[1]["mem_ms"]
                out[name]["bound"] = round(1e3 / mem_ms, 2)
                out[name]["bound_share"] = round(out[name]["decode"] * mem_ms / 1e3, 3)
                # the bytes a window of T rows reads over one row's: the V(T)/V(1) a bandwidth-bound kernel gets
                out[name]["bytes_vt"] = {T: round(wb[T]["mem_ms"] / mem_ms, 3) for T in sorted(wb)}
    if llm is not None:
        out["llama.cpp"]["vt_ms"] = {T: round(v, 3) for T, v in _llama_windows(llm, short, max(3, rounds),
                                                                                vocab).items()}
    return out


def fresh_ttft(model: str, runs: int = 3, threads: int = 2, llama: bool = True) -> dict:
    """Time to first token of the chat prompt as fresh `guild run --json` processes print it (median of runs)
    and as a fresh `guild serve` streams it to one client, beside llama.cpp's warm prefill of the same ids in
    this process."""
    if runs >= len(_SUBJECTS):
        raise BadFlagError(f"--rounds: at most {len(_SUBJECTS) - 1} with --fresh")
    lm = load(model, threads=threads, progress=False)
    ids = _chat_ids(lm)
    cmd = [sys.executable, "-m", "guild", "run", str(model), "--chat", "-p", CHAT_PROMPT, "-n", "1", "--json",
           "--threads", str(threads), "--temp", "0"]
    ttfts = []
    for _ in range(runs):
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if p.returncode != 0:
            last = p.stderr.strip().splitlines()[-1] if p.stderr.strip() else f"exit {p.returncode}"
            raise GuildError(f"guild run failed: {last}")
        ttfts.append(json.loads(p.stdout.strip().splitlines()[-1])["ttft_ms"])
    first, later = _serve_ttft(str(lm.path), runs, threads)
    out = {"prompt_tokens": len(ids), "guild_fresh_ttft_ms": median(ttfts), "runs": ttfts,
           "guild_serve_first_ttft_ms": first, "guild_serve_ttft_ms": later}
    if llama:
        try:
            llm = open_llama_cpp(str(lm.path), n_ctx=len(ids) + 16, n_threads=threads, n_threads_batch=threads)
            _llama_ttft(llm, ids)
            out["llama_warm_prefill_ms"] = median([_llama_ttft(llm, ids) for _ in range(max(3, runs))])
        except ImportError:
            pass
    return out


def _serve_ttft(path: str, runs: int, threads: int) -> tuple[float, float]:
    """Time to the first streamed token of the chat prompt from a fresh `guild serve` to one client: its first
    request (nothing to reuse), then the median of `runs` more, each about another subject (same length), so
    only the chat template's first tokens come from the server's prefix reuse."""
    from ..bench.server import free_port, run_server, stream_chat

    port = free_port()
    asks = [CHAT_PROMPT.replace("sky", w) for w in _SUBJECTS[: runs + 1]]
    got: list[float] = []

    def body():
        got.extend(stream_chat(port, p, 4, {})["ttft_s"] * 1e3 for p in asks)

    with tempfile.TemporaryDirectory() as logs:
        try:
            run_server("guild", [sys.executable, "-m", "guild", "serve", path, "--port", str(port), "-t",
                                 str(threads)], "/health", Path(logs), port, body)
        except RuntimeError as e:  # the server did not start
            raise GuildError(f"guild serve: {str(e).splitlines()[0]}") from None
    return got[0], median(got[1:])


def _synth_files(preset: str, layers: int, types: list[str], folder: str) -> list[str]:
    from .synth import synth

    os.makedirs(folder, exist_ok=True)
    files = []
    for t in types:
        f = Path(folder) / f"{preset}-{layers}l-{t.lower()}.gguf"
        if not f.exists():
            synth(preset, f, layers=layers, type_name=t)
        files.append(str(f))
    return files


def _print(path: str, out: dict) -> None:
    ref = out.get("llama.cpp")
    print(f"== {path}")
    for name, v in out.items():
        rel = (f"  ({v['decode'] / ref['decode']:.2f}x / {v['prefill'] / ref['prefill']:.2f}x llama.cpp)"
               if ref and name != "llama.cpp" else "")
        vt = v.get("vt_ms", {})
        curve = " ".join(f"{vt[T] / vt[1]:.2f}" for T in sorted(vt)) if vt else "-"
        print(f"{name:10s} decode {v['decode']:8.2f}  prefill-{PREFILL} {v['prefill']:8.2f}  "
              f"ttft {v['ttft_ms']:7.1f} ms{rel}\n{'':10s} V(T)/V(1), T=1..{MAX_T}: {curve}   "
              f"V(1) {vt.get(1, float('nan')):.2f} ms")
        if "distinct" in v:
            print(f"{'':10s} distinct experts per layer, T=1..{MAX_T}: "
                  + " ".join(f"{v['distinct'][T]:.1f}" for T in sorted(v["distinct"])))
        if "bound" in v:
            print(f"{'':10s} bandwidth bound {v['bound']:.1f} tok/s, reached {100 * v['bound_share']:.0f} %; "
                  f"bytes read by T rows over one row's, T=1..{MAX_T}: "
                  + " ".join(f"{v['bytes_vt'][T]:.2f}" for T in sorted(v["bytes_vt"])))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m guild.tools.perf_shapes", description=__doc__.splitlines()[0])
    ap.add_argument("gguf", nargs="*", help="model files (e.g. written by python -m guild.tools.synth)")
    ap.add_argument("--synth", metavar="PRESET", help="synthesize --types of this preset into --dir, measure each")
    ap.add_argument("--types", default="Q4_K_M", help="comma-separated types for --synth")
    ap.add_argument("--layers", type=int, default=4, help="layers of the --synth files")
    ap.add_argument("--dir", default="results/shapes", help="where --synth keeps its files")
    ap.add_argument("--fresh", metavar="MODEL", help="time to first token of fresh `guild run` processes on MODEL")
    ap.add_argument("--rounds", type=int, default=3, help="alternated rounds (medians over them)")
    ap.add_argument("--tokens", type=int, default=32, help="tokens decoded per decode run")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-llama", action="store_true", help="skip llama.cpp even when importable")
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout")
    a = ap.parse_args(argv)
    try:
        if a.rounds < 1 or a.tokens < 2 or a.layers < 1:
            raise BadFlagError("--rounds and --layers must be >= 1 and --tokens >= 2")
        files = list(a.gguf)
        for f in files:
            if not os.path.isfile(f):
                raise BadFlagError(f"{f}: no such file")
        if not files and not a.synth and not a.fresh:
            raise BadFlagError("give model files, --synth PRESET or --fresh MODEL")
        before = os.getloadavg()
        if a.synth:
            files += _synth_files(a.synth, a.layers, [t.strip() for t in a.types.split(",") if t.strip()], a.dir)
        peaks = machine_peaks(a.threads) if files else None
        results = {f: measure(f, a.rounds, a.tokens, a.threads, llama=not a.no_llama, peaks=peaks) for f in files}
        fresh = fresh_ttft(a.fresh, max(3, a.rounds), a.threads, llama=not a.no_llama) if a.fresh else None
        report = {"threads": a.threads, "rounds": a.rounds, "load_before": before, "load_after": os.getloadavg(),
                  "peaks": peaks, "results": results, "fresh": fresh}
    except GuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if a.json:
        print(json.dumps(report))
        return 0
    for f, out in results.items():
        _print(f, out)
    if fresh:
        llama_ms = fresh.get("llama_warm_prefill_ms")
        print(f"== fresh `guild run` on {a.fresh}: time to first token of a {fresh['prompt_tokens']}-token chat "
              f"prompt {fresh['guild_fresh_ttft_ms']:.1f} ms (runs {fresh['runs']}); fresh `guild serve` to one "
              f"client: first request {fresh['guild_serve_first_ttft_ms']:.1f} ms, later ones (the template's "
              f"first tokens reused) {fresh['guild_serve_ttft_ms']:.1f} ms"
              + (f"; llama.cpp warm prefill of the same ids {llama_ms:.1f} ms" if llama_ms else ""))
    print(f"load average before {before[0]:.2f}, after {report['load_after'][0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
