"""Long populated contexts beside llama.cpp (`python -m guild.tools.perf_long`): W10 at each size.

Per size N: W10's prompt cut to N tokens (a long reference document, then a question about its opening), the
rope stretched by YaRN (`--rope-scale`, default 4: the embedded models' 8,192 trained tokens to 32,768), the same
KV cache type on both sides. Runners: guild `normal` and `adaptive` (their tokens must be equal) and llama.cpp
through llama-cpp-python, each in a fresh child process so that its peak resident memory is its own; the
runners alternate within each size. Per runner: prefill tok/s of the whole prompt, decode tok/s of `--tokens`
greedy tokens, the peak resident memory the run added to its process (over the interpreter and guild's modules:
the model, its KV cache and buffers, for guild its compiled kernels), and for guild normal V(T)/V(1) at the
populated context (`--vt`, T = 1..4). `--repeat R` runs every runner R times per size, alternated, and reports
medians (adaptive against normal pair by pair): one reply is a few seconds of decoding, too little to resolve
a host that drifts.

    python -m guild.tools.perf_long --sizes 4096,16384,32768 [--model smollm2-135m] [--cache-type f16] [--repeat 3]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import resource
import statistics
import subprocess
import sys

import numpy as np

from ..engine.kvtypes import KV_TYPES, KVTypes
from ..engine.options import DecodeOptions, RopeOptions
from ..engine.timing import time_windows
from ..errors import BadFlagError, GuildError
from ..load import load_for, slots
from ..text.chat import run_turn
from ..text.tokenizer import Tokenizer
from ..upcycle import resolve_model
from ..workloads import load_workloads
from .perf import llama_cpp_decode

RUNNERS = ("normal", "adaptive", "llama.cpp")
GGML_TYPE = {"f32": 0, "f16": 1, "q8_0": 8}  # llama.cpp's type_k / type_v
YARN = 2  # llama.cpp's rope_scaling_type


def _rss_mb() -> float:
    """The process's peak resident memory so far."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _now_rss_mb() -> float:
    """Its resident memory now (Linux), else the peak."""
    try:
        with open("/proc/self/status") as f:
            return next(int(x.split()[1]) for x in f if x.startswith("VmRSS:")) / 1024
    except (OSError, StopIteration, ValueError):
        return _rss_mb()


def _guild(a, n: int, strategy: str) -> dict:
    base = _now_rss_mb()  # the interpreter and guild's modules: what the run adds is the model's, its cache's
    opts = DecodeOptions(strategy=strategy, context=n + a.tokens + 16, max_tokens=a.tokens,
                         rope=RopeOptions(scaling="yarn", scale=a.rope_scale), kv=KVTypes(a.cache_type, a.cache_type))
    lm = load_for(a.model, opts, threads=a.threads)
    w = load_workloads(["W10"])[0].scaled(lm.tokenizer, n)
    ss = slots(lm, opts, 1, corpus_texts=w.corpus_texts())
    t = run_turn(ss, w.render_turns()[0], chat=True, max_tokens=a.tokens, max_draft=opts.max_draft)[0][0]
    st = t.stats
    out = {"prompt": st.prompt_tokens, "prefill": st.prefill_tok_s, "decode": st.decode_tok_s,
           "tokens": [int(x) for x in t.tokens], "windows": len(st.windows),
           "accepted": sum(r.emitted - 1 for r in st.windows), "drafted": sum(r.k for r in st.windows),
           "rss_mb": _rss_mb() - base}
    if a.vt and strategy == "normal":  # windows of the reply's own tokens at the populated context
        state, reply = ss[0].conversation.session.state, out["tokens"]
        wt = time_windows(lm.model, state, lambda r, T: np.asarray((reply * 8)[r: r + T], np.int64),
                          range(1, 5), a.vt, warmup=1)
        out["vt_ms"] = {T: statistics.median(v) for T, v in wt.forward_ms.items()}
    return out


