"""RetrievalDrafter: REST-style voting over a session-local corpus + the current stream."""

import threading

import numpy as np
import pytest

from guild.speculative.retrieval import MAX_MATCH, RetrievalDrafter


# ------------------------------------------------------------------------------ a plain-Python reference
def _w(length, boost, rank):
    return float(length * length) * boost / (1.0 + 0.08 * rank)


def ref_propose(stream, corpus, history, k, min_conf=0.35, max_cand=16, sb=1.0, cb=0.8):
    """Brute-force twin of the kernel: returns (draft, confidence, match_len, n_candidates)."""
    query = list(history[-MAX_MATCH:])
    qn = len(query)
    cands = []  # [tier, q, match_len, continuation]
    for n in (4, 3):
        if qn < n:
            continue
        for tier, toks in ((0, stream), (1, corpus)):
            hits = 0
            for q in range(len(toks) - 2, n - 2, -1):  # newest first; q = len-1 is the suffix itself
                if hits == 8 or len(cands) == 32:
                    break
                if toks[q - n + 1 : q + 1] != query[qn - n :]:
                    continue
                if any(c[0] == tier and c[1] == q for c in cands):
                    continue
                m = n
                while m < MAX_MATCH and m < qn and q - m >= 0 and toks[q - m] == query[qn - 1 - m]:
                    m += 1
                cont = []
                for t in toks[q + 1 : q + 1 + k]:
                    if t < 0:
                        break
                    cont.append(t)
                if cont:
                    cands.append([tier, q, m, cont])
                    hits += 1
    if not cands or k <= 0:
        return [], 0.0, 0, 0
    ws = []
    for t, q, m, _ in cands:
        rank = sum(1 for c in cands if c[0] == t and c[1] > q)
        ws.append(_w(m, sb if t == 0 else cb, rank))
    order = sorted(range(len(cands)), key=lambda a: (-ws[a], cands[a][0], -cands[a][1]))
    sel = []
    for a in order:
        if len(sel) == max_cand:
            break
        if all(cands[b][3] != cands[a][3] for b in sel):
            sel.append(a)
    alive = list(sel)
    out, conf0, mlen = [], 0.0, 0
    for j in range(k):
        alive = [a for a in alive if len(cands[a][3]) > j]
        if not alive:
            break
        tally = {}
        for a in alive:
            tally[cands[a][3][j]] = tally.get(cands[a][3][j], 0.0) + ws[a]
        total = 0.0
        for a in alive:
            total += ws[a]
        best = min(tally, key=lambda t: (-tally[t], t))
        conf = tally[best] / total
        if j == 0:
            conf0 = conf
            mlen = next(cands[a][2] for a in sel if cands[a][3][0] == best)
        if conf < min_conf:
            break
        out.append(best)
        alive = [a for a in alive if cands[a][3][j] == best]
    return out, conf0, mlen, len(sel)


def _corpus_list(docs):
    out = []
    for d in docs:
        out += list(d) + [-1]
    return out


def _check(d, history, k, stream, corpus, **kw):
    got = d.propose(history, k)
    want, conf, mlen, nc = ref_propose(stream, corpus, history, k, **kw)
    assert got.dtype == np.int32 and got.tolist() == want
    assert d.last_confidence == pytest.approx(conf, rel=1e-12, abs=0)
    assert (d.last_match_len, d.last_n_candidates) == (mlen, nc)
    return got


# ------------------------------------------------------------------------------ voting
def test_longer_match_beats_several_short_ones_by_weight():
    d = RetrievalDrafter()
    history = [63, 64, 65, 66, 1, 2, 3]
    d.ingest([63, 64, 65, 66, 1, 2, 3, 100, 101])  # match 7: rank 3 among the corpus spans
    for i in range(3):  # three short matches (3 tokens), all newer, all voting 200 at step 0
        d.ingest([90 + i, 1, 2, 3, 200, 210 + i])
    d.start(history, len(history))  # empty stream: only the corpus tier
    w_long = _w(7, 0.8, 3)
    w_short = [_w(3, 0.8, r) for r in range(3)]
    assert w_long > sum(w_short)
    got = d.propose(history, 4)
    assert got.tolist() == [100, 101]
    assert d.last_confidence == pytest.approx(w_long / (w_long + sum(w_short)), rel=1e-12)
    assert d.last_match_len == 7 and d.last_n_candidates == 4

    # seven short matches outvote it (frequency wins once the weights say so)
    for i in range(3, 7):
        d.ingest([90 + i, 1, 2, 3, 200, 210 + i])
    w_long = _w(7, 0.8, 7)
    w_short = [_w(3, 0.8, r) for r in range(7)]
    assert sum(w_short) > w_long
    got = d.propose(history, 4)
    assert got.tolist() == [200]  # step 1: seven different tokens, each far below min_confidence
    assert d.last_confidence == pytest.approx(sum(w_short) / (w_long + sum(w_short)), rel=1e-12)
    assert d.last_match_len == 3 and d.last_n_candidates == 8


