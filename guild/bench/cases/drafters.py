"""The drafters' own costs, no model: lookup's append and propose at a --tokens history, retrieval's ingest of a
--corpus, its start and propose over a --tokens stream of which about a third quotes the corpus; each also on a
degenerate, repetitive stream (long matches, many candidates: the worst case). Tokens are text-like (Zipf, with
copies of earlier spans); propose is timed as a session calls it, 1-4 committed tokens appended before each call.

    python -m guild.bench drafters --tokens 65536 --corpus 262144 --steps 4000 -r 3
"""

from __future__ import annotations

import statistics
import time
from functools import cache

import numpy as np

from ...calib.draft_costs import replay
from ...errors import BadFlagError
from ...speculative.lookup import SuffixDrafter
from ...speculative.retrieval import RetrievalDrafter
from ..harness import Run, Runner

THREADS = 1
OPS = {"lookup": ("append 1/call", "append 4/call", "append compacting", "propose", "propose unchanged",
                  "propose repetitive"),
       "retrieval": ("ingest", "start", "start moving the stream", "propose", "propose repetitive")}


def add_args(ap) -> None:
    ap.add_argument("--drafters", default=",".join(OPS), help="a subset of %(default)s")
    ap.add_argument("--tokens", type=int, default=65536, help="lookup's history, retrieval's stream")
    ap.add_argument("--corpus", type=int, default=262144, help="retrieval's corpus tokens (default: %(default)s)")
    ap.add_argument("--steps", type=int, default=4000, help="propose calls timed per run (default: %(default)s)")


def check(a) -> None:
    a.drafter_list = a.drafters.split(",")
    if not set(a.drafter_list) <= set(OPS):
        raise BadFlagError(f"--drafters must name some of {', '.join(OPS)}, got '{a.drafters}'")
    if a.steps < 1 or a.tokens < max(1024, 4 * a.steps) or a.corpus < 4096:
        raise BadFlagError("--steps must be >= 1, --tokens >= 1024 and 4 x --steps, --corpus >= 4096")


def points(a) -> list[dict]:
    return [{"drafter": d, "op": op} for d in a.drafter_list for op in OPS[d]]


@cache
def text_like(n: int, seed: int, vocab: int = 49152) -> tuple[int, ...]:
    """Zipf-distributed tokens with repeated spans (copies of earlier stretches, a few tokens mutated)."""
    rng = np.random.default_rng(seed)
    out, i = np.empty(n, np.int64), 0
    while i < n:
        if i > 256 and rng.random() < 0.3:  # copy an earlier span
            length = int(rng.integers(8, 96))
            src = int(rng.integers(0, i - length)) if i > length else 0
            span = out[src: src + length].copy()
            flips = rng.random(span.size) < 0.05
            span[flips] = rng.zipf(1.2, int(flips.sum())) % vocab
        else:  # fresh text
            span = rng.zipf(1.2, int(rng.integers(16, 128))) % vocab
        m = min(span.size, n - i)
        out[i: i + m], i = span[:m], i + m
    return tuple(out.tolist())


def _timed(f, *args) -> float:
    t0 = time.perf_counter()
    f(*args)
    return (time.perf_counter() - t0) * 1e3


def _lookup(a, op: str) -> Run:
    n, toks = a.tokens, list(text_like(5 * a.tokens, 0))
    d = SuffixDrafter(max_history=n)
    if op.startswith("append"):  # ms per token; compacting: through 4 n tokens, the window halved as it fills
        src, step = (toks[n:], 1) if op == "append compacting" else (toks[:n], 4 if "4" in op else 1)
        calls = [src[i] if step == 1 else src[i: i + step] for i in range(0, len(src), step)]
        return Run({"latency_ms": _timed(lambda: [d.append(c) for c in calls]) / len(src)})
    hist = (toks[:500] * (n // 500 + 1))[:n] if op == "propose repetitive" else toks[: n - 3 * a.steps]
    d.start(hist, 0)
    if op == "propose":
        lat, hits, _ = replay(d, hist, toks, len(hist), a.steps, 0)
        return Run({"latency_ms": statistics.median(lat) * 1e3, "draft_rate": hits / len(lat)})
    return Run({"latency_ms": statistics.median(_timed(d.propose, hist, 4) for _ in range(a.steps))})


def _retrieval(a, op: str) -> Run:
    n, corpus, stream = a.tokens, np.asarray(text_like(a.corpus, 1), np.int32), list(text_like(a.tokens, 2))
    rng = np.random.default_rng(0)
    for i in range(0, n, 256):  # about a third of the stream quotes corpus passages (RAG-like)
        if rng.random() < 0.33:
            src = int(rng.integers(0, a.corpus - 256))
            stream[i: i + 256] = corpus[src: src + min(256, n - i)].tolist()
    d = RetrievalDrafter()
    ms = _timed(lambda: [d.ingest(corpus[s: s + 4096]) for s in range(0, a.corpus, 4096)])  # 4096-token documents
    if op == "ingest":
        return Run({"latency_ms": ms / a.corpus})
    if op == "propose repetitive":  # a 4-symbol stream: every anchor has a long chain
        stream = rng.integers(0, 4, n + 3 * a.steps).tolist()
    hist = stream[: n - 3 * a.steps] if op != "propose repetitive" else stream[:n]
    ms = _timed(d.start, hist, 0)
    if op == "start":
        return Run({"latency_ms": ms})
    if op == "start moving the stream":  # the next turn: the stream moves into the corpus
        return Run({"latency_ms": _timed(d.start, hist, len(hist))})
    lat, hits, _ = replay(d, hist, stream, len(hist), a.steps, 0)
    return Run({"latency_ms": statistics.median(lat) * 1e3, "draft_rate": hits / len(lat)})


def runners(a) -> list[Runner]:
    def measure(pt):
        return (_lookup if pt["drafter"] == "lookup" else _retrieval)(a, pt["op"])

    return [Runner("guild", measure, warmup=measure)]  # a first, unmeasured run: JIT and cache loads, allocations
