"""A MoE larger than its memory: guild reading its experts from disk through a bounded expert cache, beside llama.cpp.

The model: the 128-expert top-8 upcycle `smollm2-135m-moe128` (6.4 GB, built with its repack cache under
/tmp/guild-beyond-ram or $GUILD_CACHE_DIR on first use) or --model. Each run is a fresh child process from dropped
pages: guild, with an expert cache of --expert-cache-mem (default: 45% of the repack cache), measures the disk at
expert-sized random reads (what a miss does; the disk bound is that speed over the bytes read per token), then
decodes --tokens greedy tokens of the workload's first turn (W7: nothing to copy; W3: an extraction that quotes
its input) from an emptied cache; llama.cpp (llama-cpp-python) decodes the same prompt. Each runs in a memory
cgroup (guild.bench.memcap) of the expert cache, the model's non-expert part and RUNTIME_HEADROOM, page cache
included; where none can be made (or with --no-cap), uncapped, as the report says.

    python -m guild.bench beyond_ram [--model PATH] [--expert-cache-mem 3G] [-n 48] [-r 3] [--no-llama] [--no-cap]
"""

from __future__ import annotations

import os

from ...engine.experts import expert_cache_mem, wait_passively
from ...errors import BadFlagError
from ...load import load
from ...text.tokenizer import Tokenizer
from ...workloads import WorkloadError, load_workloads
from .. import runners as R
from ..expert_reads import cold_decode, read_speed, streamed_model, time_per_token
from ..harness import Run, Runner
from ..memcap import can_cap, cap_figures, capped
from ..record import ratio

CHILD = True
THREADS = 2
ROUNDS = 1
BASELINE = "llama.cpp"
DEFAULT_SHARE = 0.45  # the default cache: this share of the repack cache file (3 GB of the 6.4 GB model)
GEOMETRY = ("bound", "resident_bytes", "slot_bytes", "expert_bytes")  # the expert cache's, kept beside a run
RUNTIME_HEADROOM = 512 << 20  # beyond the expert cache and the model's non-expert part: interpreter, KV, buffers


def add_args(ap) -> None:
    ap.add_argument("--model", help="a GGUF path or tag (default: the 128-expert upcycle)")
    ap.add_argument("--expert-cache-mem", help="expert cache size (default: 45%% of the repack cache file)")
    ap.add_argument("-n", "--tokens", type=int, default=48, help="greedy tokens per run (default: %(default)s)")
    ap.add_argument("--strategies", default="normal,adaptive", help="guild's runners (default: %(default)s)")
    ap.add_argument("--max-draft", type=int, default=4, help="drafts per window at most (default: %(default)s)")
    ap.add_argument("--workloads", default="W7,W3", help="workloads whose first turn is the prompt")
    ap.add_argument("--no-llama", action="store_true", help="no llama.cpp runner")
    ap.add_argument("--no-cap", action="store_true", help="no memory cgroup: both engines uncapped")


def check(a) -> None:
    a.mem = None if a.expert_cache_mem is None else expert_cache_mem(a.expert_cache_mem)
    if not isinstance(a.mem, int | None):
        raise BadFlagError("--expert-cache-mem must be a size here (the point is a bound below the model)")
    a.strategy_list = [s for s in a.strategies.split(",") if s]
    if not a.strategy_list or a.tokens < 2 or a.max_draft < 0:
        raise BadFlagError("--strategies must name one or more, --tokens be >= 2 and --max-draft >= 0")
    try:
        a.prompts = {w.id: w for w in load_workloads([w for w in a.workloads.split(",") if w])}
    except WorkloadError as e:
        raise BadFlagError(f"--workloads: {e}") from None
    os.environ.setdefault("GUILD_CACHE_DIR", "/tmp/guild-beyond-ram")  # 13 GB: scratch, not the user's cache
    wait_passively()  # these processes stream: before anything starts the kernels' threads
    a.path, a.rpk, experts = streamed_model(a.model, build=not a.child)
    a.mem = a.mem or int(os.path.getsize(a.rpk) * DEFAULT_SHARE)
    a.cap = None if a.no_cap else a.mem + os.path.getsize(a.rpk) - experts + RUNTIME_HEADROOM  # both engines' size


def points(a) -> list[dict]:
    return [{"workload": w} for w in a.prompts]


def _guild(a, strategy: str) -> Runner:
    def measure(pt):
        lm = load(a.path, threads=a.threads, progress=False, expert_cache=a.mem)
        cache = lm.model.expert_cache
        with capped(a.cap, "guild", (a.path, a.rpk)) as cap:  # slots, reads and page cache charged to it
            speed = read_speed(cache)
            figs, toks = cold_decode(lm, a.prompts[pt["workload"]].prompt_ids(lm.tokenizer), a.tokens, strategy,
                                     a.max_draft, cap)
            figs.update(cap_figures(cap), gb_s=speed / 1e9)
        if figs["mb_per_token"]:
            figs["bound_tok_s"] = speed / (figs["mb_per_token"] * 1e6)
            figs["bound_share"] = figs["decode_tok_s"] / figs["bound_tok_s"]
        cache.close()
        return Run(figs, toks, {k: getattr(cache, k) for k in GEOMETRY})

    return Runner(strategy, measure, exact=strategy != "normal", reference=strategy == "normal")


def _llama(a) -> Runner:
    def measure(pt):
        with capped(a.cap, "llama", (a.path,)) as cap:  # before it loads anything
            ids = a.prompts[pt["workload"]].prompt_ids(Tokenizer.from_gguf(a.path))
            llm = R.open_llama_cpp(a.path, n_ctx=len(ids) + a.tokens + 8, n_threads=a.threads,
                                   n_threads_batch=a.threads, n_batch=512)
            dec, pre, toks = R.llama_decode(llm, ids, a.tokens)
            return Run({"decode_tok_s": dec, "prefill_tok_s": pre, **cap_figures(cap)}, toks)

    return Runner("llama.cpp", measure)


def runners(a) -> list[Runner]:
    return [_guild(a, s) for s in a.strategy_list] + ([_llama(a)] if R.llama_cpp_wanted(a) else [])


def notes(records, a) -> list[str]:
    mem = (f"each engine in its own cgroup of {a.cap / 1e9:.2f} GB, page cache included" if a.cap and can_cap()
           else "uncapped (no cgroup could be made here, or --no-cap); the expert cache bounds guild")
    out = [f"\n{os.path.basename(a.path)}: repack cache {a.rpk.stat().st_size / 1e9:.2f} GB, expert cache "
           f"{a.mem / 1e9:.2f} GB; memory: {mem}"]
    by = {(r.point["workload"], r.runner): r for r in records}
    if not any(n == "llama.cpp" for _, n in by):
        out.append("\nllama.cpp: not run (--no-llama, or `llama_cpp` is not importable here: `make setup-oracle`)")
    for (w, name), r in ((k, r) for k, r in by.items() if k[1] != "llama.cpp"):
        out.append(f"\n{w} {name}: {time_per_token(r)}")
        if (w, "llama.cpp") in by:
            out.append(f"guild {name} / llama.cpp on {w}: {ratio(r, by[(w, 'llama.cpp')], 'decode_tok_s'):.2f}×")
    return out
