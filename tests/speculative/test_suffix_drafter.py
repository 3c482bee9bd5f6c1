"""SuffixDrafter (prompt lookup): matching semantics, incremental index, eviction, compaction, memory."""

import numpy as np
import pytest

from guild.speculative.lookup import _SEED3, WAYS, SuffixDrafter, _anchor_slot, _hash


def ref_propose(w, k, min_match=3, max_match=64):
    """Brute-force twin of SuffixDrafter over the indexed window `w` (valid while no slot was evicted):
    candidates = the WAYS newest earlier occurrences of the last 3 tokens (and of the last 2 when
    min_match == 2), verified, ranked by (match length, continuation frequency, recency)."""
    w = [int(x) for x in w]
    n, last = len(w), len(w) - 1
    cands = []
    for g in [3] + ([2] if min_match == 2 else []):
        if n < g:
            continue
        occ = [e for e in range(g - 1, n - 1) if w[e - g + 1 : e + 1] == w[n - g :]]
        for q in sorted(occ, reverse=True)[:WAYS]:
            if q not in cands:
                cands.append(q)
    scored = []
    for q in cands:
        m = 0
        while m < max_match and m <= q and w[q - m] == w[last - m]:
            m += 1
        if m >= min_match:
            scored.append((q, m))
    if not scored:
        return [], 0, 0, 0
    best_len = max(m for _, m in scored)
    grp = [q for q, m in scored if m == best_len]

    def freq(q):
        return sum(w[p + 1] == w[q + 1] for p in grp)

    best = max(grp, key=lambda q: (freq(q), q))
    return w[best + 1 : best + 1 + k], best_len, freq(best), len(grp)


def prop(d, hist, k=4):
    return d.propose(hist, k).tolist()


# ------------------------------------------------------------------ matching semantics
def test_longest_match_beats_more_recent_shorter():
    old = [10, 1, 2, 3, 50, 51, 52]  # preceded by 10: a 4-token match
    new = [20, 1, 2, 3, 60, 61, 62]  # more recent, preceded by 20: a 3-token match
    hist = old + new + [10, 1, 2, 3]
    d = SuffixDrafter()
    assert prop(d, hist) == [50, 51, 52, 20]
    assert d.last_match_len == 4 and d.last_freq == 1 and d.last_group == 1 and d.last_consensus == 1.0


def test_equal_length_more_frequent_continuation_wins_then_most_recent():
    hist = [30, 1, 2, 3, 7, 100,  # continuation 7
            31, 1, 2, 3, 7, 101,  # continuation 7 (more recent)
            32, 1, 2, 3, 8, 102,  # continuation 8: the most recent, but alone
            33, 1, 2, 3]
    d = SuffixDrafter()
    assert prop(d, hist) == [7, 101, 32, 1]
    assert (d.last_match_len, d.last_freq, d.last_group) == (3, 2, 3)
    assert d.last_consensus == pytest.approx(2 / 3)
    assert ref_propose(hist, 4) == ([7, 101, 32, 1], 3, 2, 3)


def test_equal_frequency_most_recent_wins():
    hist = [30, 1, 2, 3, 7, 100, 31, 1, 2, 3, 8, 101, 33, 1, 2, 3]
    d = SuffixDrafter()
    assert prop(d, hist) == [8, 101, 33, 1]
    assert (d.last_match_len, d.last_freq, d.last_group, d.last_consensus) == (3, 1, 2, 0.5)


def test_proposal_stops_at_end_of_history():
    d = SuffixDrafter()
    assert prop(d, [1, 2, 3, 4, 1, 2, 3], 10) == [4, 1, 2, 3]
    assert prop(d, [1, 2, 3, 4, 1, 2, 3], 2) == [4, 1]
    assert prop(d, [1, 2, 3, 4, 1, 2, 3], 0) == []


