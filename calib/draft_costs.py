"""Pass 4 of `guild optimize`: the drafting costs, measured with the real model.

- V(T), T = 1..8: one verification window (forward, greedy accept rule, KV commit) at the target context.
  The context is filled with real calibration text up to `fill_cap` tokens; the KV rows beyond are copies of
  those rows (attention costs the same whatever the keys hold), so a 32k-token target costs seconds, not
  minutes. Window tokens are real consecutive text, so the routing is real. States other than a plain KV
  cache (hybrid recurrent models) are measured at the filled length; `context` records what was measured.
- the CPU-expert share of V(T): the time inside the routed experts (kernels/cpu/moe) in those windows, from the
  host's KernelClock (guild.engine.timing times the windows).
- U(T)/U(1): the union of routed experts per layer over the window's T rows (ForwardResult.distinct_experts), mean.
- propose latency of every registered drafter that needs no MTP head (lookup, retrieval): replayed over
  `context` tokens of history as a session calls it.
- KV commit: committing a rejected 8-row window (the rows are cleared).
- noise: the coefficient of variation of the window times.
- MTP (when the model has a head, guild/models/mtp.py): one draft step (a head row with its LM head), the
  propose cost of the drafters that need the head, and one catch-up row (a committed row through the head's
  block, no LM head) for those that follow rows, with the head's cache at the context. Absent without a head.
"""

from __future__ import annotations

import json
import statistics
import textwrap
import time
from pathlib import Path

import numpy as np

from ..engine.sampling import GREEDY
from ..engine.state import DeviceKVCache, KVCache
from ..engine.timing import time_windows
from ..engine.verify import Verifier
from ..kvtypes import F32_KV, KVTypes
from ..plans.plan import MAX_T, DraftCalibration
from ..speculative.build import make_drafter
from ..speculative.registry import DRAFTERS
from ..workloads import default_root
from .timing import median


def calibration_text() -> str:
    """Real text shipped with guild (the workloads' documents: prose, code, JSON), else Python's own sources."""
    root = default_root() / "texts"
    files = sorted(root.glob("*.txt")) if root.is_dir() else []
    if not files:

        files = [Path(textwrap.__file__), Path(json.__file__)]
    return "\n\n".join(f.read_text(errors="replace").strip() for f in files)


def calibration_tokens(tokenizer, n: int) -> list[int]:
    """At least n tokens of calibration text (repeated if it is shorter)."""
    toks = tokenizer.encode(calibration_text(), add_special=True)
    base = toks[1:] if len(toks) > 1 else toks
    while len(toks) < n:
        toks += base
    return toks


def _cv(xs) -> float:
    m = statistics.fmean(xs)
    return statistics.pstdev(xs) / m if len(xs) > 1 and m > 0 else 0.0


def replay(drafter, hist, src_list, src, steps, seed):
    """Propose as a session does: before each call append the 1-4 tokens the previous window committed.
    Returns (latencies in s, calls that drafted, tokens drafted)."""
    lat, hits, drafted = [], 0, 0
    r = np.random.default_rng(seed)
    while len(lat) < steps and src < len(src_list):
        step = int(r.integers(1, 5))
        hist.extend(src_list[src : src + step])
        src += step
        t0 = time.perf_counter()
        p = drafter.propose(hist, 4)
        lat.append(time.perf_counter() - t0)
        hits += p.size > 0
        drafted += p.size
    return lat, hits, drafted


