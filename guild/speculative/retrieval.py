"""Session-local retrieval drafter: REST-style length-weighted continuation voting (docs/adaptive.md "Drafters").

REST (He et al. 2023, "REST: Retrieval-Based Speculative Decoding") drafts from a datastore of text by
finding the spans whose context matches the current suffix and letting them vote on the continuation. Here
the datastore is session-local and has two tiers:

* **corpus**: documents ingested explicitly (`ingest`) and the streams of earlier generations of this session
  (moved in by `start`), so it persists across turns; bounded by ``max_corpus_tokens`` (the oldest tokens,
  hence the oldest documents, are dropped first). Documents are separated by a sentinel (-1) that matches no
  token, so no match and no continuation spans a document boundary.
* **stream**: the current prompt plus the committed output of the running generation (``history[prompt_start:]``),
  reset by every `start`, bounded by ``max_stream_tokens`` (oldest dropped).

Drafting (one Numba kernel per `propose`, which also appends the newly committed tokens to the stream):

1. Candidates. The anchors are the last 4 and the last 3 tokens of the history. Each anchor is looked up in
   both tiers; a candidate is a position q (the last token of an occurrence of the anchor) verified token by
   token, with at least one continuation token (q+1 within its document). The stream's own suffix (q = last
   stream token) is a self-match and is excluded. Per (anchor, tier) at most ``HITS_PER_LOOKUP`` = 8 new
   positions are taken, newest first (so at most 32 raw candidates).
2. Match length: extended backwards token by token against the history, up to ``MAX_MATCH`` = 64 (and never
   past the tier's oldest live token or a document boundary).
3. Weight: ``w = match_len² · source_boost · 1 / (1 + 0.08 · rank)``, source_boost = ``stream_boost`` or
   ``corpus_boost``; rank orders the raw candidates of a tier by recency (0 = most recent).
4. Dedupe and cap: candidates sorted by (w desc, stream before corpus, newer first); a candidate whose
   continuation (its first min(k, available) tokens) is identical to a kept one is dropped (the strongest
   survives); at most ``max_candidates`` are kept.
5. Voting, step j = 0..k-1: every surviving span that has a j-th continuation token votes it with its weight
   (a span whose continuation has ended drops out); the token with the largest total wins (ties: lower
   token id). If ``w_best / Σw < min_confidence`` (Σw over the spans voting at that step) or nobody votes,
   drafting stops before this step; else the token is drafted and spans voting otherwise are pruned.

Scheduler fields (set by every `propose`): ``last_confidence`` = w_best / Σw at step 0 (0.0 without
candidates), ``last_n_candidates`` = candidates after dedupe and cap, ``last_match_len`` = match length of
the heaviest span voting for the step-0 winner (0 without candidates).

Index (per tier, incremental, O(1) per appended token, no rescan per proposal). Tokens live in a power-of-two
ring ``tok`` (int32) addressed by absolute position (``pos & (cap-1)``); the live range is ``[base, end)``,
``end - base <= limit <= cap``. For n = 3, 4 the n-gram ending at position p is indexed as a hash chain
(LZ77-style): ``heads[n-3, h & (cap-1)]`` (int64) holds the newest position whose n-gram hashes to that
bucket, ``prevd[n-3, p & (cap-1)]`` (uint32) the distance back to the previous one (0 = end of chain).
Chains only go back in time, so a walk stops at the first position < base (dropped or reset); every chain
element is verified against the anchor (bucket collisions are skipped), and a walk takes at most
``MAX_WALK`` = 64 steps. Dropping the oldest tokens or resetting the stream is O(1) (``base`` moves); a
tier's arrays start small (4096 slots) and double while the live range needs more room (O(live) rebuild,
amortised O(1)), up to next_pow2(limit). Memory: 28 bytes per slot (4 token + 2·4 chain + 2·8 heads):
at most 28·next_pow2(limit) bytes per tier — 28 MiB for the default 1 Mi-token corpus, 1.75 MiB for a
65,536-token stream.

Isolation: all state belongs to the instance (no module-level mutable state; the kernels are pure functions
of their arguments and release the GIL). Deterministic: no I/O, no clock, integer indexes, fixed tie-breaks.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from numba import njit

from ..kernels.cpu import cache_lock  # noqa: F401 - its kernels' cache saves, locked across processes
from .base import Drafter, next_pow2

MAX_MATCH = 64  # backward extension cap (and the query length)
HITS_PER_LOOKUP = 8  # new candidate positions taken per (anchor order, tier)
MAX_WALK = 64  # chain steps per (anchor order, tier)
MIN_SLOTS = 4096  # initial ring / bucket count of a tier
RANK_DECAY = 0.08
SENTINEL = -1  # document separator in the corpus ring

_P1 = np.uint64(0x9E3779B97F4A7C15)
_P2 = np.uint64(0xC2B2AE3D27D4EB4F)
_SEED = np.uint64(0x243F6A8885A308D3)
_S29 = np.uint64(29)
_S32 = np.uint64(32)


# --------------------------------------------------------------------------------------------- kernels
@njit(cache=True, nogil=True, inline="always")
def _mix(h, t):
    h = (h ^ np.uint64(t)) * _P1
    return h ^ (h >> _S29)


@njit(cache=True, nogil=True, inline="always")
def _bucket(h, hmask):
    h = h * _P2
    h ^= h >> _S32
    return np.int64(h & np.uint64(hmask))


@njit(cache=True, nogil=True)
def _append(tok, heads, prevd, meta, new, lo, hi, limit):
    """Append new[lo:hi] to the tier (meta = [base, end]) and index the 3-/4-grams ending at each token."""
    mask = tok.shape[0] - 1
    hmask = heads.shape[1] - 1
    base = meta[0]
    end = meta[1]
    for i in range(lo, hi):
        t = new[i]
        p = end
        tok[p & mask] = t
        end += 1
        if end - base > limit:
            base = end - limit
        if t < 0:
            continue
        h = _SEED
        for j in range(4):  # hash backwards from p: after j = 2 the 3-gram, after j = 3 the 4-gram
            q = p - j
            if q < base:
                break
            v = tok[q & mask]
            if v < 0:
                break
            h = _mix(h, v)
            if j >= 2:
                o = j - 2
                b = _bucket(h, hmask)
                prev = heads[o, b]
                prevd[o, p & mask] = p - prev if prev >= base else 0
                heads[o, b] = p
    meta[0] = base
    meta[1] = end


@njit(cache=True, nogil=True)
def _gather(tok, heads, prevd, meta, query, n, tier, k, c_pos, c_tier, c_len, c_clen, c_cont, count):
    """Candidates of one (anchor order n, tier): verified positions with >= 1 continuation token."""
    qn = query.shape[0]
    if qn < n:
        return count
    mask = tok.shape[0] - 1
    hmask = heads.shape[1] - 1
    base = meta[0]
    end = meta[1]
    h = _SEED
    for j in range(n):
        h = _mix(h, query[qn - 1 - j])
    q = heads[n - 3, _bucket(h, hmask)]
    hits = 0
    steps = 0
    cmax = c_pos.shape[0]
    while q >= base and steps < MAX_WALK and hits < HITS_PER_LOOKUP and count < cmax:
        steps += 1
        ok = q - n + 1 >= base and q < end - 1  # q = end - 1: the stream's own suffix / no continuation
        if ok:
            for j in range(n):
                if tok[(q - j) & mask] != query[qn - 1 - j]:
                    ok = False
                    break
        if ok:
            for c in range(count):
                if c_pos[c] == q and c_tier[c] == tier:
                    ok = False
                    break
        if ok:
            m = n
            while m < MAX_MATCH and m < qn and q - m >= base and tok[(q - m) & mask] == query[qn - 1 - m]:
                m += 1
            cl = 0
            while cl < k and q + 1 + cl < end:
                v = tok[(q + 1 + cl) & mask]
                if v < 0:
                    break
                c_cont[count, cl] = v
                cl += 1
            if cl > 0:
                c_pos[count] = q
                c_tier[count] = tier
                c_len[count] = m
                c_clen[count] = cl
                count += 1
                hits += 1
        d = np.int64(prevd[n - 3, q & mask])
        if d == 0:
            break
        q -= d
    return count


@njit(cache=True, nogil=True)
def _sync_propose(s_tok, s_heads, s_prev, s_meta, s_limit, c_tok, c_heads, c_prev, c_meta,
                  tail, n_new, k, max_cand, fparams, out, stats):
    """Append tail[-n_new:] to the stream, then draft up to k tokens continuing `tail` into out.

    fparams = [stream_boost, corpus_boost, min_confidence]; stats <- [confidence, match_len, n_candidates].
    Returns the number of drafted tokens."""
    if n_new > 0:
        _append(s_tok, s_heads, s_prev, s_meta, tail, tail.shape[0] - n_new, tail.shape[0], s_limit)
    stats[0] = 0.0
    stats[1] = 0.0
    stats[2] = 0.0
    if k <= 0:
        return 0
    qn = min(MAX_MATCH, tail.shape[0])
    query = tail[tail.shape[0] - qn:]
    raw = 4 * HITS_PER_LOOKUP
    c_pos = np.empty(raw, np.int64)
    c_tier = np.empty(raw, np.int64)
    c_len = np.empty(raw, np.int64)
    c_clen = np.empty(raw, np.int64)
    c_cont = np.empty((raw, k), np.int32)
    # the count and tiers typed int64, not as literals (each literal value compiled _gather once more)
    nc, stream, corpus = np.int64(0), np.int64(0), np.int64(1)
    for n in (4, 3):
        nc = _gather(s_tok, s_heads, s_prev, s_meta, query, n, stream, k, c_pos, c_tier, c_len, c_clen, c_cont, nc)
        nc = _gather(c_tok, c_heads, c_prev, c_meta, query, n, corpus, k, c_pos, c_tier, c_len, c_clen, c_cont, nc)
    if nc == 0:
        return 0
    # weights: rank = recency order within the tier
    w = np.empty(nc, np.float64)
    for a in range(nc):
        rank = 0
        for b in range(nc):
            if c_tier[b] == c_tier[a] and c_pos[b] > c_pos[a]:
                rank += 1
        boost = fparams[0] if c_tier[a] == 0 else fparams[1]
        w[a] = float(c_len[a] * c_len[a]) * boost / (1.0 + RANK_DECAY * rank)
    # order: weight desc, stream first, newer first (insertion sort, nc <= 32)
    order = np.empty(nc, np.int64)
    for a in range(nc):
        j = a
        while j > 0:
            b = order[j - 1]
            if w[b] > w[a] or (w[b] == w[a] and (c_tier[b] < c_tier[a] or
                                                  (c_tier[b] == c_tier[a] and c_pos[b] > c_pos[a]))):
                break
            order[j] = b
            j -= 1
        order[j] = a
    # dedupe identical continuations (the strongest survives), cap
    sel = np.empty(nc, np.int64)
    m = 0
    for i in range(nc):
        if m >= max_cand:
            break
        a = order[i]
        dup = False
        for s in range(m):
            b = sel[s]
            if c_clen[b] == c_clen[a]:
                same = True
                for j in range(c_clen[a]):
                    if c_cont[a, j] != c_cont[b, j]:
                        same = False
                        break
                if same:
                    dup = True
                    break
        if not dup:
            sel[m] = a
            m += 1
    stats[2] = m
    # vote step by step
    alive = np.ones(m, np.bool_)
    min_conf = fparams[2]
    n_out = 0
    for j in range(k):
        total = 0.0
        best_t = -1
        best_w = -1.0
        for s in range(m):
            a = sel[s]
            if alive[s] and c_clen[a] <= j:
                alive[s] = False  # its continuation ended: it no longer votes
            if not alive[s]:
                continue
            t = c_cont[a, j]
            total += w[a]
            seen = False
            for s2 in range(s):
                if alive[s2] and c_cont[sel[s2], j] == t:
                    seen = True
                    break
            if seen:
                continue
            tw = 0.0
            for s2 in range(s, m):
                b = sel[s2]
                if alive[s2] and c_clen[b] > j and c_cont[b, j] == t:
                    tw += w[b]
            if tw > best_w or (tw == best_w and t < best_t):
                best_w = tw
                best_t = t
        if best_t < 0:
            break
        conf = best_w / total
        if j == 0:
            stats[0] = conf
            for s in range(m):  # sel is sorted by weight: the first voter for the winner is the heaviest
                if c_cont[sel[s], 0] == best_t:
                    stats[1] = c_len[sel[s]]
                    break
        if conf < min_conf:
            break
        out[n_out] = best_t
        n_out += 1
        for s in range(m):
            if alive[s] and c_cont[sel[s], j] != best_t:
                alive[s] = False
    return n_out


# --------------------------------------------------------------------------------------------- tiers
class _Tier:
    """One token store with its hash-chain index (see the module docstring)."""

    __slots__ = ("limit", "cap_max", "tok", "heads", "prevd", "meta")

    def __init__(self, limit: int):
        self.limit = int(limit)
        self.cap_max = next_pow2(self.limit)
        self._alloc(min(MIN_SLOTS, self.cap_max), 0)

    def _alloc(self, cap: int, pos: int) -> None:
        self.tok = np.zeros(cap, np.int32)
        self.heads = np.full((2, cap), -1, np.int64)
        self.prevd = np.zeros((2, cap), np.uint32)
        self.meta = np.array([pos, pos], np.int64)  # [base, end]: absolute positions

    @property
    def base(self) -> int:
        return int(self.meta[0])

    @property
    def end(self) -> int:
        return int(self.meta[1])

    def __len__(self) -> int:
        return int(self.meta[1] - self.meta[0])

    @property
    def nbytes(self) -> int:
        return self.tok.nbytes + self.heads.nbytes + self.prevd.nbytes + self.meta.nbytes

    def tokens(self) -> np.ndarray:
        """The live tokens (sentinels included), oldest first."""
        idx = np.arange(self.meta[0], self.meta[1], dtype=np.int64) & (self.tok.size - 1)
        return self.tok[idx]

    def last(self) -> int:
        return int(self.tok[(self.meta[1] - 1) & (self.tok.size - 1)])

    def reserve(self, extra: int) -> None:
        """Make room for `extra` more live tokens (grow the arrays by doubling, up to cap_max)."""
        need = min(self.limit, len(self) + int(extra))
        cap = self.tok.size
        if need <= cap:
            return
        new_cap = min(self.cap_max, max(2 * cap, next_pow2(need)))
        live = self.tokens()
        self._alloc(new_cap, self.base)
        self.append(live, reserve=False)

    def append(self, arr: np.ndarray, reserve: bool = True) -> None:
        """Append int64 tokens (may contain SENTINEL)."""
        if arr.size == 0:
            return
        if reserve:
            self.reserve(arr.size)
        _append(self.tok, self.heads, self.prevd, self.meta, arr, 0, arr.size, self.limit)

    def reset(self) -> None:
        """Forget every token (O(1): the live range starts at the current end)."""
        self.meta[0] = self.meta[1]


def _as_tokens(tokens) -> np.ndarray:
    arr = np.asarray(tokens, np.int64).ravel()
    if arr.size and int(arr.min()) < 0:
        raise ValueError("token ids must be >= 0")
    return arr


# --------------------------------------------------------------------------------------------- drafter
class RetrievalDrafter(Drafter):
    """Session-local retrieval drafter (see the module docstring). One instance per session."""

    name = "retrieval"
    uses_corpus = True
    priors = {"weak3": 0.84, "conf3": 0.85, "m4": 0.84, "m8": 0.8}  # docs/adaptive.md "Acceptance"
    weights = {"len": 0.56, "vote": 1.55, "cands": -0.27, "agree": 0.15}

    @classmethod
    def _warm(cls) -> None:
        h = [1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3]
        d = cls(max_corpus_tokens=64, max_stream_tokens=64)
        d.ingest(h)
        d.start(h[:6], 0)
        d.propose(h, 2)

    @classmethod
    def bucket(cls, signals: dict) -> str:
        ml = int(signals.get("match_len", 0))
        if ml >= 8:
            return "m8"
        if ml >= 4:
            return "m4"
        return "conf3" if signals.get("confidence", 0.0) >= 0.6 else "weak3"

    @classmethod
    def features(cls, signals: dict) -> dict[str, float]:
        return {"len": math.log2(max(signals.get("match_len", 0), 1)) - 3.0,  # 0 at an 8-token match
                "vote": signals.get("confidence", 1.0) - 1.0,  # the winner's share of the candidates' votes
                "cands": math.log2(max(signals.get("candidates", 1), 1)) / 4}

    def signals(self) -> dict:
        return {"match_len": self.last_match_len, "confidence": self.last_confidence,
                "candidates": self.last_n_candidates}

    def __init__(self, max_corpus_tokens: int = 1 << 20, min_confidence: float = 0.35, max_candidates: int = 16,
                 stream_boost: float = 1.0, corpus_boost: float = 0.8, max_stream_tokens: int = 65536):
        if max_corpus_tokens < 8:
            raise ValueError(f"max_corpus_tokens must be >= 8, got {max_corpus_tokens}")
        if max_stream_tokens < 8:
            raise ValueError(f"max_stream_tokens must be >= 8, got {max_stream_tokens}")
        if not 1 <= max_candidates <= 4 * HITS_PER_LOOKUP:
            raise ValueError(f"max_candidates must be in 1..{4 * HITS_PER_LOOKUP}, got {max_candidates}")
        if not 0.0 <= min_confidence <= 1.0:
            raise ValueError(f"min_confidence must be in [0, 1], got {min_confidence}")
        if stream_boost <= 0 or corpus_boost <= 0:
            raise ValueError("stream_boost and corpus_boost must be > 0")
        self.max_corpus_tokens = int(max_corpus_tokens)
        self.max_stream_tokens = int(max_stream_tokens)
        self.min_confidence = float(min_confidence)
        self.max_candidates = int(max_candidates)
        self.stream_boost = float(stream_boost)
        self.corpus_boost = float(corpus_boost)
        self._fparams = np.array([self.stream_boost, self.corpus_boost, self.min_confidence], np.float64)
        self._stats = np.zeros(3, np.float64)
        self._corpus = _Tier(self.max_corpus_tokens)
        self._stream = _Tier(self.max_stream_tokens)
        self._started = False
        self._prompt_start = 0  # history index of the stream's first token
        self._synced = 0  # history length the stream reflects
        self.last_match_len = 0
        self.last_confidence = 0.0
        self.last_n_candidates = 0

    # ---------------------------------------------------------------- corpus
    def ingest(self, tokens) -> None:
        """Add a document to the corpus (followed by a separator: no match spans a document boundary)."""
        arr = _as_tokens(tokens)
        if arr.size == 0:
            return
        doc = np.empty(arr.size + 1, np.int64)
        doc[:-1] = arr
        doc[-1] = SENTINEL
        self._corpus.append(doc)

    def clear_corpus(self) -> None:
        """Forget every corpus document (and release its memory)."""
        self._corpus = _Tier(self.max_corpus_tokens)

    @property
    def corpus_tokens(self) -> int:
        """Live corpus tokens (one separator per document included)."""
        return len(self._corpus)

    @property
    def stream_tokens(self) -> int:
        return len(self._stream)

    @property
    def nbytes(self) -> int:
        return self._corpus.nbytes + self._stream.nbytes + self._fparams.nbytes + self._stats.nbytes

    # ---------------------------------------------------------------- generations
    def start(self, history: Sequence[int], prompt_start: int) -> None:
        """A generation starts: the previous stream joins the corpus, the stream becomes history[prompt_start:].

        On the first start, earlier turns (history[:prompt_start]) are ingested as one document instead."""
        n = len(history)
        prompt_start = max(0, min(int(prompt_start), n))
        if self._started:
            # tokens committed after the last propose (the end of the last turn), if history still extends it
            if self._synced <= prompt_start and self._consistent(history):
                self._stream.append(_as_tokens(history[self._synced:prompt_start]))
            if len(self._stream):
                self.ingest(self._stream.tokens())
        elif prompt_start > 0:
            self.ingest(history[:prompt_start])
        self._started = True
        self._reset_stream(history, prompt_start)

    def _reset_stream(self, history: Sequence[int], prompt_start: int) -> None:
        self._stream.reset()
        self._prompt_start = prompt_start
        self._stream.append(_as_tokens(history[prompt_start:]))
        self._synced = len(history)

    def _consistent(self, history: Sequence[int]) -> bool:
        """Cheap check that history still extends what the stream holds (its last token is where it was)."""
        s = self._synced
        if s > len(history):
            return False
        return s <= self._prompt_start or len(self._stream) == 0 or int(history[s - 1]) == self._stream.last()

    # ---------------------------------------------------------------- drafting
    def propose(self, history: Sequence[int], k: int) -> np.ndarray:
        """Up to k draft tokens continuing `history` (int32; empty = no confident draft)."""
        n = len(history)
        if not self._consistent(history):  # not an extension (rewound history): rebuild the stream
            self._reset_stream(history, min(self._prompt_start, n))
        k = max(0, int(k))
        n_new = n - self._synced
        lo = max(0, min(self._synced, n - MAX_MATCH))
        tail = np.asarray(history[lo:], np.int64).ravel()
        if n_new:
            self._stream.reserve(n_new)
        st = self._stream
        cp = self._corpus
        out = np.empty(k, np.int32)
        got = _sync_propose(st.tok, st.heads, st.prevd, st.meta, st.limit, cp.tok, cp.heads, cp.prevd, cp.meta,
                            tail, n_new, k, self.max_candidates, self._fparams, out, self._stats)
        self._synced = n
        self.last_confidence = float(self._stats[0])
        self.last_match_len = int(self._stats[1])
        self.last_n_candidates = int(self._stats[2])
        return out[:got]