def test_no_self_match_and_no_match_fields():
    d = SuffixDrafter()
    assert prop(d, [1, 2, 3]) == []
    assert (d.last_match_len, d.last_freq, d.last_group, d.last_consensus) == (0, 0, 0, 0.0)
    assert prop(d, [5, 6, 7, 8, 1, 2, 3]) == []  # the anchor occurs only as the suffix itself
    assert prop(SuffixDrafter(), [1, 2]) == []
    # a run: the newest earlier occurrence ends one token before the suffix; its continuation is 1 token
    d = SuffixDrafter()
    assert prop(d, [4] * 8) == [4]
    assert d.last_match_len == 7


def test_max_match_caps_length_then_frequency_and_recency_rank():
    rng = np.random.default_rng(1)
    block = rng.integers(100, 200, 20).tolist()
    hist = block + [1] + block + [2] + block + [1] + block
    d = SuffixDrafter(max_match=8)
    assert prop(d, hist) == [1] + block[:3]  # all three at length 8; continuation 1 has 2 votes
    assert (d.last_match_len, d.last_freq, d.last_group) == (8, 2, 3)
    d = SuffixDrafter()  # uncapped: the occurrence after "block 1" also matches "1 block" before it: longest
    assert prop(d, hist) == [2] + block[:3]
    assert (d.last_match_len, d.last_freq, d.last_group) == (41, 1, 1)


def test_min_match_2_finds_bigram_matches():
    hist = [1, 2, 3, 4, 9, 2, 3]
    assert prop(SuffixDrafter(min_match=3), hist) == []
    d = SuffixDrafter(min_match=2)
    assert prop(d, hist, 3) == [4, 9, 2]
    assert d.last_match_len == 2
    # 3-gram matches still win over 2-gram ones when longer
    hist = [7, 2, 3, 40, 41, 5, 2, 3, 50, 51, 0, 5, 2, 3]
    assert prop(SuffixDrafter(min_match=2), hist, 2) == [50, 51]


def test_min_match_4_rejects_three_token_matches():
    hist = [10, 1, 2, 3, 4, 20, 1, 2, 3]
    assert prop(SuffixDrafter(min_match=3), hist, 1) == [4]
    assert prop(SuffixDrafter(min_match=4), hist, 1) == []
    hist = [20, 1, 2, 3, 4, 20, 1, 2, 3]
    d = SuffixDrafter(min_match=4)
    assert prop(d, hist, 1) == [4] and d.last_match_len == 4


def test_hash_is_order_sensitive():
    a = np.array([1, 2, 3], np.int32)
    assert _hash(a, 2, 3, _SEED3) != _hash(a[::-1].copy(), 2, 3, _SEED3)


def test_candidates_are_verified_not_trusted():
    hist = [9, 1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3]
    d = SuffixDrafter()
    assert prop(d, hist) == [4, 5, 6, 7]
    s = _anchor_slot(d._tags, d._mask, np.array([1, 2, 3], np.int32))
    d._pos[s, 0] = 5  # corrupt: position 5 does not end "1 2 3"
    assert prop(d, hist) == []


# ------------------------------------------------------------------ incremental index vs rebuild
def repetitive_tokens(rng, n, vocab):
    """Random tokens interleaved with copies of earlier spans (so that matches of all lengths occur)."""
    out = rng.integers(0, vocab, 8).tolist()
    while len(out) < n:
        if rng.random() < 0.6:
            length = int(rng.integers(3, 12))
            src = int(rng.integers(0, max(1, len(out) - length)))
            out += out[src : src + length]
        else:
            out += rng.integers(0, vocab, int(rng.integers(1, 6))).tolist()
    return out[:n]