def _llama(a, n: int) -> dict:
    import llama_cpp  # noqa: F401  (optional: the anchor)

    path = resolve_model(a.model, progress=False)  # the file guild runs, and its tokenizer alone for the ids
    tok = Tokenizer.from_gguf(path)
    ids = load_workloads(["W10"])[0].scaled(tok, n).prompt_ids(tok)
    base = _now_rss_mb()  # the interpreter and guild's modules
    dec, pre, toks = llama_cpp_decode(path, ids, a.tokens, a.threads, 1, stop_eos=True, rope_scaling_type=YARN,
                                      rope_freq_scale=1 / a.rope_scale, type_k=GGML_TYPE[a.cache_type],
                                      type_v=GGML_TYPE[a.cache_type],
                                      flash_attn=a.cache_type == "q8_0")  # llama.cpp quantizes V only under it
    return {"prompt": len(ids), "prefill": pre, "decode": dec, "tokens": [int(t) for t in toks],
            "rss_mb": _rss_mb() - base}


def child(a) -> None:
    out = _llama(a, a.size) if a.child == "llama.cpp" else _guild(a, a.size, a.child)
    print(json.dumps(out))


def _run_child(a, runner: str, n: int, vt: int) -> dict:
    cmd = [sys.executable, "-m", "guild.tools.perf_long", "--child", runner, "--size", str(n), "--model", a.model,
           "--cache-type", a.cache_type, "--rope-scale", str(a.rope_scale), "--tokens", str(a.tokens),
           "--threads", str(a.threads), "--vt", str(vt)]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode:
        tail = (p.stderr.strip().splitlines() or ["no output"])[-1]
        raise GuildError(f"perf_long: {runner} at {n} tokens failed: {tail}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def measure(a, progress=print) -> dict:
    """Per size, per runner: its run, or with `a.repeat` > 1 its rounds' medians (prefill, decode, memory) and
    each round's figures (`*_runs`); the runners alternate within a round and the order reverses every other
    round (A B C, C B A, ...), so a drifting host weighs on every runner alike. Adaptive's `vs_normal` is the
    median of its rounds' ratios to the normal run beside it."""
    sizes, res = [int(s) for s in a.sizes.split(",")], {}
    runners = [r for r in RUNNERS if r in a.runners.split(",")]
    if "llama.cpp" in runners and importlib.util.find_spec("llama_cpp") is None:
        progress("perf_long: llama-cpp-python is not installed: guild alone (pip install llama-cpp-python==0.3.36)")
        runners.remove("llama.cpp")
    rounds = a.repeat
    for n in sizes:
        runs: dict[str, list[dict]] = {r: [] for r in runners}
        for i in range(rounds):
            for r in runners if i % 2 == 0 else runners[::-1]:
                progress(f"perf_long: {r} at {n} tokens" + (f" (round {i + 1} of {rounds})" if rounds > 1 else ""))
                o = _run_child(a, r, n, a.vt if i == 0 else 0)  # V(T) once: the first round's is reported
                runs[r].append(o)
                if "decode" in o:
                    progress(f"perf_long: {r} at {n} tokens: prefill {o['prefill']:.1f}, "
                             f"decode {o['decode']:.1f} tok/s")
        prompts = {o["prompt"] for rs in runs.values() for o in rs}
        if len(prompts) > 1:
            raise GuildError(f"perf_long: the runners' prompts differ at {n} tokens: "
                             + ", ".join(f"{r} {rs[0]['prompt']}" for r, rs in runs.items()))
        if "normal" in runs and "adaptive" in runs:
            want = runs["normal"][0]["tokens"]
            if any(o["tokens"] != want for o in runs["normal"] + runs["adaptive"]):
                raise GuildError(f"perf_long: parity failure at {n} tokens: adaptive's tokens differ from normal's")
        res[n] = {r: _summary(rs) for r, rs in runs.items()}
        if rounds > 1 and "normal" in runs and "adaptive" in runs:
            ratios = [x["decode"] / y["decode"] for x, y in zip(runs["adaptive"], runs["normal"], strict=True)]
            res[n]["adaptive"]["vs_normal_runs"] = ratios
            res[n]["adaptive"]["vs_normal"] = statistics.median(ratios)
    return res


def _summary(runs: list[dict]) -> dict:
    """One run as it is; several: the first's fields with the medians of the timed ones, each round's kept."""
    if len(runs) == 1:
        return runs[0]
    out = dict(runs[0])
    for k in ("prefill", "decode", "rss_mb"):
        out[k] = statistics.median(o[k] for o in runs)
        out[f"{k}_runs"] = [o[k] for o in runs]
    return out


def markdown(res: dict, a) -> str:
    rounds = f", medians of {a.repeat} alternated rounds" if a.repeat > 1 else ""
    lines = [f"KV {a.cache_type}, YaRN x{a.rope_scale:g}, {a.threads} threads, {a.tokens} tokens decoded{rounds}", "",
             "| size | runner | prefill tok/s | decode tok/s | RSS added, MB | acceptance | vs llama.cpp |",
             "|---|---|---|---|---|---|---|"]
    for n, g in res.items():
        ll = g.get("llama.cpp")
        for r, o in g.items():
            acc = f"{o['accepted'] / o['drafted']:.0%}" if o.get("drafted") else "-"
            vs = "" if not ll or r == "llama.cpp" else \
                f"{o['decode'] / ll['decode']:.2f}x, {o['prefill'] / ll['prefill']:.2f}x"
            lines.append(f"| {n} | {r} | {o['prefill']:.1f} | {o['decode']:.1f} | {o['rss_mb']:.0f} | {acc} | {vs} |")
        if "normal" in g and "adaptive" in g:
            ratio = g["adaptive"].get("vs_normal", g["adaptive"]["decode"] / g["normal"]["decode"])
            runs = g["adaptive"].get("vs_normal_runs")
            each = f" (rounds: {', '.join(f'{x:.2f}' for x in runs)})" if runs else ""
            lines.append(f"| {n} | adaptive / normal | | {ratio:.2f}x{each} | | | |")
        vt = g.get("normal", {}).get("vt_ms")
        if vt:
            v1 = vt["1"]  # the children's JSON: string keys
            lines.append(f"| {n} | V(T)/V(1), T = 1..4 (V(1) {v1:.1f} ms) | | "
                         + ", ".join(f"{v / v1:.2f}" for v in vt.values()) + " | | | |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m guild.tools.perf_long", description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="4096,8192,16384,32768", help="W10 prompt sizes in tokens, comma-separated")
    ap.add_argument("--model", default="smollm2-135m", help="a GGUF path or tag (default: the embedded dense model)")
    ap.add_argument("--cache-type", default="f16", help=f"both sides' KV cache type: {', '.join(GGML_TYPE)}")
    ap.add_argument("--rope-scale", type=float, default=4.0, help="YaRN's context factor (default 4)")
    ap.add_argument("--tokens", type=int, default=64, help="greedy tokens decoded per run")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runners", default=",".join(RUNNERS), help=f"a subset of {', '.join(RUNNERS)}")
    ap.add_argument("--vt", type=int, default=0, help="repeats of V(T) for T = 1..4 after guild normal's reply")
    ap.add_argument("--repeat", type=int, default=1,
                    help="rounds of every runner per size, alternated (medians; adaptive/normal pair by pair)")
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout")
    ap.add_argument("--child", choices=RUNNERS, help=argparse.SUPPRESS)
    ap.add_argument("--size", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    try:
        if a.cache_type not in GGML_TYPE or a.cache_type not in KV_TYPES:
            raise BadFlagError(f"--cache-type must be one of {', '.join(GGML_TYPE)}, got '{a.cache_type}'")
        if a.tokens < 2 or a.threads < 1 or a.vt < 0 or a.rope_scale < 1 or a.repeat < 1:
            raise BadFlagError("--tokens must be >= 2, --threads >= 1, --vt >= 0, --rope-scale >= 1 and --repeat >= 1")
        if not set(a.runners.split(",")) <= set(RUNNERS):
            raise BadFlagError(f"--runners must name some of {', '.join(RUNNERS)}, got '{a.runners}'")
        try:
            sizes = [int(s) for s in a.sizes.split(",")]
        except ValueError:
            raise BadFlagError(f"--sizes must be comma-separated token counts, got '{a.sizes}'") from None
        if min(sizes) < 64:
            raise BadFlagError(f"--sizes must be at least 64 tokens each, got '{a.sizes}'")
        if a.child:
            child(a)
            return 0
        res = measure(a, progress=lambda s: print(s, file=sys.stderr, flush=True))
    except GuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps({str(n): g for n, g in res.items()}) if a.json else markdown(res, a))
    return 0


if __name__ == "__main__":
    sys.exit(main())
