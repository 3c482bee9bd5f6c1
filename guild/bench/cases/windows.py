"""The verification-window curve: V(T), the ms of one window of T rows at a short context, and V(T)/V(1), for
T = 1..8, guild beside llama.cpp (one batch of T tokens); for guild also the distinct experts a window routes to
per MoE layer and the decode bandwidth bound: the bytes one token reads (dense matrices, the routed experts, the
KV cache) over this machine's measured read bandwidth (guild.bench.peaks), and the share of it decode reaches.

    python -m guild.bench windows --models smollm2-135m-moe --rounds 5
"""

from __future__ import annotations

from .. import runners as R
from ..harness import Run, Runner
from ..peaks import machine_peaks, window_bound
from .models import add_model_args, chat_ids, loaded, model_paths

BASELINE = "llama.cpp"


def add_args(ap) -> None:
    add_model_args(ap, default="smollm2-135m-moe")
    ap.add_argument("--repeats", type=int, default=3, help="windows per T within a round (default: %(default)s)")
    ap.add_argument("--no-llama", action="store_true", help="no llama-cpp-python runner")


def check(a) -> None:
    a.paths = model_paths(a)
    a.peaks = None


def points(a) -> list[dict]:
    return [{"model": name} for name in a.paths]


def _guild(a) -> Runner:
    def measure(pt):
        p = a.paths[pt["model"]]
        lm, ids = loaded(p, a.threads), chat_ids(p, a.threads)
        vt, distinct = R.guild_windows(lm.model, ids, repeats=a.repeats)
        figs = {"window_ms": vt, "window_ratio": {T: v / vt[1] for T, v in vt.items()}}
        if lm.model.args.is_moe:
            figs["distinct_experts"] = distinct
        a.peaks = a.peaks or machine_peaks(a.threads)
        wb = window_bound(lm.model, len(ids), distinct, a.peaks)
        figs["bound_tok_s"] = 1e3 / wb[1]["mem_ms"]
        dec, _, toks = R.guild_decode(lm.model, ids, 16)
        figs["bound_share"] = dec * wb[1]["mem_ms"] / 1e3
        return Run(figs, toks, {"bytes_ratio": {T: b["mem_ms"] / wb[1]["mem_ms"] for T, b in wb.items()}})

    return Runner("guild", measure, reference=True)


def _llama(a) -> Runner:
    def measure(pt):
        p = a.paths[pt["model"]]
        lm, ids = loaded(p, a.threads), chat_ids(p, a.threads)
        llm = R.open_llama_cpp(p, n_ctx=len(ids) + 64, n_threads=a.threads, n_threads_batch=a.threads)
        vt = R.llama_windows(llm, ids, a.repeats, lm.model.args.vocab_size)
        return Run({"window_ms": vt, "window_ratio": {T: v / vt[1] for T, v in vt.items()}})

    return Runner("llama.cpp", measure)


def runners(a) -> list[Runner]:
    return [_guild(a)] + ([_llama(a)] if R.llama_cpp_wanted(a) else [])


def notes(records, a) -> list[str]:
    p = a.peaks
    return [] if not p else [f"\nmachine, {p['threads']} threads: read {p['read_gbs']:.1f} GB/s (copy "
                             f"{p['copy_gbs']:.1f}), fp32 fma {p['fp32_gmacs']:.0f} G/s, int8 dot "
                             f"{p['int8_gmacs']:.0f} G multiply-adds/s"]
