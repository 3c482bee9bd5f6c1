"""The engines a case measures, each one way: guild in this process (a loaded model; a workload under a
strategy), llama.cpp through llama-cpp-python, and any llama.cpp-family `llama-bench` binary given by path
(mainline or ik_llama.cpp).

Each returns plain numbers (tok/s, ms) and the tokens it generated; cases turn them into Runs."""

from __future__ import annotations

import importlib.util
import json
import shutil
import statistics
import subprocess
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..engine.session import GuildSession
from ..engine.timing import time_windows
from ..errors import BadFlagError, GuildError
from ..kvtypes import F32_KV, KVTypes
from ..load import slots
from ..text.chat import run_turn
from .harness import ParityError

MAX_T = 8


def median_seconds(fn, budget: float, min_reps: int = 5, max_reps: int = 2000) -> float:
    """Median seconds of fn() over as many calls as fit `budget` (min_reps..max_reps of them), after a warm-up one."""
    fn()
    t0 = time.perf_counter()
    fn()
    reps = int(min(max(min_reps, budget / max(time.perf_counter() - t0, 1e-7)), max_reps))
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


# -- guild ------------------------------------------------------------------------------------------------------
def guild_decode(model, ids: Sequence[int], n: int, kv: KVTypes = F32_KV) -> tuple[float, float, list[int]]:
    """(decode tok/s, prefill tok/s, tokens) of one greedy reply of n tokens to ids, on a fresh session whose KV
    cache stores kv."""
    toks, st = GuildSession(model, n_ctx=len(ids) + n + 8, kv=kv).generate(list(ids), n)
    return st.decode_tok_s, st.prefill_tok_s, [int(t) for t in toks]


def guild_ttft(model, ids: Sequence[int], kv: KVTypes = F32_KV) -> float:
    """ms from a fresh session to the first token of ids' reply (the prefill and one sample)."""
    t0 = time.perf_counter()
    GuildSession(model, n_ctx=len(ids) + 8, kv=kv).generate(list(ids), 1)
    return (time.perf_counter() - t0) * 1e3