def test_divergent_spans_are_pruned():
    history = [61, 62, 63, 64]
    docs = [[61, 62, 63, 64, 10, 20, 13],  # C: loses step 1, would win step 2 with B if it were not pruned
            [61, 62, 63, 64, 10, 11, 13],  # B
            [60, 61, 62, 63, 64, 10, 11, 12]]  # A: longest match (but history is 4 long: match 4 too)
    d = RetrievalDrafter()
    for doc in docs:
        d.ingest(doc)
    d.start(history, len(history))
    wc, wb, wa = _w(4, 0.8, 2), _w(4, 0.8, 1), _w(4, 0.8, 0)
    assert wa + wb > wc and wb + wc > wa > wb  # 11 wins step 1; unpruned, 13 would win step 2
    assert d.propose(history, 4).tolist() == [10, 11, 12]
    assert d.last_n_candidates == 3 and d.last_confidence == 1.0


def test_identical_continuations_are_deduplicated():
    d = RetrievalDrafter()
    for _ in range(5):
        d.ingest([7, 1, 2, 3, 4, 5])
    d.ingest([8, 1, 2, 3, 9, 9])
    h = [1, 2, 3]
    d.start(h, 3)
    got = d.propose(h, 2)
    assert d.last_n_candidates == 2  # five identical continuations -> the strongest one
    assert got.tolist() == [9, 9]  # newest (rank 0) of two equal-length spans
    assert d.last_confidence == pytest.approx(_w(3, 0.8, 0) / (_w(3, 0.8, 0) + _w(3, 0.8, 1)))


def test_early_stop_at_min_confidence():
    docs = [[5, 1, 2, 3, 40, 41, 42], [6, 1, 2, 3, 40, 51, 52]]  # agree at step 0, split ~50/50 at step 1
    h = [1, 2, 3]
    for min_conf, want in ((0.6, [40]), (0.35, [40, 51, 52])):
        d = RetrievalDrafter(min_confidence=min_conf)
        for doc in docs:
            d.ingest(doc)
        d.start(h, 3)
        assert d.propose(h, 4).tolist() == want
        assert d.last_confidence == 1.0
    d = RetrievalDrafter(min_confidence=0.6)
    d.ingest([5, 1, 2, 3, 40])
    d.ingest([6, 1, 2, 3, 50])
    d.start(h, 3)
    assert d.propose(h, 4).size == 0  # step 0 already below the threshold
    assert 0.4 < d.last_confidence < 0.6 and d.last_n_candidates == 2


# ------------------------------------------------------------------------------ tiers
def test_corpus_persists_across_generations():
    d = RetrievalDrafter()
    turn1 = [1, 500, 501, 502, 2]
    hist = list(turn1)
    d.start(hist, 0)
    out1 = [300, 301, 302, 303, 304, 305, 306, 307]
    for t in out1[:5]:
        d.propose(hist, 4)
        hist.append(t)
    hist += out1[5:]  # committed after the last propose: start() still moves them into the corpus
    prompt2 = [1, 600, 302, 303, 304]
    p2 = len(hist)
    hist += prompt2
    d.start(hist, p2)
    assert d.stream_tokens == len(prompt2) and d.corpus_tokens == len(turn1) + len(out1) + 1
    assert d.propose(hist, 4).tolist() == [305, 306, 307]  # produced in turn 1, proposed in turn 2
    hist += [305, 306, 307, 1, 600, 302]
    assert d.propose(hist, 4).tolist() == [303, 304, 305, 306]  # the stream tier, now


def test_first_start_ingests_earlier_turns():
    hist = [10, 11, 12, 13, 14, 15, 2, 1, 11, 12, 13]
    d = RetrievalDrafter()
    d.start(hist, 7)
    assert d.corpus_tokens == 8 and d.stream_tokens == 4
    assert d.propose(hist, 3).tolist() == [14, 15, 2]  # up to the end of that document


def test_ingested_documents_are_matched_but_never_across_a_boundary():
    d = RetrievalDrafter()
    d.ingest([7, 8, 9, 1, 2])
    d.ingest([3, 4, 5, 6])
    h = [1, 2, 3]
    d.start(h, 3)
    assert d.propose(h, 4).size == 0 and d.last_n_candidates == 0  # [1 2 3] spans the boundary
    h = [7, 8, 9, 1, 2]
    d.start(h, 5)
    assert d.propose(h, 4).size == 0  # doc 1 ends there: no continuation into doc 2
    h = [4, 5, 6, 9, 3, 4, 5]
    d.start(h, 7)
    assert d.propose(h, 4).tolist() == [6]  # continuation stops at the document's end
    h = [9, 1, 2, 3, 4, 5]  # backward extension stops at doc 2's start: match 4, not 6
    d.clear_corpus()
    d.ingest([9, 1, 2])
    d.ingest([3, 4, 5, 70, 71])
    d.start(h, 6)
    assert d.propose(h, 4).tolist() == [70, 71] and d.last_match_len == 3