def drafter_latency_ms(tokens: list[int], context: int, steps: int) -> dict[str, float]:
    """Median propose latency (ms) of each registered drafter that needs no MTP head, over `context` tokens of
    history, as a session calls them (1-4 committed tokens appended before each call); those that use a corpus
    have the text as one."""
    need = context + 5 * steps + 8
    stream = (tokens * (need // len(tokens) + 1))[:need]
    out = {}
    for name, cls in DRAFTERS.items():
        if cls.needs_head:
            continue
        d = make_drafter(name)
        if cls.uses_corpus:
            d.ingest(tokens[: min(len(tokens), 65536)])
        hist = list(stream[:context])
        d.start(hist, 0)
        d.propose(hist, 4)  # indexes the history (and compiles), outside the timings
        lat, _, _ = replay(d, hist, stream, context, steps, 0)
        out[name] = median(lat) * 1e3
    return out


def calibrate_draft_costs(model, tokenizer, *, context: int, prefill_batch: int = 512, repeats: int = 9,
                          fill_cap: int = 1024, draft_steps: int = 400, mtp_note: str = "",
                          mtp_head=None, kv: KVTypes = F32_KV) -> DraftCalibration:
    """Pass 4 on a loaded model (see the module docstring), its KV cache in the types `kv`."""
    state = model.new_state(context + MAX_T + 1, kv)
    ctx = max(1, min(context, state.n_ctx - MAX_T - 1))
    copies = isinstance(state, KVCache | DeviceKVCache)
    fill = min(fill_cap, ctx)
    if not copies:  # other states (recurrent layers) cannot be extended by copies: measured at what was filled
        ctx = fill
    toks = calibration_tokens(tokenizer, fill + 2 * MAX_T * (repeats + 1) + MAX_T)
    t0 = time.perf_counter()
    rows = []
    for s in range(0, fill, prefill_batch):
        chunk = np.asarray(toks[s : min(s + prefill_batch, fill)], np.int64)
        out = model.forward_batch([(chunk, state)], last_only=True)[0]
        state.commit(chunk.size)
        rows.append(out.hidden)
    prefill_tok_s = fill / (time.perf_counter() - t0)
    if copies and ctx > fill:
        state.fill_copies(ctx)
    mtp = _mtp_costs(mtp_head, np.concatenate(rows), toks, fill, ctx, repeats) if mtp_head is not None else None
    history = (toks * (ctx // len(toks) + 1))[:ctx]  # what the accept rule copies per window, as in a session
    verifier = Verifier(GREEDY)
    moe = model.args.is_moe
    pos0 = state.pos
    Ts = range(1, MAX_T + 1)

    def window(r: int, T: int) -> list[int]:
        o = fill + (r * MAX_T + T) * 2  # real consecutive text after the fill, a new place each time
        return toks[o : o + T]

    def accept(out, window, T):  # the verifier's accept rule, inside each window's time as in a session
        verifier.verify(out.logits, window, history, pos0, T)

    times = time_windows(model, state, window, Ts, repeats, rotate=True, after=accept, clock=True)
    v_ms = {T: times.window_ms(T) for T in Ts}
    e_ms = {T: times.kernel("experts", T) for T in Ts}
    distinct = times.distinct
    commit_ms = times.commit_ms[MAX_T]
    draft_ms = {name: round(ms, 5) for name, ms in drafter_latency_ms(toks, ctx, draft_steps).items()}
    catchup_ms = {}
    if mtp is not None:
        for name, cls in DRAFTERS.items():
            if cls.needs_head:
                draft_ms[name] = round(mtp[0], 4)
                if cls.follows_rows:
                    catchup_ms[name] = round(mtp[1], 4)
    verify = tuple(round(median(v_ms[T]), 4) for T in range(1, MAX_T + 1))
    experts = tuple(round(median(e_ms[T]), 4) for T in range(1, MAX_T + 1)) if moe else None
    if experts is not None and not any(experts):  # this model's MoE does not go through kernels/cpu/moe
        experts = None
    u = tuple(round(statistics.fmean(distinct[T]), 4) for T in range(1, MAX_T + 1)) if moe else None
    return DraftCalibration(
        context=ctx, filled_tokens=fill, repeats=repeats, verify_window_ms=verify,
        verify_cpu_expert_ms=experts,
        distinct_experts=u, distinct_expert_ratio=tuple(round(x / u[0], 4) for x in u) if moe else None,
        draft_ms=draft_ms, kv_commit_ms=round(median(commit_ms), 5),
        noise_cv=round(median([_cv(v_ms[T]) for T in range(1, MAX_T + 1)]), 4),
        prefill_tok_s=round(prefill_tok_s, 2), catchup_ms=catchup_ms, mtp_note=mtp_note,
    )


def _mtp_costs(head, hidden: np.ndarray, toks: list[int], fill: int, ctx: int, repeats: int) -> tuple[float, float]:
    """(draft step ms, catch-up ms per row) of an MTP head whose cache holds `ctx` rows (the `fill` real ones
    run through the head, the rest copies)."""
    cache = head.new_cache(ctx + 2)
    h = head.base_hidden(hidden[:fill])
    head.forward(np.asarray(toks[1 : fill + 1], np.int64), h, cache, 0)
    cache.commit(fill)
    if ctx > fill:
        cache.fill_copies(ctx)
    step, row = [], []
    for r in range(repeats + 1):
        tok = [toks[fill + 1 + r]]
        t0 = time.perf_counter()
        head.forward(tok, h[r : r + 1], cache, 1)
        cache.commit(0)
        t1 = time.perf_counter()
        head.forward(tok, h[r : r + 1], cache, 0)
        cache.commit(0)
        t2 = time.perf_counter()
        if r:  # the first pair compiles and warms
            step.append((t1 - t0) * 1e3)
            row.append((t2 - t1) * 1e3)
    return median(step), median(row)