@pytest.mark.parametrize("min_match", [2, 3, 4])
def test_incremental_equals_rebuild_and_reference(min_match):
    rng = np.random.default_rng(min_match)
    hits = 0
    for trial in range(9):
        vocab = int(rng.choice([4, 12, 50]))
        cap = int(rng.choice([32, 37, 48, 1000]))
        bits = [None, 3, 5][trial % 3]
        max_match = int(rng.choice([5, 64]))
        kw = dict(min_match=min_match, max_match=max_match, max_history=cap, table_bits=bits)
        d = SuffixDrafter(**kw)
        source = repetitive_tokens(rng, 240, vocab)
        hist: list[int] = []
        while len(hist) < len(source):
            hist.extend(source[len(hist) : len(hist) + int(rng.integers(1, 5))])
            k = int(rng.integers(1, 8))
            got = prop(d, hist, k)
            fields = (d.last_match_len, d.last_freq, d.last_group)
            fresh = SuffixDrafter(**kw)
            assert prop(fresh, hist, k) == got
            assert (fresh.last_match_len, fresh.last_freq, fresh.last_group) == fields
            rebuilt = SuffixDrafter(**kw)
            rebuilt.rebuild(hist)
            for other in (fresh, rebuilt):
                assert other.indexed == d.indexed == len(hist)
                assert np.array_equal(other.window(), d.window())
                assert np.array_equal(other._pos, d._pos) and np.array_equal(other._tags, d._tags)
            assert np.array_equal(d.window(), np.array(hist[len(hist) - d.window().size :]))
            if bits is None:  # a roomy table never evicts here: the brute-force twin must agree
                assert (got, *fields) == ref_propose(d.window(), k, min_match, max_match)
            hits += len(got) > 0
    assert hits > 100  # the property was exercised on real matches


def test_append_api_matches_propose_sync():
    rng = np.random.default_rng(7)
    hist = rng.integers(0, 6, 300).tolist()
    a, b = SuffixDrafter(max_history=128), SuffixDrafter(max_history=128)
    for t in hist[:100]:
        a.append(t)
    a.append(hist[100:250])
    a.append(np.array(hist[250:], np.int64))
    a.append([])
    assert a.indexed == 300
    assert prop(a, hist) == prop(b, hist)
    assert np.array_equal(a._pos, b._pos)


def test_start_appends_extensions_and_rebuilds_otherwise():
    d = SuffixDrafter()
    d.start([1, 2, 3, 4, 1, 2], 0)
    assert d.indexed == 6
    d.start([1, 2, 3, 4, 1, 2, 3], 0)  # extension: appended
    assert prop(d, [1, 2, 3, 4, 1, 2, 3]) == [4, 1, 2, 3]
    d.start([7, 8, 9, 7, 8], 0)  # not an extension: rebuilt
    assert d.window().tolist() == [7, 8, 9, 7, 8] and d.indexed == 5
    assert prop(d, [7, 8, 9, 7, 8]) == []
    assert prop(SuffixDrafter(min_match=2), [7, 8, 9, 7, 8]) == [9, 7, 8]
    d.start([1, 2, 3, 4, 5, 1, 2, 3], 0)  # same length region, different tokens
    assert prop(d, [1, 2, 3, 4, 5, 1, 2, 3]) == [4, 5, 1, 2]
    # propose rebuilds on a shorter history, or when the last indexed token changed
    assert prop(d, [1, 2, 3, 9, 1, 2, 3]) == [9, 1, 2, 3]
    assert d.window().tolist() == [1, 2, 3, 9, 1, 2, 3]
    assert prop(d, [1, 2, 3, 9, 1, 2, 4, 1, 2]) == []
    assert prop(d, [1, 2, 3, 9, 1, 2, 4, 1, 2, 3]) == [9, 1, 2, 4]
    assert d.window().tolist() == [1, 2, 3, 9, 1, 2, 4, 1, 2, 3]


# ------------------------------------------------------------------ bounded table: eviction
def test_slot_keeps_newest_ways_positions():
    hist = []
    for i in range(6):
        hist += [1, 2, 3, 100 + i]
    d = SuffixDrafter()
    d.start(hist, 0)
    assert d.anchor_positions([1, 2, 3]) == [22, 18, 14, 10]  # 6 occurrences: 2 and 6, the oldest, dropped
    assert prop(d, hist + [1, 2, 3]) == [105, 1, 2, 3]
    assert (d.last_match_len, d.last_freq, d.last_group) == (3, 1, WAYS)  # only the 4 stored candidates