def test_clear_corpus_forgets():
    d = RetrievalDrafter()
    d.ingest(np.arange(100, 200))
    h = [140, 141, 142]
    d.start(h, 3)
    assert d.propose(h, 3).tolist() == [143, 144, 145]
    big = d.nbytes
    d.clear_corpus()
    assert d.corpus_tokens == 0 and d.nbytes <= big
    assert d.propose(h, 3).size == 0


def test_corpus_bound_drops_the_oldest():
    d = RetrievalDrafter(max_corpus_tokens=256, max_stream_tokens=256)
    docs = [np.arange(1000 + 100 * i, 1000 + 100 * i + 40) for i in range(20)]  # 20 docs of 40 (+1 separator)
    for doc in docs:
        d.ingest(doc)
    assert d.corpus_tokens == 256
    assert d.nbytes <= 28 * 256 + 28 * 256 + 512  # corpus arrays at most next_pow2(256) slots, stream small
    newest, oldest = docs[-1], docs[0]
    h = list(newest[:5])
    d.start(h, 5)
    assert d.propose(h, 3).tolist() == list(newest[5:8])
    h = list(oldest[:5])
    d.start(h, 5)
    assert d.propose(h, 3).size == 0
    # the memory does not grow with the amount ingested
    for _ in range(50):
        d.ingest(np.arange(5000, 5100))
    assert d.corpus_tokens == 256 and d.nbytes <= 28 * 256 + 28 * 256 + 512


def test_stream_bound_and_lazy_growth():
    d = RetrievalDrafter(max_stream_tokens=1000)
    small = d.nbytes
    assert small < 300_000  # 4096-slot tiers until more is needed
    rng = np.random.default_rng(0)
    hist = rng.integers(0, 1 << 15, 5000).tolist()
    d.start(hist, 0)
    assert d.stream_tokens == 1000 and d.nbytes == small  # 1000 <= 4096: no growth
    probe = hist[100:103]  # dropped from the stream: no longer proposed
    assert d.propose(hist + probe, 2).size == 0


def test_stream_is_reset_at_start():
    d = RetrievalDrafter()
    h = [5, 6, 7, 8, 9, 10, 5, 6, 7]
    d.start(h, 0)
    assert d.propose(h, 2).tolist() == [8, 9]
    h2 = h + [3, 5, 6, 7]
    d.start(h2, len(h))
    assert d.stream_tokens == 4
    d.clear_corpus()  # the old stream went to the corpus; without it nothing is left to match
    assert d.propose(h2, 2).size == 0


def test_no_self_match():
    d = RetrievalDrafter()
    h = [1, 2, 3, 4]
    d.start(h, 0)
    assert d.propose(h, 4).size == 0 and d.last_n_candidates == 0
    h = [1, 2, 3, 1, 2, 3]
    d.start(h, 0)
    assert d.propose(h, 4).tolist() == [1, 2, 3]  # the earlier occurrence, up to the stream's end


def test_rewound_history_rebuilds_the_stream():
    d = RetrievalDrafter()
    h = [1, 2, 3, 50, 51, 1, 2, 3]
    d.start(h, 0)
    assert d.propose(h, 2).tolist() == [50, 51]
    h2 = [1, 2, 3, 60, 61, 7, 1, 2, 3]  # not an extension of h (h2[7] != h[7])
    assert d.propose(h2, 2).tolist() == [60, 61]
    assert d.propose(h2[:4], 2).size == 0  # shorter


# ------------------------------------------------------------------------------ reference & rebuild
def _random_case(seed, vocab=6):
    rng = np.random.default_rng(seed)
    docs = [rng.integers(0, vocab, int(rng.integers(1, 60))).tolist() for _ in range(int(rng.integers(0, 5)))]
    hist = rng.integers(0, vocab, int(rng.integers(20, 120))).tolist()
    ps = int(rng.integers(0, 20))
    steps = rng.integers(0, vocab, 60).tolist()
    return docs, hist, ps, steps


