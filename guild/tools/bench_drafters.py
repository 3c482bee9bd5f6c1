"""Micro-benchmarks of the drafters' latencies (benchmarks, not tests).

Run: ``python -m guild.tools.bench_drafters``. Each ``bench_*`` function returns a dict of numbers and prints
one line per measurement; `main()` runs whichever ones exist in this module.
"""

from __future__ import annotations

import time

import numpy as np

from guild.speculative.lookup import SuffixDrafter
from guild.speculative.retrieval import RetrievalDrafter

from ..calib.draft_costs import replay as _replay


def text_like_tokens(n: int, vocab: int = 49152, seed: int = 0) -> np.ndarray:
    """Zipf-distributed tokens with repeated spans (copies of earlier stretches, a few tokens mutated)."""
    rng = np.random.default_rng(seed)
    out = np.empty(n, np.int64)
    i = 0
    while i < n:
        if i > 256 and rng.random() < 0.3:  # copy an earlier span
            length = int(rng.integers(8, 96))
            src = int(rng.integers(0, i - length)) if i > length else 0
            span = out[src : src + length].copy()
            flips = rng.random(span.size) < 0.05
            span[flips] = rng.zipf(1.2, int(flips.sum())) % vocab
        else:  # fresh text
            span = rng.zipf(1.2, int(rng.integers(16, 128))) % vocab
        m = min(span.size, n - i)
        out[i : i + m] = span[:m]
        i += m
    return out.astype(np.int32)


def _pct(xs, q):
    return float(np.percentile(np.asarray(xs), q))