def test_probe_saturation_evicts_oldest_anchor():
    # 16 slots, probing covers all of them: every anchor collides with every other.
    toks = list(range(100, 120))  # 20 distinct tokens: anchors ending at 2..18 are indexed (17 anchors)
    d = SuffixDrafter(table_bits=4)
    d.start(toks, 0)
    assert d.anchor_positions([100, 101, 102]) == []  # the oldest anchor went first
    assert d.anchor_positions([101, 102, 103]) == [3]
    assert d.anchor_positions([116, 117, 118]) == [18]
    # recent content still proposes correctly; the evicted oldest content cannot be found any more
    assert prop(d, toks + [110, 111, 112]) == [113, 114, 115, 116]
    assert d.anchor_positions([101, 102, 103]) == []  # two more anchors pushed out positions 3 and 4
    assert prop(SuffixDrafter(table_bits=4), toks + [100, 101, 102]) == []
    assert prop(SuffixDrafter(), toks + [100, 101, 102]) == [103, 104, 105, 106]
    # a re-used anchor refreshes its slot (LRU by newest position), so it survives newer insertions
    d = SuffixDrafter(table_bits=4)
    hist = toks[:10] + [100, 101, 102] + list(range(200, 212))
    d.start(hist, 0)
    # 21 distinct anchors: the 5 whose newest position is oldest (ending at 3..7) went, not "100 101 102"
    assert d.anchor_positions([100, 101, 102]) == [12, 2]
    assert d.anchor_positions([101, 102, 103]) == [] and d.anchor_positions([105, 106, 107]) == []
    assert d.anchor_positions([106, 107, 108]) == [8]
    assert prop(d, hist + [100, 101, 102]) == [200, 201, 202, 203]


# ------------------------------------------------------------------ sliding window: compaction, memory
def test_compaction_keeps_recent_proposals_and_bounds_memory():
    rng = np.random.default_rng(3)
    d = SuffixDrafter(max_history=64)
    nb = d.nbytes
    hist = rng.integers(1000, 2000, 50).tolist()
    phrase = [1, 2, 3, 4, 5, 6, 7, 8]
    hist += phrase
    assert prop(d, hist + [1, 2, 3]) == [4, 5, 6, 7]
    hist += rng.integers(1000, 2000, 500).tolist()
    assert prop(d, hist + [1, 2, 3]) == []  # dropped with the oldest half
    assert d.indexed == len(hist) + 3 and d.window().size <= 64
    recent = [40, 41, 42, 43, 44, 45]
    hist += recent + rng.integers(1000, 2000, 20).tolist()
    assert prop(d, hist + [40, 41, 42]) == [43, 44, 45, hist[len(hist) - 20]]
    assert d.nbytes == nb
    assert d.window().tolist() == (hist + [40, 41, 42])[-d.window().size :]


def test_set_max_history_shrinks_and_reindexes():
    rng = np.random.default_rng(4)
    hist = rng.integers(1000, 2000, 300).tolist() + [1, 2, 3, 4, 5] + rng.integers(1000, 2000, 10).tolist()
    d = SuffixDrafter(max_history=4096)
    d.start(hist, 0)
    big = d.nbytes
    d.set_max_history(64)
    assert d.nbytes < big and d.window().size == 32 and d.indexed == len(hist)
    assert prop(d, hist + [1, 2, 3]) == [4, 5] + hist[-10:-8]
    d.set_max_history(1024)
    assert d.window().size == 35 and d.indexed == len(hist) + 3


def test_memory_bound_at_65536_tokens():
    limit = 17 * 2**20  # a C++ suffix index of a 65,536-token window takes ~16.8 MiB: ours must not take more
    for mm, ours in ((3, 3 * 2**20), (2, 6 * 2**20)):
        d = SuffixDrafter(min_match=mm, max_history=65536)
        nb = d.nbytes
        assert nb <= min(limit, ours)
        d.append(np.random.default_rng(0).integers(0, 500, 70000))  # fills, compacts once
        assert d.nbytes == nb and d.window().size <= 65536 and d.indexed == 70000


def test_validation():
    for kw in (dict(min_match=1), dict(max_match=2), dict(table_bits=31), dict(max_history=8)):
        with pytest.raises(ValueError):
            SuffixDrafter(**kw)
