"""Engine benchmark (`make bench`): decode and prefill speed of guild vs llama.cpp on the embedded models,
window cost V(T)/V(1), distinct experts per layer, and the share of a decode step spent in Python.

Medians and ratios from one process; llama.cpp (llama-cpp-python) is measured when importable.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
from numba import njit, prange

from ..calib.timing import median
from ..engine.sampling import SamplingParams
from ..engine.session import GuildSession
from ..engine.timing import time_windows
from ..engine.verify import Verifier
from ..kernels.cpu import quant, simd
from ..load import load, set_threads
from ..upcycle import TAG_MOE128, embedded_dense_path, ensure_embedded_moe

SHORT = "Write a short story about a robot who learns to paint."


def long_prompt_text() -> str:
    """~600 tokens of real text shipped with Python itself (the `textwrap` module's source)."""

    return Path(textwrap.__file__).read_text()[:2200]


def guild_decode(model, ids, n, repeats):

    dec, pre, toks = [], [], None
    for _ in range(repeats):
        s = GuildSession(model, n_ctx=len(ids) + n + 8)
        toks, st = s.generate(ids, n)
        dec.append(st.decode_tok_s)
        pre.append(st.prefill_tok_s)
    return median(dec), median(pre), toks


def open_llama_cpp(path, **kwargs):
    """A llama_cpp.Llama with ggml's "extra" buffer types off: on AMX-capable CPUs llama-cpp-python 0.3.36
    places Q4/Q8 weights in the AMX buffer, whose matmul segfaults here; the plain CPU kernels run instead."""
    import llama_cpp  # optional: the llama.cpp anchor
    import llama_cpp.llama_cpp as C

    default = C.llama_model_default_params

    def params():
        p = default()
        p.use_extra_bufts = False
        return p

    C.llama_model_default_params = params
    try:
        return llama_cpp.Llama(model_path=str(path), verbose=False, **kwargs)
    finally:
        C.llama_model_default_params = default


def llama_cpp_decode(path, ids, n, threads, repeats, stop_eos=False, **params):
    """(decode tok/s, prefill tok/s, tokens) of llama.cpp's greedy reply to `ids`, medians over `repeats`; up to
    n tokens (fewer at its end of sequence with `stop_eos`); `params`: more llama_cpp.Llama settings."""
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return None
    llm = open_llama_cpp(path, n_ctx=len(ids) + n + 8, n_threads=threads, n_threads_batch=threads, n_batch=512,
                         **params)
    dec, pre, toks = [], [], []
    for _ in range(repeats):
        toks = []
        llm.reset()  # no reuse of the previous run's prompt cache
        t0 = time.perf_counter()
        t1 = None
        for tok in llm.generate(ids, temp=0.0, top_k=1, reset=True):
            if t1 is None:
                t1 = time.perf_counter()
            toks.append(tok)
            if len(toks) == n or (stop_eos and tok == llm.token_eos()):
                break
        t2 = time.perf_counter()
        pre.append(len(ids) / (t1 - t0))
        dec.append((len(toks) - 1) / (t2 - t1) if len(toks) > 1 else 0.0)
    return median(dec), median(pre), toks


def window_costs(model, ids, repeats=7, max_T=8, text=None):
    """Median ms of one verification window of T rows at the prompt's context, T = 1..max_T. Each repeat runs
    every T in turn (after one unmeasured round), so that a slow spell of a shared machine hits all T alike.
    Windows are random tokens, or cut from `text` (real text routes to fewer distinct experts) at a different
    offset each repeat."""

    s = GuildSession(model, n_ctx=len(ids) + max_T + 16)
    s.prefill(ids)
    rng = np.random.default_rng(0)

    def window(r: int, T: int):
        if text is not None and len(text) > T:
            j = (7 * r) % (len(text) - T)
            return np.asarray(text[j : j + T], np.int64)
        return rng.integers(min(100, model.args.vocab_size // 2), min(20000, model.args.vocab_size), T)

    Ts = range(1, max_T + 1)
    t = time_windows(model, s.state, window, Ts, repeats, warmup=1)
    return {T: median(t.forward_ms[T]) for T in Ts}, {T: float(np.mean(t.distinct[T])) for T in Ts}


# -- the bound: what a window of T rows cannot beat on this machine ------------------------------------------
@njit(cache=True, parallel=True)
def _peak_fma(n, lanes):
    """n x 12 independent 16-lane fma per thread (registers only)."""
    tot = np.zeros(lanes.size, np.float32)
    for c in prange(lanes.size):
        m = simd.splat_f(np.float32(0.999999))
        k = simd.splat_f(np.float32(1e-7))
        a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = a8 = a9 = a10 = a11 = simd.splat_f(lanes[c])
        for _ in range(n):
            a0 = simd.fma_f(a0, m, k)
            a1 = simd.fma_f(a1, m, k)
            a2 = simd.fma_f(a2, m, k)
            a3 = simd.fma_f(a3, m, k)
            a4 = simd.fma_f(a4, m, k)
            a5 = simd.fma_f(a5, m, k)
            a6 = simd.fma_f(a6, m, k)
            a7 = simd.fma_f(a7, m, k)
            a8 = simd.fma_f(a8, m, k)
            a9 = simd.fma_f(a9, m, k)
            a10 = simd.fma_f(a10, m, k)
            a11 = simd.fma_f(a11, m, k)
        s = simd.add_f(simd.add_f(simd.add_f(a0, a1), simd.add_f(a2, a3)), simd.add_f(a4, a5))
        s = simd.add_f(simd.add_f(s, simd.add_f(a6, a7)), simd.add_f(simd.add_f(a8, a9), simd.add_f(a10, a11)))
        tot[c] = simd.lane(s, 0)
    return tot


@njit(cache=True, parallel=True)
def _peak_int8(n, lanes):
    """n x 8 independent dot8 (the int8 kernels' 4-byte dot pairs: 128 u8 x s8 products each) per thread; each
    chain's accumulator is also its signed operand, or the compiler folds the loop (an invariant product summed
    n times)."""
    tot = np.zeros(lanes.size, np.float32)
    for c in prange(lanes.size):
        u = simd.splat_i(0x01010101)
        a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = simd.splat_i(np.int64(lanes[c]))
        for _ in range(n):
            a0 = simd.dot8(a0, u, a0, u, a0)
            a1 = simd.dot8(a1, u, a1, u, a1)
            a2 = simd.dot8(a2, u, a2, u, a2)
            a3 = simd.dot8(a3, u, a3, u, a3)
            a4 = simd.dot8(a4, u, a4, u, a4)
            a5 = simd.dot8(a5, u, a5, u, a5)
            a6 = simd.dot8(a6, u, a6, u, a6)
            a7 = simd.dot8(a7, u, a7, u, a7)
        s = simd.add_i(simd.add_i(simd.add_i(a0, a1), simd.add_i(a2, a3)), simd.add_i(simd.add_i(a4, a5),
                                                                                  simd.add_i(a6, a7)))
        tot[c] = simd.lane(simd.cvt(s), 0)
    return tot


def machine_peaks(threads: int, repeats: int = 5) -> dict:
    """This machine with `threads` threads: copy bandwidth (STREAM's count: bytes read + written, GB/s, 256 MiB
    arrays), fp32 fma and int8 dot-product rates (G multiply-adds/s); best of `repeats`."""
    a = np.ones(64 << 20, np.float32)
    b = np.empty_like(a)
    lanes = np.ones(threads, np.float32)
    _peak_fma(10, lanes)
    _peak_int8(10, lanes)
    bw, f, i = [], [], []
    n = 2_000_000
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(b, a)
        t1 = time.perf_counter()
        _peak_fma(n, lanes)
        t2 = time.perf_counter()
        _peak_int8(n, lanes)
        t3 = time.perf_counter()
        bw.append(2 * a.nbytes / (t1 - t0) / 1e9)
        f.append(threads * n * 12 * 16 / (t2 - t1) / 1e9)
        i.append(threads * n * 8 * 128 / (t3 - t2) / 1e9)
    return {"copy_gbs": max(bw), "fp32_gmacs": max(f), "int8_gmacs": max(i), "threads": threads}


def window_bound(model, ctx: int, distinct: dict, peaks: dict) -> dict:
    """Lower bound (ms) on a window of T rows at context ctx: max(the window's distinct weight and KV bytes at
    the copy bandwidth, its multiply-adds at the peak rate of each matrix's numerics). `distinct`: mean distinct
    experts per MoE layer for each T (window_costs)."""
    from ..calib.cpu import model_matrices

    a = model.args
    mats = model_matrices(model)
    shared = [m for _, m, e in mats if not e]
    experts = [m for _, m, e in mats if e]
    n_moe = max(1, a.n_layers)
    n_exp = max(1, a.n_experts) if experts else 1
    exp_bytes = sum(m.nbytes for m in experts) / (n_moe * n_exp) if experts else 0.0  # one expert of one layer
    exp_macs = sum(m.n_rows * m.n_cols for m in experts) / (n_moe * n_exp) if experts else 0.0
    exp_i8 = bool(experts) and experts[0].numerics == "i8"
    kv = 2 * a.n_layers * a.n_kv_heads * a.head_dim * ctx * 4  # fp32 K and V, read once per window
    att_macs = 2 * a.n_layers * a.n_heads * a.head_dim * ctx  # per row
    rate = {"i8": peaks["int8_gmacs"] * 1e9, "f32": peaks["fp32_gmacs"] * 1e9}
    out = {}
    for T, d in distinct.items():
        byts = sum(m.nbytes for m in shared) + (d * exp_bytes * n_moe if experts else 0) + kv
        t_mac = T * (sum(m.n_rows * m.n_cols / rate[m.numerics] for m in shared)
                     + a.n_experts_used * n_moe * exp_macs / rate["i8" if exp_i8 else "f32"]
                     + att_macs / rate["f32"])
        t_mem = byts / (peaks["copy_gbs"] * 1e9)
        out[T] = {"mem_ms": t_mem * 1e3, "mac_ms": t_mac * 1e3, "bound_ms": max(t_mem, t_mac) * 1e3}
    return out


def verifier_share(model, ids, T=5, repeats=9):
    """Share of a T-row window spent in the verifier (sampling chain with penalties on every row) vs the
    forward, on the given model; drafts are wrong from row 1 so every row is sampled."""

    p = SamplingParams(temperature=0.7, top_k=40, top_p=0.9, min_p=0.05, repeat_penalty=1.1,
                       frequency_penalty=0.1, presence_penalty=0.1, seed=12345)
    s = GuildSession(model, n_ctx=len(ids) + 16)
    s.prefill(ids)
    ver = Verifier(p)
    fwd, vt = [], []
    window = list(ids[-T:])
    for _ in range(repeats):
        t0 = time.perf_counter()
        logits = model.forward(window, s.state)
        t1 = time.perf_counter()
        ver.verify(logits, [window[0]] + [-1] * (T - 1), list(ids), s.state.pos, 100)
        t2 = time.perf_counter()
        s.state.commit(0)
        fwd.append(t1 - t0)
        vt.append(t2 - t1)
    return median(vt) / (median(vt) + median(fwd))


def python_share(model, ids, steps=24) -> tuple[float, dict[str, float]]:
    """Greedy decode steps after a prefill of ids, timed by time_windows with every backend op on the clock:
    the fraction of a step's wall time (forward, argmax, commit) outside the kernels and the backend's ops, and
    the median ms per step of each op (the routed experts as one)."""

    s = GuildSession(model, n_ctx=len(ids) + steps + 8)
    nxt = [int(np.argmax(s.prefill(ids)))]

    def pick(out, window, T):
        nxt[0] = int(np.argmax(out.logits[-1]))

    t = time_windows(model, s.state, lambda r, T: nxt[:1], [1], steps, keep=lambda T: 1, after=pick, ops=True)
    share = 1.0 - sum(t.kernels_total(1)) / sum(t.window_ms(1))
    names = sorted({n for k in t.kernel_ms[1] for n in k})
    return share, {n: round(median(t.kernel(n, 1)), 4) for n in names}


AGREEMENT_PROMPTS = (
    "What is the capital of France?",
    "Write a Python function that reverses a string.",
    "Explain photosynthesis in two sentences.",
    "List three uses of a paperclip.",
)


def moe_agreement(dense, moe, tokenizer, n=64):
    """Greedy top-1 agreement of the upcycled MoE with its dense source: the dense model's greedy continuation
    is fed to both (teacher forcing) and their argmax compared at every generated position."""

    agree = total = 0
    for p in AGREEMENT_PROMPTS:
        ids = tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": p}]), add_special=True)
        gen, _ = GuildSession(dense, n_ctx=len(ids) + n + 8).generate(ids, n)
        seq = np.array(ids + gen[:-1], np.int64)
        s = GuildSession(moe, n_ctx=len(seq) + 8)
        logits = moe.forward(seq, s.state)
        pred = logits[len(ids) - 1 :].argmax(1)
        agree += int(np.sum(pred == np.array(gen)))
        total += len(gen)
    return agree / total


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m guild.tools.perf", description=__doc__)
    ap.add_argument("--threads", type=int, default=None, help="threads for guild and llama.cpp (default: all)")
    ap.add_argument("--tokens", type=int, default=128, help="greedy tokens generated per run")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--full", action="store_true", help="more repeats")
    ap.add_argument("--out", default="results", help="folder for perf.json and perf.md")
    ap.add_argument("--moe128", action="store_true", help="also the 128-expert top-8 upcycle (built on first use)")
    ap.add_argument("--numerics", choices=("i8", "f32"), default="i8", help="numeric mode of the CPU kernels")
    a = ap.parse_args(argv)

    threads = set_threads(a.threads)
    quant.set_default_numerics(a.numerics)
    repeats = a.repeats * (3 if a.full else 1)
    paths = {"dense": embedded_dense_path(), "moe 8x top-2": ensure_embedded_moe()}
    if a.moe128:
        paths["moe 128x top-8"] = ensure_embedded_moe(tag=TAG_MOE128)
    peaks = machine_peaks(threads)
    rows, report = [], {"machine": platform.processor() or platform.machine(), "threads": threads, "runs": [],
                        "peaks": peaks}
    lines = []
    for label, path in paths.items():
        lm = load(str(path))
        prompts = {"short": lm.tokenizer.apply_chat_template([{"role": "user", "content": SHORT}]),
                   "~600-token": long_prompt_text()}
        for pname, text in prompts.items():
            ids = lm.tokenizer.encode(text, add_special=True)
            guild_decode(lm.model, ids[:8], 4, 1)  # warm-up: JIT and caches
            g_dec, g_pre, g_toks = guild_decode(lm.model, ids, a.tokens, repeats)
            ll = llama_cpp_decode(path, ids, a.tokens, threads, repeats)
            r = {"model": label, "prompt": pname, "prompt_tokens": len(ids), "guild_decode_tok_s": g_dec,
                 "guild_prefill_tok_s": g_pre}
            if ll:
                r.update(llama_decode_tok_s=ll[0], llama_prefill_tok_s=ll[1],
                         ratio=g_dec / ll[0], same_tokens=int(np.sum(np.array(g_toks) == np.array(ll[2]))))
            rows.append(r)
            print(json.dumps(r), file=sys.stderr)
        long_ids = lm.tokenizer.encode(long_prompt_text())
        ms, distinct = window_costs(lm.model, long_ids)
        bound = window_bound(lm.model, len(long_ids), distinct, peaks)
        share, op_ms = python_share(lm.model, ids[:64])
        vshare = verifier_share(lm.model, ids[:64])
        report["runs"].append({"model": label, "numerics": lm.numerics, "window_ms": ms, "distinct_experts": distinct,
                               "bound": bound, "python_share": share, "decode_step_op_ms": op_ms,
                               "verifier_share_T5": vshare})
        lines.append(f"\n**{label}** window cost at a ~600-token context (median ms, ratio to T=1)"
                     + (", mean distinct experts per layer" if lm.model.args.is_moe else "") + ":\n")
        lines.append("| T | " + " | ".join(str(t) for t in ms) + " |")
        lines.append("|---" * (len(ms) + 1) + "|")
        lines.append("| ms | " + " | ".join(f"{v:.1f}" for v in ms.values()) + " |")
        lines.append("| V(T)/V(1) | " + " | ".join(f"{v / ms[1]:.2f}" for v in ms.values()) + " |")
        if lm.model.args.is_moe:
            lines.append("| experts | " + " | ".join(f"{v:.2f}" for v in distinct.values()) + " |")
        lines.append("| bound ms (bytes / mult-adds) | " + " | ".join(
            f"{b['bound_ms']:.1f} ({b['mem_ms']:.1f}/{b['mac_ms']:.1f})" for b in bound.values()) + " |")
        lines.append("| V(T)/bound | " + " | ".join(f"{ms[T] / bound[T]['bound_ms']:.1f}" for T in ms) + " |")
        top = sorted(op_ms.items(), key=lambda kv: -kv[1])[:4]
        lines.append(f"\nPython outside the kernels and backend ops: {share * 100:.1f}% of a decode step (costliest "
                     "per step: " + ", ".join(f"{n} {v:.2f} ms" for n, v in top) + "). Verifier (sampling with "
                     f"penalties, every row): {vshare * 100:.1f}% of a T=5 window.")
    report["decode"] = rows
    dense_lm, moe_lm = load(str(paths["dense"])), load(str(paths["moe 8x top-2"]))
    report["moe_top1_agreement"] = agree = moe_agreement(dense_lm.model, moe_lm.model, dense_lm.tokenizer)
    lines.append(f"\nUpcycled MoE vs dense: greedy top-1 agreement {agree * 100:.1f}% "
                 f"(teacher-forced on the dense model's greedy output, {len(AGREEMENT_PROMPTS)} chat prompts).")
    head = ["| model | prompt | tokens | guild decode tok/s | llama.cpp tok/s | ratio | guild prefill tok/s "
            "| llama.cpp prefill tok/s | same greedy tokens |", "|---" * 9 + "|"]
    for r in rows:
        ll = "llama_decode_tok_s" in r
        head.append(
            f"| {r['model']} | {r['prompt']} | {r['prompt_tokens']} | {r['guild_decode_tok_s']:.1f} | "
            + (f"{r['llama_decode_tok_s']:.1f} | {r['ratio']:.2f}× | " if ll else "– | – | ")
            + f"{r['guild_prefill_tok_s']:.0f} | "
            + (f"{r['llama_prefill_tok_s']:.0f} | {r['same_tokens']}/{a.tokens} |" if ll else "– | – |")
        )
    md = (f"guild {threads} threads, numerics {a.numerics}, {a.tokens} greedy tokens, median of {repeats}; machine: "
          f"copy {peaks['copy_gbs']:.1f} GB/s, fp32 fma {peaks['fp32_gmacs']:.0f} G/s, int8 dot "
          f"{peaks['int8_gmacs']:.0f} G multiply-adds/s\n\n" + "\n".join(head + lines))
    write_results(a.out, "perf", report, md)
    return 0


def write_results(folder: str, name: str, data, md: str) -> None:
    """Print the markdown table and save it with the raw figures as FOLDER/NAME.md and FOLDER/NAME.json."""
    print(md)
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(data, indent=1))
    (out / f"{name}.md").write_text(md + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
