"""Long populated contexts beside llama.cpp: W10 (a long reference document, then a question about its opening)
cut to each --sizes, the rope stretched by YaRN (--rope-scale: the embedded models' 8,192 trained tokens ×4), the
same KV cache type on both sides. Runners: guild normal and adaptive (their tokens must be equal) and llama.cpp
through llama-cpp-python, each measurement in a fresh child process so that the memory it adds is its own.
Per runner: prefill and decode tok/s, resident memory added, adaptive's draft acceptance; with --vt R, guild
normal's V(T) for T = 1..4 at the populated context after its reply.

    python -m guild.bench long --sizes 4096,16384,32768 --rounds 3 [--models smollm2-135m] [--cache-type f16]
"""

from __future__ import annotations

import statistics

import numpy as np

from ...engine.options import DecodeOptions, RopeOptions
from ...engine.timing import time_windows
from ...errors import BadFlagError
from ...kvtypes import KV_TYPES, KVTypes
from ...load import load_for, slots
from ...text.chat import run_turn
from ...text.tokenizer import Tokenizer
from ...upcycle import resolve_model
from ...workloads import load_workloads
from .. import runners as R
from ..harness import Run, Runner
from ..record import ratio

CHILD = True
THREADS = 2
ROUNDS = 1
BASELINE = "llama.cpp"
RUNNERS = ("normal", "adaptive", "llama.cpp")
YARN = 2  # llama.cpp's rope_scaling_type


def add_args(ap) -> None:
    ap.add_argument("--sizes", default="4096,8192,16384,32768", help="W10 prompt sizes (default: %(default)s)")
    ap.add_argument("--models", default="smollm2-135m", help="a GGUF path or tag (default: %(default)s)")
    ap.add_argument("--cache-type", default="f16", help=f"both sides' KV cache type: {', '.join(R.GGML_KV_TYPES)}")
    ap.add_argument("--rope-scale", type=float, default=4.0, help="YaRN's context factor (default: %(default)s)")
    ap.add_argument("-n", "--tokens", type=int, default=64, help="greedy tokens decoded per run")
    ap.add_argument("--runners", default=",".join(RUNNERS), help="a subset of %(default)s")
    ap.add_argument("--vt", type=int, default=0, help="repeats of V(T), T = 1..4, after guild normal's reply")


def check(a) -> None:
    if a.cache_type not in R.GGML_KV_TYPES or a.cache_type not in KV_TYPES:
        raise BadFlagError(f"--cache-type must be one of {', '.join(R.GGML_KV_TYPES)}, got '{a.cache_type}'")
    if a.tokens < 2 or a.vt < 0 or a.rope_scale < 1:
        raise BadFlagError("--tokens must be >= 2, --vt >= 0 and --rope-scale >= 1")
    if not set(a.runners.split(",")) <= set(RUNNERS):
        raise BadFlagError(f"--runners must name some of {', '.join(RUNNERS)}, got '{a.runners}'")
    try:
        a.size_list = [int(s) for s in a.sizes.split(",")]
    except ValueError:
        raise BadFlagError(f"--sizes must be comma-separated token counts, got '{a.sizes}'") from None
    if min(a.size_list) < 64:
        raise BadFlagError(f"--sizes must be at least 64 tokens each, got '{a.sizes}'")


def points(a) -> list[dict]:
    return [{"size": n} for n in a.size_list]


def _guild(a, strategy: str) -> Runner:
    def measure(pt):
        n = pt["size"]
        opts = DecodeOptions(strategy=strategy, context=n + a.tokens + 16, max_tokens=a.tokens,
                             rope=RopeOptions(scaling="yarn", scale=a.rope_scale),
                             kv=KVTypes(a.cache_type, a.cache_type))
        lm = load_for(a.models, opts, threads=a.threads)
        lm.warm_up(strategy, opts.mtp)  # as `guild run` loads: a kernel compiled on first use is not decode time
        w = load_workloads(["W10"])[0].scaled(lm.tokenizer, n)
        ss = slots(lm, opts, 1, corpus_texts=w.corpus_texts())
        t = run_turn(ss, w.render_turns()[0], chat=True, max_tokens=a.tokens, max_draft=opts.max_draft)[0][0]
        st = t.stats
        figs = {"prefill_tok_s": st.prefill_tok_s, "decode_tok_s": st.decode_tok_s}
        drafted = sum(r.k for r in st.windows)
        if drafted:
            figs["acceptance"] = sum(r.emitted - 1 for r in st.windows) / drafted
        if a.vt and strategy == "normal":  # windows of the reply's own tokens at the populated context
            reply = [int(x) for x in t.tokens]
            wt = time_windows(lm.model, ss[0].conversation.session.state,
                              lambda r, T: np.asarray((reply * 8)[r: r + T], np.int64), range(1, 5), a.vt, warmup=1)
            vt = {T: statistics.median(v) for T, v in wt.forward_ms.items()}
            figs["window_ms"], figs["window_ratio"] = vt, {T: v / vt[1] for T, v in vt.items()}
        return Run(figs, [int(x) for x in t.tokens], {"prompt": st.prompt_tokens})

    return Runner(strategy, measure, exact=strategy != "normal", reference=strategy == "normal")


def _llama(a) -> Runner:
    def measure(pt):
        path = resolve_model(a.models, progress=False)  # the file guild runs; its tokenizer alone for the ids
        tok = Tokenizer.from_gguf(path)
        ids = load_workloads(["W10"])[0].scaled(tok, pt["size"]).prompt_ids(tok)
        llm = R.open_llama_cpp(path, n_ctx=len(ids) + a.tokens + 8, n_threads=a.threads, n_threads_batch=a.threads,
                               n_batch=512, rope_scaling_type=YARN, rope_freq_scale=1 / a.rope_scale,
                               type_k=R.GGML_KV_TYPES[a.cache_type], type_v=R.GGML_KV_TYPES[a.cache_type],
                               flash_attn=a.cache_type == "q8_0")  # llama.cpp quantizes V only under it
        dec, pre, toks = R.llama_decode(llm, ids, a.tokens, stop_eos=True)
        return Run({"prefill_tok_s": pre, "decode_tok_s": dec}, toks, {"prompt": len(ids)})

    return Runner("llama.cpp", measure)


def runners(a) -> list[Runner]:
    want = a.runners.split(",")
    if "llama.cpp" in want and not R.llama_cpp_wanted(a):
        want.remove("llama.cpp")
    return [_guild(a, s) if s != "llama.cpp" else _llama(a) for s in RUNNERS if s in want]


def notes(records, a) -> list[str]:
    """adaptive / normal per size, from the medians."""
    by = {(r.point["size"], r.runner): r for r in records}
    return [f"\nadaptive / normal at {n}: {ratio(by[(n, 'adaptive')], by[(n, 'normal')], 'decode_tok_s'):.2f}×"
            for n in a.size_list if (n, "adaptive") in by and (n, "normal") in by]