def bench_lookup(n: int = 65536, steps: int = 4000, seed: int = 0) -> dict:
    """SuffixDrafter at an n-token history: append cost (amortised) and propose latency (median, p90)."""

    toks = text_like_tokens(n + 4 * n, seed=seed)
    as_list = toks.tolist()
    SuffixDrafter(max_history=64).propose(as_list[:100], 4)  # JIT / cache load outside the timings
    res: dict = {}

    # append, one token per call (the session's step), into a window that never compacts
    d = SuffixDrafter(max_history=n)
    t0 = time.perf_counter()
    for t in as_list[:n]:
        d.append(t)
    res["append_1_us"] = (time.perf_counter() - t0) / n * 1e6
    # append in chunks of 4 (a window's commit)
    d = SuffixDrafter(max_history=n)
    t0 = time.perf_counter()
    for i in range(0, n, 4):
        d.append(as_list[i : i + 4])
    res["append_4_us"] = (time.perf_counter() - t0) / n * 1e6
    # append one at a time through 4 n tokens: includes the compactions (drop half + re-index)
    d = SuffixDrafter(max_history=n)
    t0 = time.perf_counter()
    for t in as_list[n:]:
        d.append(t)
    res["append_1_compacting_us"] = (time.perf_counter() - t0) / (4 * n) * 1e6
    res["nbytes_mib"] = d.nbytes / 2**20

    # propose on a growing history list as the session does: the last `steps` windows of an n-token history
    d = SuffixDrafter(max_history=n)
    hist = as_list[: n - steps * 3]
    d.start(hist, 0)
    lat, hits, _ = _replay(d, hist, as_list, n - steps * 3, steps, seed)
    res["propose_sync_median_us"] = _pct(lat, 50) * 1e6
    res["propose_sync_p90_us"] = _pct(lat, 90) * 1e6
    res["propose_hit_rate"] = hits / len(lat)
    # propose again on an unchanged history (no sync work)
    lat = []
    for _ in range(steps):
        t0 = time.perf_counter()
        d.propose(hist, 4)
        lat.append(time.perf_counter() - t0)
    res["propose_nosync_median_us"] = _pct(lat, 50) * 1e6
    res["history_tokens"] = len(hist)
    # worst case for the backward extension: a 500-token block repeated (every candidate extends to max_match)
    rep = (toks[:500].tolist() * (n // 500 + 1))[:n]
    d = SuffixDrafter(max_history=n)
    d.start(rep, 0)
    lat = []
    for _ in range(steps):
        t0 = time.perf_counter()
        d.propose(rep, 4)
        lat.append(time.perf_counter() - t0)
    res["propose_repetitive_median_us"] = _pct(lat, 50) * 1e6
    res["propose_repetitive_match_len"] = d.last_match_len

    print(f"lookup  n={n}: append {res['append_1_us']:.2f} us/token (1 per call), "
          f"{res['append_4_us']:.2f} us/token (4 per call), {res['append_1_compacting_us']:.2f} us/token "
          f"(1 per call, with compactions over {4 * n} tokens)")
    print(f"lookup  n={n}: propose median {res['propose_sync_median_us']:.2f} us (p90 "
          f"{res['propose_sync_p90_us']:.2f}) incl. 1-4 token sync, {res['propose_nosync_median_us']:.2f} us "
          f"without; hit rate {res['propose_hit_rate']:.2f}; nbytes {res['nbytes_mib']:.2f} MiB")
    print(f"lookup  n={n}: propose on a repeated 500-token block (match length "
          f"{res['propose_repetitive_match_len']}) median {res['propose_repetitive_median_us']:.2f} us")
    return res


def bench_retrieval(n_stream: int = 65536, n_corpus: int = 262144, steps: int = 4000, seed: int = 0) -> dict:
    """RetrievalDrafter at an n_stream-token stream plus an n_corpus-token corpus: ingest and start costs,
    propose latency (median, p90) on text-like tokens whose stream partly quotes the corpus, and on a
    degenerate, highly repetitive stream (long hash chains, many candidates)."""

    rng = np.random.default_rng(seed)
    corpus = text_like_tokens(n_corpus, seed=seed + 1)
    stream = text_like_tokens(n_stream, seed=seed + 2)
    i = 0
    while i < n_stream:  # about a third of the stream quotes corpus passages (RAG-like)
        length = int(rng.integers(32, 256))
        if rng.random() < 0.33:
            src = int(rng.integers(0, n_corpus - length))
            m = min(length, n_stream - i)
            stream[i : i + m] = corpus[src : src + m]
        i += length
    warm = RetrievalDrafter()  # JIT / cache load outside the timings
    warm.ingest(corpus[:100])
    warm.start(corpus[:50].tolist(), 0)
    warm.propose(corpus[:60].tolist(), 4)
    res: dict = {}

    d = RetrievalDrafter()
    t0 = time.perf_counter()
    for s in range(0, n_corpus, 4096):  # 64 documents
        d.ingest(corpus[s : s + 4096])
    res["ingest_us_per_token"] = (time.perf_counter() - t0) / n_corpus * 1e6
    as_list = stream.tolist()
    hist = as_list[: n_stream - steps * 3]
    t0 = time.perf_counter()
    d.start(hist, 0)
    res["start_ms"] = (time.perf_counter() - t0) * 1e3

    lat, hits, drafted = _replay(d, hist, as_list, len(hist), steps, seed)
    res["propose_median_us"] = _pct(lat, 50) * 1e6
    res["propose_p90_us"] = _pct(lat, 90) * 1e6
    res["propose_p99_us"] = _pct(lat, 99) * 1e6
    res["draft_rate"] = hits / len(lat)
    res["mean_draft_len"] = drafted / max(hits, 1)
    res["stream_tokens"] = d.stream_tokens
    res["corpus_tokens"] = d.corpus_tokens
    res["nbytes_mib"] = d.nbytes / 2**20
    # the next turn: the 65,536-token stream moves into the corpus
    t0 = time.perf_counter()
    d.start(hist, len(hist))
    res["start_moving_stream_ms"] = (time.perf_counter() - t0) * 1e3

    # degenerate: a 4-symbol stream (every anchor has a long chain, candidates everywhere)
    rep = rng.integers(0, 4, n_stream + steps * 3).tolist()
    d = RetrievalDrafter()
    for s in range(0, n_corpus, 4096):
        d.ingest(corpus[s : s + 4096])
    hist = rep[:n_stream]
    d.start(hist, 0)
    lat, _, _ = _replay(d, hist, rep, n_stream, steps, seed)
    res["propose_repetitive_median_us"] = _pct(lat, 50) * 1e6
    res["propose_repetitive_p90_us"] = _pct(lat, 90) * 1e6

    print(f"retrieval stream={n_stream} corpus={n_corpus}: ingest {res['ingest_us_per_token']:.2f} us/token, "
          f"start {res['start_ms']:.1f} ms, start moving the stream {res['start_moving_stream_ms']:.1f} ms, "
          f"nbytes {res['nbytes_mib']:.2f} MiB")
    print(f"retrieval stream={n_stream} corpus={n_corpus}: propose median {res['propose_median_us']:.2f} us "
          f"(p90 {res['propose_p90_us']:.2f}, p99 {res['propose_p99_us']:.2f}) incl. 1-4 token sync; draft rate "
          f"{res['draft_rate']:.2f}, mean draft {res['mean_draft_len']:.2f}; repetitive stream median "
          f"{res['propose_repetitive_median_us']:.2f} us (p90 {res['propose_repetitive_p90_us']:.2f})")
    return res


def main() -> None:
    for name in ("bench_lookup", "bench_retrieval"):
        fn = globals().get(name)
        if fn is not None:
            fn()


if __name__ == "__main__":
    main()