def guild_windows(model, ids: Sequence[int], repeats: int = 7, max_T: int = MAX_T, text=None) -> tuple[dict, dict]:
    """Median ms of one verification window of T rows at ids' context and the mean distinct experts per MoE layer,
    T = 1..max_T. Every round runs each T in turn (after one unmeasured round), so a slow spell hits all T alike;
    windows are random tokens, or cut from `text` (real text routes to fewer distinct experts)."""
    s = GuildSession(model, n_ctx=len(ids) + max_T + 16)
    s.prefill(list(ids))
    rng = np.random.default_rng(0)
    vocab = model.args.vocab_size

    def window(r: int, T: int):
        if text is not None and len(text) > T:
            j = (7 * r) % (len(text) - T)
            return np.asarray(text[j: j + T], np.int64)
        return rng.integers(min(100, vocab // 2), min(20000, vocab), T)

    Ts = range(1, max_T + 1)
    t = time_windows(model, s.state, window, Ts, repeats, warmup=1)
    return ({T: statistics.median(t.forward_ms[T]) for T in Ts},
            {T: float(np.mean(t.distinct[T])) for T in Ts})


@dataclass
class WorkloadRun:
    tokens: list[int] = field(default_factory=list)  # every turn's reply, one after the other
    generated: int = 0  # tokens the windows emitted (each turn's first comes from its prefill)
    decode_s: float = 0.0
    drafted: int = 0
    accepted: int = 0
    windows: Counter = field(default_factory=Counter)  # by the strategy that drafted them
    accepted_by: Counter = field(default_factory=Counter)  # accepted drafts, by the strategy that drafted them
    sizes: list[int] = field(default_factory=list)  # T of every window
    emitted: list[int] = field(default_factory=list)  # tokens every window emitted
    experts: list[float] = field(default_factory=list)  # per window: its distinct experts, the mean over layers
    rounds_ms: list[float] = field(default_factory=list)  # concurrent sessions: each batched round's wall time

    @property
    def tok_s(self) -> float:
        return self.generated / self.decode_s if self.decode_s else 0.0


def guild_workload(lm, w, opts) -> WorkloadRun:
    """One workload (guild.workloads, all its turns) on fresh sessions under opts' strategy, the workload's
    documents as the drafter's corpus and its grammar, if any, on every reply; with opts.sessions > 1 that many
    copies run concurrently (one batched forward per round) and must agree token for token."""
    ss = slots(lm, opts, opts.sessions, corpus_texts=w.corpus_texts())
    g = w.grammar(lm.tokenizer)
    for s in ss if g is not None else ():
        s.grammar = g
    out = WorkloadRun()
    for text in w.render_turns():
        turns, cs = run_turn(ss, text, chat=w.chat, max_tokens=opts.max_tokens, max_draft=opts.max_draft)
        if cs is None:
            out.decode_s += turns[0].stats.decode_s
            out.generated += max(turns[0].stats.generated_tokens - 1, 0)
        else:
            out.rounds_ms += cs.rounds_ms
            out.decode_s += cs.decode_s
            out.generated += cs.generated_tokens
        for i, t in enumerate(turns[1:], 1):
            if t.tokens != turns[0].tokens:
                raise ParityError(f"parity failure: {w.key} {opts.strategy}: concurrent session {i} differs from "
                                  "session 0")
        out.tokens += [int(x) for x in turns[0].tokens]
        for r in (r for t in turns for r in t.stats.windows):
            out.drafted, out.accepted = out.drafted + r.k, out.accepted + r.emitted - 1
            out.windows[r.strategy] += 1
            out.accepted_by[r.strategy] += r.emitted - 1
            out.sizes.append(r.k + 1)
            out.emitted.append(r.emitted)
            if r.distinct_experts:
                out.experts.append(sum(r.distinct_experts) / len(r.distinct_experts))
    return out


# -- llama.cpp through llama-cpp-python --------------------------------------------------------------------------
NO_LLAMA_CPP = "llama-cpp-python is not installed: guild alone (make setup-oracle installs it)"


def llama_cpp_wanted(a) -> bool:
    """Whether a case runs llama.cpp: asked for and importable; where asked for and missing, a notice says so."""
    if getattr(a, "no_llama", False):
        return False
    if importlib.util.find_spec("llama_cpp") is None:
        a.notices.append(NO_LLAMA_CPP)
        return False
    return True


def open_llama_cpp(path, **kwargs):
    """A llama_cpp.Llama with ggml's "extra" buffer types off: on AMX-capable CPUs llama-cpp-python 0.3.36 places
    Q4/Q8 weights in the AMX buffer, whose matmul segfaults here; the plain CPU kernels run instead.
    ImportError without llama-cpp-python."""
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


# llama.cpp's names for the KV cache types (ggml_type ids for llama-cpp-python; llama-bench -ctk/-ctv take the names)
GGML_KV_TYPES = {"f32": 0, "f16": 1, "q8_0": 8}


def llama_kv_args(cache_type: str | None) -> dict:
    """llama_cpp.Llama keywords for a KV cache of cache_type (a quantised V cache needs flash attention); {} for
    llama.cpp's default (f16)."""
    if cache_type is None:
        return {}
    t = GGML_KV_TYPES[cache_type]
    return {"type_k": t, "type_v": t} | ({"flash_attn": True} if cache_type == "q8_0" else {})


def llama_bench_kv_args(cache_type: str | None) -> list[str]:
    """The same for a llama-bench command line."""
    if cache_type is None:
        return []
    return ["-ctk", cache_type, "-ctv", cache_type] + (["-fa", "1"] if cache_type == "q8_0" else [])


def llama_decode(llm, ids: Sequence[int], n: int, stop_eos: bool = False) -> tuple[float, float, list[int]]:
    """(decode tok/s, prefill tok/s, tokens) of llama.cpp's greedy reply of up to n tokens (fewer at its end of
    sequence with stop_eos), its prompt cache cleared first."""
    llm.reset()
    toks: list[int] = []
    t0, t1 = time.perf_counter(), None
    for tok in llm.generate(list(ids), temp=0.0, top_k=1, reset=True):
        t1 = t1 or time.perf_counter()
        toks.append(int(tok))
        if len(toks) == n or (stop_eos and tok == llm.token_eos()):
            break
    t2 = time.perf_counter()
    return ((len(toks) - 1) / (t2 - t1) if len(toks) > 1 else 0.0), len(ids) / (t1 - t0), toks


def llama_ttft(llm, ids: Sequence[int]) -> float:
    llm.reset()
    t0 = time.perf_counter()
    for _ in llm.generate(list(ids), temp=0.0, top_k=1, reset=True):
        break
    return (time.perf_counter() - t0) * 1e3


def llama_windows(llm, ids: Sequence[int], repeats: int, vocab: int, max_T: int = MAX_T) -> dict:
    """Median ms of one llama.cpp batch of T tokens after ids, T = 1..max_T (the cache cut back after each:
    llama-cpp-python's eval drops the cells past n_tokens)."""
    llm.reset()
    llm.eval(list(ids))
    n0 = llm.n_tokens
    rng = np.random.default_rng(0)
    res: dict[int, list[float]] = {T: [] for T in range(1, max_T + 1)}
    for r in range(repeats + 1):
        for T in res:
            win = [int(t) for t in rng.integers(100, vocab - 100, T)]
            llm.n_tokens = n0
            t0 = time.perf_counter()
            llm.eval(win)
            if r:
                res[T].append((time.perf_counter() - t0) * 1e3)
    llm.n_tokens = n0
    return {T: statistics.median(v) for T, v in res.items()}


def llama_cpp_module():
    """The `llama_cpp` module, or None without llama-cpp-python."""
    try:
        import llama_cpp
    except ImportError:
        return None
    return llama_cpp


def quantize(llama_cpp, src: Path, out: Path, ftype: str, threads: int) -> Path:
    """`src` requantised by llama.cpp into `ftype` (a LLAMA_FTYPE_MOSTLY_* name) at `out`, unless made before."""
    if out.is_file():
        return out
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{ftype}")
    params.nthread = threads
    params.allow_requantize = True  # the source may itself be quantised (the embedded model is Q4_1)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".part")
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(tmp).encode(), params)
    if rc != 0:
        raise GuildError(f"llama.cpp could not quantize to {ftype}: llama_model_quantize returned {rc}")
    tmp.replace(out)
    return out


# -- a llama-bench binary (llama.cpp or ik_llama.cpp) -------------------------------------------------------------
def check_llama_bench(binary: str) -> str:
    path = shutil.which(binary) or (binary if Path(binary).is_file() else None)
    if path is None:
        raise BadFlagError(f"--llama-bench: no such binary: {binary}")
    return path


def llama_bench(binary: str, model: str, n_prompt: int, n_gen: int, threads: int, reps: int = 1,
                extra: Sequence[str] = ()) -> list[dict]:
    """Run `llama-bench -o json` once for a prompt of n_prompt and a generation of n_gen tokens (0 for none):
    one dict per test it reports, {"n_prompt", "n_gen", "tok_s": [one per repetition]}."""
    cmd = [binary, "-m", str(model), "-p", str(n_prompt), "-n", str(n_gen), "-t", str(threads), "-r", str(reps),
           "-o", "json", *extra]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode:
        tail = (p.stderr.strip().splitlines() or [f"exit {p.returncode}"])[-1]
        raise GuildError(f"{Path(binary).name} failed: {tail}")
    try:
        tests = json.loads(p.stdout[p.stdout.index("["):])
    except ValueError:
        raise GuildError(f"{Path(binary).name}: no JSON in its output") from None
    return [{"n_prompt": int(t.get("n_prompt", 0)), "n_gen": int(t.get("n_gen", 0)),
             "tok_s": [float(x) for x in t.get("samples_ts") or [t["avg_ts"]]]} for t in tests]
