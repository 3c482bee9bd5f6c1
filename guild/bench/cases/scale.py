"""The 128-expert top-8 upcycle at scale (smollm2-135m-moe128, 6.4 GB, built into the cache on first use): load
time and resident memory of a first and a second load, prefill and decode, V(T), beside llama.cpp on the file.

Each measurement runs in a fresh child process, so that the memory it adds (rss_added_mb) is its own. Runners:
"guild first load" (its repack cache removed first: the load repacks and writes it), "guild second load" (from
that cache), "guild" (the loaded model, its cache read into the page cache first: prefill and decode tok/s of
--tokens greedy tokens after a chat prompt; V(T) and distinct experts per layer at a ~600-token context) and
"llama.cpp" (load, prefill and decode through llama-cpp-python when importable; its tokens compared with guild's).

    python -m guild.bench scale [--model smollm2-135m-moe128] -t 2 [-n 64]
"""

from __future__ import annotations

import os
import textwrap
import time
from pathlib import Path

from ...errors import BadFlagError, GuildError
from ...formats.gguf import GGUFFile
from ...formats.repack_cache import cache_path, load_cached, prefetch
from ...load import load
from ...models import load_model
from ...text.tokenizer import Tokenizer
from ...upcycle import TAG_MOE128, resolve_model
from .. import runners as R
from ..harness import Run, Runner

CHILD = True
ROUNDS = 1
BASELINE = "llama.cpp"
PROMPT = "Write a short story about a robot who learns to paint."


def add_args(ap) -> None:
    ap.add_argument("--model", default=TAG_MOE128, help="a tag or GGUF path (default: %(default)s)")
    ap.add_argument("-n", "--tokens", type=int, default=64, help="greedy tokens decoded (default: %(default)s)")
    ap.add_argument("--repeats", type=int, default=7, help="V(T) windows per T (default: %(default)s)")
    ap.add_argument("--no-llama", action="store_true", help="no llama-cpp-python runner")


def check(a) -> None:
    if a.tokens < 2 or a.repeats < 1:
        raise BadFlagError("--tokens must be >= 2 and --repeats >= 1")
    if a.model.endswith(".gguf") and not os.path.isfile(a.model):
        raise BadFlagError(f"--model: {a.model}: no such file")
    a.path = str(resolve_model(a.model))  # a tag is built here, before any child is timed


def points(a) -> list[dict]:
    return [{"model": Path(a.path).name}]


def chat_ids(tok) -> list[int]:
    return tok.encode(tok.apply_chat_template([{"role": "user", "content": PROMPT}]), add_special=True)


def _load(a, first: bool) -> Run:
    g = GGUFFile(a.path)
    if first:
        cache_path(g.identity_digest()).unlink(missing_ok=True)
    t0 = time.perf_counter()
    _, how = load_cached(g, load_model)
    Tokenizer.from_metadata(g.metadata)
    if how != ("built" if first else "cache"):  # the figure would be another load's
        raise GuildError(f"the {'first' if first else 'second'} load found the repack cache {how}")
    return Run({"load_s": time.perf_counter() - t0})


def _guild(a) -> Run:
    lm = load(a.path, threads=a.threads, progress=False)
    prefetch(cache_path(lm.gguf.identity_digest()), wait=True)  # the weights in the page cache, not timed
    ids = chat_ids(lm.tokenizer)
    R.guild_decode(lm.model, ids[:8], 4)  # warm-up: compilation and caches
    dec, pre, toks = R.guild_decode(lm.model, ids, a.tokens)
    text = lm.tokenizer.encode(Path(textwrap.__file__).read_text()[:2200])  # ~600 tokens of real text
    vt, distinct = R.guild_windows(lm.model, text, repeats=a.repeats)
    return Run({"decode_tok_s": dec, "prefill_tok_s": pre, "window_ms": vt,
                "window_ratio": {T: v / vt[1] for T, v in vt.items()}, "distinct_experts": distinct}, toks)


def _llama(a) -> Run:
    ids = chat_ids(Tokenizer.from_gguf(a.path))
    t0 = time.perf_counter()
    llm = R.open_llama_cpp(a.path, n_ctx=len(ids) + a.tokens + 8, n_threads=a.threads, n_threads_batch=a.threads,
                           n_batch=512)
    load_s = time.perf_counter() - t0
    dec, pre, toks = R.llama_decode(llm, ids, a.tokens)
    return Run({"load_s": load_s, "decode_tok_s": dec, "prefill_tok_s": pre}, toks)


def runners(a) -> list[Runner]:
    out = [Runner(f"guild {n} load", lambda pt, first=n == "first": _load(a, first)) for n in ("first", "second")]
    out.append(Runner("guild", lambda pt: _guild(a), reference=True))
    if R.llama_cpp_wanted(a):
        out.append(Runner("llama.cpp", lambda pt: _llama(a)))
    return out


def notes(records, a) -> list[str]:
    size = os.path.getsize(a.path) / 2**20
    return [f"\nfile {size / 1024:.2f} GiB; resident memory added / file size: "
            + ", ".join(f"{r.runner} {r.median('rss_added_mb') / size:.2f}×" for r in records if "rss_added_mb" in
                        r.figures)]
