"""A MoE whose experts are read from disk through the expert cache (guild.engine.experts), measured: the disk's
speed at the reads a cache miss makes, and a decode from an emptied cache with the figures of where its time went
(the cache's counters, the process's clock, CPU time and faults, and a memory cap's reclaim counters)."""

from __future__ import annotations

import mmap
import random
import resource
import shutil
import threading
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from ..engine.experts import IO_THREADS
from ..errors import GuildError
from ..formats.gguf import GGUFFile
from ..formats.repack_cache import cache_path, load_cached
from ..kernels.cpu import quant
from ..models import load_model
from ..speculative.options import DraftOptions
from ..upcycle import TAG_MOE128, moe_cache_path, resolve_model
from .memcap import cap_stat, drop_pages

READ_PROBE_BYTES = 512 << 20  # bytes the read-speed probe reads (at most)
MOE128_DISK = 2 * (7 << 30)  # the 128-expert upcycle's GGUF and its repack cache


def streamed_model(model: str | None, build: bool) -> tuple[str, Path, int]:
    """(the GGUF, its repack cache, the experts' bytes in it) of `model`, by default the 128-expert upcycle (the
    free disk checked before it is built); with `build`, the model and its repack cache built now, untimed."""
    where = moe_cache_path(TAG_MOE128)
    if model is None and build and not where.is_file():
        where.parent.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(where.parent).free
        if free < MOE128_DISK:
            raise GuildError(f"{where.parent}: {free / 1e9:.1f} GB free, the 128-expert model and its repack cache "
                             f"need {MOE128_DISK / 1e9:.0f} GB")
    path = str(resolve_model(model or TAG_MOE128, progress=build))
    g = GGUFFile(path)
    rpk = cache_path(g.identity_digest(), quant.current_numerics())
    if build or not rpk.is_file():  # a child started alone (not by the run that built it) builds it too
        load_cached(g, load_model, read_ahead=False)
    experts = sum(t.data.nbytes for n, t in g.tensors.items() if "_exps" in n)  # as many bytes repacked
    return path, rpk, experts


def read_speed(cache) -> float:
    """Bytes per second reading whole experts at random, IO_THREADS reads in flight, as the expert cache's misses
    do (its own read: O_DIRECT where it has it, else through the page cache, dropped after)."""
    kinds = [(kind, e) for L in cache.layers.values() for kind in (L.gu, L.down) for e in range(kind.file_off.size)]
    random.Random(0).shuffle(kinds)
    todo, total = [], 0
    for kind, e in kinds:
        if total >= READ_PROBE_BYTES:
            break
        todo.append((kind, e))
        total += kind.span
    lock = threading.Lock()
    got = [0]

    def worker():
        buf = np.frombuffer(mmap.mmap(-1, cache.slot_bytes), np.uint8)  # page-aligned, as a slot is
        while True:
            with lock:
                if not todo:
                    return
                kind, e = todo.pop()
            n = cache.read_kind(kind, e, buf)
            with lock:
                got[0] += n

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(IO_THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return got[0] / (time.perf_counter() - t0)


def _counters(cache, cap: Path | None) -> dict:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return {**cache.stats.__dict__, "wall_s": time.perf_counter(), "cpu_s": ru.ru_utime + ru.ru_stime,
            "sys_s": ru.ru_stime, "major_faults": ru.ru_majflt, "minor_faults": ru.ru_minflt,
            **({} if cap is None else {"cap_" + k: v for k, v in cap_stat(cap).items()})}


def cold_decode(lm, ids: list, n: int, strategy: str, max_draft: int, cap: Path | None = None) -> tuple[dict, list]:
    """N greedy tokens with `strategy` from an emptied expert cache: (figures over the decode, after the prompt's
    prefill; the tokens). Figures: decode tok/s, hit rate, MB read per token, tokens per window and the drafts'
    acceptance, ms per token by cause, events per token (reads, those the window waited for, faults, ...), the
    mean reads in flight."""
    cache = lm.model.expert_cache
    cache.clear()  # a cold start: no run inherits the experts another one read
    drop_pages(cache.path)
    n_ctx = len(ids) + n + 16
    drafter = None if strategy == "normal" else lm.drafter(replace(DraftOptions(), strategy=strategy), n_ctx)
    marks = []

    def on_token(_):
        if not marks:
            marks.append(_counters(cache, cap))

    toks, st = lm.session(n_ctx).generate(ids, n, on_token, drafter=drafter, max_draft=max_draft if drafter else 0)
    end = _counters(cache, cap)
    d = {k: end[k] - v for k, v in marks[0].items()}
    steps = max(1, len(toks) - 1)
    lookups, s = d["hits"] + d["misses"], st.summary()
    ms = {k: 1e3 * d[c] / steps for k, c in (("token", "wall_s"), ("waiting", "wait_s"), ("pregating", "predict_s"),
                                             ("cpu", "cpu_s"), ("system", "sys_s"), ("preadv", "read_s"),
                                             ("fadvise", "drop_s"))}
    ms["rest"] = ms["token"] - ms["waiting"] - ms["pregating"]
    events = {"reads": d["reads"], "window_reads": d["sync_reads"], "misses": d["misses"],
              "prefetched": d["prefetched"], "prefetch_used": d["prefetch_used"], "evictions": d["evictions"],
              **{k: d[k] for k in d if "fault" in k or k.startswith("cap_")}}
    figs = {"decode_tok_s": st.decode_tok_s, "mb_per_token": d["bytes_read"] / steps / 1e6,
            "tokens_per_window": s["tokens_per_window"], "token_ms": ms,
            "events_per_token": {k: v / steps for k, v in events.items()}}
    if lookups:
        figs["hit_rate"] = d["hits"] / lookups
    if s["drafted"]:
        figs["acceptance"] = s["accepted"] / s["drafted"]
    if d["reads"]:
        figs["reads_in_flight"] = d["depth_sum"] / d["reads"]
    return figs, [int(t) for t in toks]


def time_per_token(r) -> str:
    """Where a cold_decode record's token went: its ms by cause and its reads, the medians over its runs."""
    ms, ev = ({k: v["median"] for k, v in r.figures[f]["series"].items()} for f in ("token_ms", "events_per_token"))
    depth = (f", {r.median('reads_in_flight'):.1f} in flight, {ms['preadv'] / ev['reads']:.1f} ms each"
             if ev["reads"] else "")
    return (f"{ms['token']:.0f} ms/token = waiting on reads {ms['waiting']:.0f} ({ev['window_reads']:.1f} read by "
            f"the window, of {ev['reads']:.1f}/token{depth}) + pre-gating {ms['pregating']:.0f} + the rest "
            f"{ms['rest']:.0f}; CPU {ms['cpu']:.0f} ms/token (system {ms['system']:.0f}), I/O threads in preadv "
            f"{ms['preadv']:.0f} and fadvise {ms['fadvise']:.0f} ms/token; major faults {ev['major_faults']:.1f}/token")
