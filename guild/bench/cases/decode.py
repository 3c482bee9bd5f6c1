"""Decode, prefill and time to first token: guild beside llama.cpp on the same files and token ids.

Per model and runner: decode tok/s of --tokens greedy tokens after the chat prompt (or --depth tokens of text),
prefill tok/s of --prefill tokens of real text, and the time to first token of the 44-token chat prompt (warm:
the process ran before).
--cache-type stores every runner's KV cache in one type (default: each engine's own, guild f32, llama.cpp f16).
Runners: guild under each --numerics; llama.cpp through llama-cpp-python when importable (--no-llama skips it);
any llama-bench binary (mainline or ik_llama.cpp) by --llama-bench NAME=PATH, its own pp and tg figures. guild's
greedy tokens are compared with llama.cpp's (≠ marks a difference; their numerics differ).

    python -m guild.bench decode --rounds 5
    python -m guild.bench decode --models '' --synth qwen3-30b-a3b --types Q4_K_M,IQ4_XS -t 2 \\
        --llama-bench ik=/opt/ik_llama.cpp/build/bin/llama-bench --llama-bench-args='-rtr 1'
"""

from __future__ import annotations

import shlex

from ...errors import BadFlagError
from ...kvtypes import F32_KV, KVTypes
from .. import runners as R
from ..harness import Run, Runner
from .models import add_model_args, chat_ids, loaded, model_paths, text_ids

BASELINE = "llama.cpp"


def add_args(ap) -> None:
    add_model_args(ap)
    ap.add_argument("-n", "--tokens", type=int, default=32, help="greedy tokens per decode run (default: %(default)s)")
    ap.add_argument("-d", "--depth", type=int, default=0,
                    help="decode after this many prompt tokens of real text (default: after the chat prompt); "
                         "for ik_llama.cpp's llama-bench pass the same with --llama-bench-args='-gp DEPTH,TOKENS'")
    ap.add_argument("-p", "--prefill", type=int, default=512, help="prompt tokens of the prefill run")
    ap.add_argument("--cache-type", choices=("f32", "f16", "q8_0"),
                    help="KV cache type of every runner (default: each engine's own: guild f32, llama.cpp f16)")
    ap.add_argument("--numerics", default="i8", help="guild runners: comma-separated i8, f32 (default: %(default)s)")
    ap.add_argument("--no-llama", action="store_true", help="no llama-cpp-python runner")
    ap.add_argument("--llama-bench", action="append", default=[], metavar="NAME=PATH",
                    help="a llama-bench binary as a runner (repeatable)")
    ap.add_argument("--llama-bench-args", default="", help="more flags for every llama-bench (e.g. '-rtr 1')")


def check(a) -> None:
    a.paths = model_paths(a)
    if a.tokens < 2 or a.prefill < 8 or a.depth < 0:
        raise BadFlagError("--tokens must be >= 2, --prefill >= 8 and --depth >= 0")
    a.modes = [m.strip() for m in a.numerics.split(",")]
    a.kv = KVTypes(a.cache_type, a.cache_type) if a.cache_type else F32_KV
    if not set(a.modes) <= {"i8", "f32"}:
        raise BadFlagError(f"--numerics: i8 and/or f32, got '{a.numerics}'")
    a.benches = {}
    for spec in a.llama_bench:
        name, _, path = spec.partition("=")
        if not path:
            raise BadFlagError(f"--llama-bench takes NAME=PATH, got '{spec}'")
        a.benches[name] = R.check_llama_bench(path)


def points(a) -> list[dict]:
    return [{"model": name} | ({"depth": a.depth} if a.depth else {}) | ({"kv": a.cache_type} if a.cache_type else {})
            for name in a.paths]


def _prompt(a, p: str) -> tuple[int, ...]:
    """The ids decoding starts after: --depth tokens of text, or the chat prompt."""
    return text_ids(p, a.threads, a.depth) if a.depth else chat_ids(p, a.threads)


def _guild(a, mode: str) -> Runner:
    def measure(pt):
        p = a.paths[pt["model"]]
        m, kv = loaded(p, a.threads, mode).model, a.kv
        dec, _, toks = R.guild_decode(m, _prompt(a, p), a.tokens, kv)
        _, pre, _ = R.guild_decode(m, text_ids(p, a.threads, a.prefill), 2, kv)
        ttft = R.guild_ttft(m, chat_ids(p, a.threads), kv)
        return Run({"decode_tok_s": dec, "prefill_tok_s": pre, "ttft_ms": ttft}, toks)

    def warm(pt):  # compile, caches, the context sizes below
        p = a.paths[pt["model"]]
        m = loaded(p, a.threads, mode).model
        R.guild_decode(m, _prompt(a, p), 4, a.kv)
        R.guild_decode(m, text_ids(p, a.threads, a.prefill), 2, a.kv)

    return Runner(f"guild {mode}" if len(a.modes) > 1 else "guild", measure, reference=mode == a.modes[0],
                  warmup=warm)


def _llama(a) -> Runner:
    opened: dict = {}

    def llm(path):
        if path not in opened:
            opened.clear()  # one model in memory at a time
            opened[path] = R.open_llama_cpp(path, n_ctx=max(a.prefill, a.depth) + a.tokens + 64, n_threads=a.threads,
                                            n_threads_batch=a.threads, n_batch=a.prefill,
                                            **R.llama_kv_args(a.cache_type))
        return opened[path]

    def measure(pt):
        p = a.paths[pt["model"]]
        ll, chat = llm(p), chat_ids(p, a.threads)
        dec, _, toks = R.llama_decode(ll, _prompt(a, p), a.tokens)
        _, pre, _ = R.llama_decode(ll, text_ids(p, a.threads, a.prefill), 2)
        return Run({"decode_tok_s": dec, "prefill_tok_s": pre, "ttft_ms": R.llama_ttft(ll, chat)}, toks)

    return Runner("llama.cpp", measure, warmup=measure)


def _bench(a, name: str, binary: str) -> Runner:
    def measure(pt):
        tests = R.llama_bench(binary, a.paths[pt["model"]], a.prefill, a.tokens, a.threads, 1,
                              R.llama_bench_kv_args(a.cache_type) + shlex.split(a.llama_bench_args))
        pp = [t for t in tests if t["n_gen"] == 0]
        tg = [t for t in tests if t["n_gen"] > 0]
        figs = {"prefill_tok_s": pp[0]["tok_s"][0]} if pp else {}
        if tg:  # the last generation test: with ik_llama.cpp's -gp, the one after a prompt
            figs["decode_tok_s"] = tg[-1]["tok_s"][0]
        return Run(figs)

    return Runner(name, measure)


def runners(a) -> list[Runner]:
    out = [_guild(a, m) for m in a.modes]
    if R.llama_cpp_wanted(a):
        out.append(_llama(a))
    return out + [_bench(a, n, p) for n, p in a.benches.items()]