@pytest.mark.parametrize("seed", range(6))
def test_matches_reference_and_incremental_equals_rebuild(seed):
    docs, hist, ps, steps = _random_case(seed, vocab=4 + seed % 3)
    kw = dict(min_confidence=[0.0, 0.35, 0.6][seed % 3], max_candidates=[16, 4][seed % 2])
    ref_kw = dict(min_conf=kw["min_confidence"], max_cand=kw["max_candidates"])
    inc = RetrievalDrafter(**kw)
    for doc in docs:
        inc.ingest(doc)
    inc.start(hist, ps)
    corpus = _corpus_list(docs + ([hist[:ps]] if ps else []))
    h = list(hist)
    i = 0
    while i < len(steps):
        k = 1 + i % 7
        _check(inc, h, k, h[ps:], corpus, **ref_kw)
        fresh = RetrievalDrafter(**kw)
        for doc in docs:
            fresh.ingest(doc)
        fresh.start(h, ps)
        got = fresh.propose(h, k)
        assert got.tolist() == inc.propose(h, k).tolist()
        assert (fresh.last_confidence, fresh.last_match_len, fresh.last_n_candidates) == (
            inc.last_confidence, inc.last_match_len, inc.last_n_candidates)
        n = 1 + i % 4
        h += steps[i : i + n]
        i += n


def test_matches_reference_with_long_matches_and_many_candidates():
    rng = np.random.default_rng(7)
    base = rng.integers(0, 50, 40).tolist()
    docs = []
    for _ in range(12):  # many variants of one passage: long matches, diverging continuations
        v = list(base)
        v[int(rng.integers(0, 40))] = int(rng.integers(0, 50))
        docs.append(v + rng.integers(0, 3, 8).tolist())
    hist = rng.integers(0, 50, 30).tolist() + base + base[:20]
    d = RetrievalDrafter(min_confidence=0.2)
    for doc in docs:
        d.ingest(doc)
    d.start(hist, 0)
    corpus = _corpus_list(docs)
    h = list(hist)
    most = 0
    for t in base[20:] + [0, 1, 2]:
        _check(d, h, 7, h, corpus, min_conf=0.2)
        most = max(most, d.last_n_candidates)
        h.append(t)
    assert most > 4


def _with_copies(rng, n, vocab):
    """Random tokens in which about half the stretches copy an earlier stretch."""
    out = rng.integers(0, vocab, 16).tolist()
    while len(out) < n:
        if rng.random() < 0.5:
            ln = int(rng.integers(4, 24))
            src = int(rng.integers(0, len(out) - 4))
            out += out[src : src + ln]
        else:
            out += rng.integers(0, vocab, int(rng.integers(4, 24))).tolist()
    return out[:n]


@pytest.mark.parametrize("limits", [(64, 48), (1 << 20, 65536)])
def test_matches_reference_across_ring_wrap_and_growth(limits):
    """Small bounds: both rings wrap (oldest dropped); large ones: the arrays grow (4096 -> 16384 slots)."""
    max_corpus, max_stream = limits
    rng = np.random.default_rng(11)
    n = 300 if max_corpus < 100 else 9000
    docs = [_with_copies(rng, n // 3, 40) for _ in range(3)]
    hist = _with_copies(rng, n, 40)
    d = RetrievalDrafter(max_corpus_tokens=max_corpus, max_stream_tokens=max_stream)
    for doc in docs:
        d.ingest(doc)
    d.start(hist, 0)
    corpus = _corpus_list(docs)[-max_corpus:]
    h = list(hist)
    hits = 0
    for i in range(25):
        hits += _check(d, h, 4, h[-max_stream:], corpus).size > 0
        back = min(200, max_stream - 8) - i % 3
        h += h[-back : -back + 5]  # repeat recent text: candidates in the stream
    d.propose(h, 4)
    assert hits > 5
    assert d.corpus_tokens == min(max_corpus, len(_corpus_list(docs)))
    assert d.stream_tokens == min(max_stream, len(h))


# ------------------------------------------------------------------------------ isolation
def test_isolation_across_threads():
    def make(seed):
        rng = np.random.default_rng(100 + seed)
        vocab = 8 + 4 * seed
        docs = [rng.integers(0, vocab, 300).tolist() for _ in range(4)]
        hist = rng.integers(0, vocab, 400).tolist()
        steps = rng.integers(0, vocab, 1500).tolist()
        return docs, hist, steps

    def run(seed, results):
        docs, hist, steps = make(seed)
        d = RetrievalDrafter(max_corpus_tokens=1000 + 100 * seed, max_candidates=8 + seed)
        for doc in docs:
            d.ingest(doc)
        h = list(hist)
        d.start(h, 100)
        out = []
        for i, t in enumerate(steps):
            if i % 500 == 499:  # further generations: the stream moves into the corpus
                d.start(h, len(h) - 20)
            p = d.propose(h, 1 + i % 7)
            out.append((p.tolist(), d.last_confidence, d.last_match_len, d.last_n_candidates))
            h.append(t)
        results[seed] = out

    alone = {}
    for s in range(4):
        run(s, alone)
    assert len({str(v) for v in alone.values()}) == 4  # the four sessions differ
    for _ in range(3):
        together = {}
        threads = [threading.Thread(target=run, args=(s, together)) for s in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert together == alone
