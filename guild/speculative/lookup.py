"""Prompt-lookup drafter: n-gram anchors in a bounded hash table, backward suffix extension (Saxena 2023,
"Prompt Lookup Decoding"; docs/adaptive.md "Drafters").

Proposes the tokens that followed the best earlier occurrence of the history's suffix. No I/O, no clock:
the same history always gives the same proposal.

Index. The token window lives in a preallocated int32 buffer of capacity `max_history`. Every position p
that already has a continuation (p < n - 1) is indexed under the anchor formed by the 3 tokens ending at p
(and, when ``min_match == 2``, also under the 2 tokens ending at p, hashed with a different seed and a
different tag kind). Anchors live in a power-of-two open-addressing table:

* ``pos[n_slots, WAYS=4]`` int32 buffer positions, newest first, -1 = empty;
* ``tag[n_slots]`` uint32: 24 hash bits (disjoint from the index bits) plus the anchor kind in bits 24..25
  (1 = 2-gram, 2 = 3-gram); 0 = empty slot.

Inserting anchor A at position p probes at most ``MAX_PROBE = 16`` slots from ``hash(A) & mask``: the slot
already tagged with A gets p at way 0 (the others shift right; the oldest position falls off the end), else
the first empty slot is claimed. If all probed slots hold other anchors (saturation), the slot whose newest
position is the oldest is evicted and reassigned to A. Nothing ever empties a slot, so a probe chain has no
holes and lookups may stop at the first empty slot. Positions are inserted one step late (when their
continuation token arrives), so the current suffix is never in the table: no self-match is possible, and a
lookup check ``q < n - 1`` guards it anyway. Tags only filter: every candidate is verified token by token.

Sliding window. When appending a token to a full buffer, the oldest half is dropped, the kept half moved to
the front and re-indexed from scratch (O(capacity) every capacity/2 tokens: O(1) amortised). Because the
index is a pure function of the kept tokens (inserted in position order), an incremental index and a fresh
rebuild of the same history are identical.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from numba import njit

from ..kernels.cpu import cache_lock  # noqa: F401 - its kernels' cache saves, locked across processes
from .base import Drafter, next_pow2

WAYS = 4
MAX_PROBE = 16

_P1 = np.uint64(0x9E3779B97F4A7C15)
_P2 = np.uint64(0xC2B2AE3D27D4EB4F)
_SEED3 = np.uint64(0x243F6A8885A308D3)
_SEED2 = np.uint64(0x13198A2E03707344)
_MASK24 = np.uint64(0xFFFFFF)
_S29 = np.uint64(29)
_S32 = np.uint64(32)
_S40 = np.uint64(40)
_KIND2 = np.uint32(1 << 24)
_KIND3 = np.uint32(2 << 24)


@njit(cache=True, inline="always")
def _hash(buf, end, length, seed):
    """Order-sensitive hash of buf[end-length+1 .. end] (a sequential multiply-xor chain + final avalanche)."""
    h = seed
    for i in range(end - length + 1, end + 1):
        h = (h ^ np.uint64(np.uint32(buf[i]))) * _P1
        h ^= h >> _S29
    h *= _P2
    h ^= h >> _S32
    return h


@njit(cache=True, inline="always")
def _tag(h, kind):
    return np.uint32(np.uint32((h >> _S40) & _MASK24) | kind)


@njit(cache=True)
def _insert(pos, tags, mask, h, tag, p):
    n_slots = mask + 1
    nprobe = MAX_PROBE if n_slots > MAX_PROBE else n_slots
    start = np.int64(h & np.uint64(mask))
    victim = -1
    victim_newest = np.int64(1) << 40
    for i in range(nprobe):
        s = (start + i) & mask
        t = tags[s]
        if t == 0:
            tags[s] = tag
            pos[s, 0] = p
            return
        if t == tag:
            for w in range(WAYS - 1, 0, -1):
                pos[s, w] = pos[s, w - 1]
            pos[s, 0] = p
            return
        if pos[s, 0] < victim_newest:
            victim_newest = pos[s, 0]
            victim = s
    # probing saturated: evict the slot whose newest position is the oldest
    tags[victim] = tag
    pos[victim, 0] = p
    for w in range(1, WAYS):
        pos[victim, w] = -1


@njit(cache=True)
def _find(tags, mask, h, tag):
    n_slots = mask + 1
    nprobe = MAX_PROBE if n_slots > MAX_PROBE else n_slots
    start = np.int64(h & np.uint64(mask))
    for i in range(nprobe):
        s = (start + i) & mask
        t = tags[s]
        if t == tag:
            return s
        if t == 0:
            return -1
    return -1


@njit(cache=True)
def _anchor_slot(tags, mask, gram):
    """Slot holding the 2- or 3-token anchor `gram`, -1 if none."""
    if gram.shape[0] == 3:
        h = _hash(gram, 2, 3, _SEED3)
        return _find(tags, mask, h, _tag(h, _KIND3))
    h = _hash(gram, 1, 2, _SEED2)
    return _find(tags, mask, h, _tag(h, _KIND2))


@njit(cache=True)
def _index_token(buf, i, pos, tags, mask, two):
    """Token i was just appended: index the anchors ending at i - 1 (whose continuation is buf[i])."""
    e = i - 1
    if e >= 2:
        h = _hash(buf, e, 3, _SEED3)
        _insert(pos, tags, mask, h, _tag(h, _KIND3), e)
    if two and e >= 1:
        h = _hash(buf, e, 2, _SEED2)
        _insert(pos, tags, mask, h, _tag(h, _KIND2), e)


@njit(cache=True)
def _reindex(buf, n, pos, tags, mask, two):
    pos[:] = -1
    tags[:] = 0
    for i in range(1, n):
        _index_token(buf, i, pos, tags, mask, two)


@njit(cache=True)
def _append(buf, n, new, pos, tags, mask, two):
    """Append `new` to buf[:n], compacting (keep the newest half) whenever the buffer is full.

    Returns (new n, number of tokens dropped from the front)."""
    cap = buf.shape[0]
    dropped = 0
    for j in range(new.shape[0]):
        if n == cap:
            keep = cap // 2
            for i in range(keep):  # not a slice assignment: its shape-error path compiles for seconds
                buf[i] = buf[n - keep + i]
            dropped += n - keep
            n = keep
            _reindex(buf, n, pos, tags, mask, two)
        buf[n] = new[j]
        n += 1
        _index_token(buf, n - 1, pos, tags, mask, two)
    return n, dropped


@njit(cache=True)
def _lookup(buf, n, pos, tags, mask, two, min_match, max_match):
    """Best earlier occurrence of the suffix of buf[:n].

    Returns (q, match_len, freq, group): q = buffer position of the winning occurrence's last matched token
    (-1 = none); its continuation is buf[q+1:]."""
    cand = np.empty(2 * WAYS, np.int64)
    clen = np.empty(2 * WAYS, np.int64)
    nc = 0
    last = n - 1
    for kind in range(2):
        if kind == 0:
            if n < 3:
                continue
            h = _hash(buf, last, 3, _SEED3)
            s = _find(tags, mask, h, _tag(h, _KIND3))
        else:
            if not two or n < 2:
                continue
            h = _hash(buf, last, 2, _SEED2)
            s = _find(tags, mask, h, _tag(h, _KIND2))
        if s < 0:
            continue
        for w in range(WAYS):
            q = np.int64(pos[s, w])
            if q < 0:
                break
            if q >= last:  # the suffix itself (never stored; kept as a guard)
                continue
            dup = False
            for c in range(nc):
                if cand[c] == q:
                    dup = True
                    break
            if dup:
                continue
            m = 0
            while m < max_match and m <= q and buf[q - m] == buf[last - m]:
                m += 1
            if m >= min_match:
                cand[nc] = q
                clen[nc] = m
                nc += 1
    if nc == 0:
        return -1, 0, 0, 0
    best_len = 0
    for c in range(nc):
        if clen[c] > best_len:
            best_len = clen[c]
    group = 0
    best_q = -1
    best_freq = 0
    for c in range(nc):
        if clen[c] != best_len:
            continue
        group += 1
        nxt = buf[cand[c] + 1]
        f = 0
        for d in range(nc):
            if clen[d] == best_len and buf[cand[d] + 1] == nxt:
                f += 1
        if f > best_freq or (f == best_freq and cand[c] > best_q):
            best_freq = f
            best_q = cand[c]
    return best_q, best_len, best_freq, group


class SuffixDrafter(Drafter):
    """Prompt-lookup drafter over the session's own token history.

    Ranking: the longest backward match (capped at ``max_match``) wins; among equal lengths, the candidate
    whose first continuation token is proposed by the most candidates of that length wins; then the most
    recent. Candidates are the (up to WAYS=4 newest) stored occurrences of the anchor (3-gram; plus the
    2-gram anchor when ``min_match == 2``), verified token by token; a match shorter than ``min_match`` is
    discarded. The proposal is the continuation of the winner, up to k tokens, never past the end of the
    indexed history.

    Scheduler fields, set by every ``propose`` (all zero when there is no match):

    * ``last_match_len``: length of the winning backward match (``min_match..max_match``).
    * ``last_group``: number of distinct verified candidates whose match length equals ``last_match_len``.
    * ``last_freq``: how many of those ``last_group`` candidates have the same first continuation token as
      the winner (the winner included), so ``1 <= last_freq <= last_group``.
    * ``last_consensus``: ``last_freq / last_group``, the fraction of equal-length candidates agreeing on the
      first continuation token (1.0 for a single candidate).
    * ``last_dist``: how many tokens back the winner's match ends (its recency).
    """

    name = "lookup"
    # docs/adaptive.md "Acceptance": fitted on the replay trace's W1-W5; the match's recency and length and the
    # candidates' agreement carry most of what the buckets did
    priors = {"iso3": 0.83, "split": 0.88, "rep3": 0.88, "m4": 0.82, "m8": 0.79}
    weights = {"len": 0.45, "dist": -1.5, "split": -2.0, "agree": 0.26}

    @classmethod
    def build(cls, o, head, n_ctx: int) -> SuffixDrafter:
        return cls(min_match=o.min_match, max_history=o.lookup_window)

    @classmethod
    def _warm(cls) -> None:
        h = [1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3]
        d = cls(max_history=64)
        d.start(h[:6], 0)
        d.propose(h, 2)

    @classmethod
    def bucket(cls, signals: dict) -> str:
        ml = int(signals.get("match_len", 0))
        if signals.get("group", 1) >= 2 and signals.get("consensus", 1.0) < 0.5:
            return "split"  # equal-length candidates disagree on the next token
        if ml >= 8:
            return "m8"
        if ml >= 4:
            return "m4"
        return "rep3" if signals.get("freq", 1) >= 2 else "iso3"

    @classmethod
    def features(cls, signals: dict) -> dict[str, float]:
        ml, dist = signals.get("match_len", 0), signals.get("dist")
        f = {"len": math.log2(max(ml, 1)) - 3.0}  # 0 at an 8-token match
        if dist is not None:
            f["dist"] = math.log2(1 + dist) / 8 - 0.75  # 0 at 63 tokens back
        if signals.get("group", 1) >= 2:
            f["split"] = 1.0 - signals.get("consensus", 1.0)  # equal-length candidates that disagree
        return f

    def signals(self) -> dict:
        return {"match_len": self.last_match_len, "freq": self.last_freq, "group": self.last_group,
                "consensus": self.last_consensus, "dist": self.last_dist}

    def __init__(self, min_match: int = 3, max_match: int = 64, max_history: int = 65536,
                 table_bits: int | None = None):
        if min_match < 2:
            raise ValueError(f"min_match must be >= 2, got {min_match}")
        if max_match < min_match:
            raise ValueError(f"max_match must be >= min_match, got {max_match} < {min_match}")
        if table_bits is not None and not 0 <= table_bits <= 30:
            raise ValueError(f"table_bits must be in 0..30, got {table_bits}")
        self.min_match = int(min_match)
        self.max_match = int(max_match)
        self.table_bits = table_bits
        self._two = self.min_match == 2
        self.last_match_len = 0
        self.last_freq = 0
        self.last_group = 0
        self.last_consensus = 0.0
        self.last_dist = 0
        self._alloc(max_history)

    # ---------------------------------------------------------------- storage
    def _alloc(self, max_history: int) -> None:
        if max_history < 16:
            raise ValueError(f"max_history must be >= 16, got {max_history}")
        self.max_history = int(max_history)
        if self.table_bits is not None:
            n_slots = 1 << self.table_bits
        else:  # <= 1/2 distinct anchors per slot at a full window
            n_slots = next_pow2(2 * (2 if self._two else 1) * self.max_history)
        self._buf = np.zeros(self.max_history, np.int32)
        self._pos = np.full((n_slots, WAYS), -1, np.int32)
        self._tags = np.zeros(n_slots, np.uint32)
        self._mask = n_slots - 1
        self._n = 0  # tokens in the buffer
        self._base = 0  # absolute position of buf[0] (tokens dropped by compaction)

    @property
    def nbytes(self) -> int:
        """Bytes held by the drafter's arrays (token buffer + table)."""
        return self._buf.nbytes + self._pos.nbytes + self._tags.nbytes

    @property
    def indexed(self) -> int:
        """Absolute length of the history the index covers (dropped tokens included)."""
        return self._base + self._n

    def window(self) -> np.ndarray:
        """A copy of the tokens currently indexed (the newest part of the history)."""
        return self._buf[: self._n].copy()

    def set_max_history(self, n: int) -> None:
        """Bound the window to n tokens (re-allocating the table when table_bits is automatic).

        If more than n tokens are held, only the newest n // 2 are kept; the kept tokens are re-indexed."""
        toks = self._buf[: self._n].copy()
        base = self._base
        self._alloc(n)
        if toks.size > self.max_history:
            keep = self.max_history // 2
            base += toks.size - keep
            toks = toks[-keep:]
        self._base = base
        self._fill(toks)

    def _fill(self, toks: np.ndarray) -> None:
        """Index `toks` (already within capacity) into the freshly cleared buffer."""
        self._n, dropped = _append(self._buf, 0, np.ascontiguousarray(toks, np.int32), self._pos, self._tags,
                                   self._mask, self._two)
        self._base += dropped

    # ---------------------------------------------------------------- history sync
    def reset(self) -> None:
        self._n = 0
        self._base = 0
        self._pos.fill(-1)
        self._tags.fill(0)

    def _window_len(self, total: int) -> int:
        """How many tokens incremental appends of `total` tokens into an empty drafter would hold."""
        cap = self.max_history
        if total <= cap:
            return total
        half = cap // 2
        return half + (total - cap - 1) % (cap - half) + 1

    def rebuild(self, history: Sequence[int]) -> None:
        """Index `history` from scratch (same result as appending it token by token to an empty drafter)."""
        total = len(history)
        keep = self._window_len(total)
        self.reset()
        self._base = total - keep
        if keep:
            self._fill(np.asarray(history[total - keep :], np.int32).ravel())

    def start(self, history: Sequence[int], prompt_start: int = 0) -> None:
        """Make the index match `history`: append the rest if what is indexed is a prefix of it, else rebuild."""
        total = len(history)
        n, base = self._n, self._base
        if base + n <= total and (n == 0 or np.array_equal(
                np.asarray(history[base : base + n], np.int32).ravel(), self._buf[:n])):
            if base == 0 and n == 0:
                self.rebuild(history)
            elif total > base + n:
                self.append(history[base + n :])
        else:
            self.rebuild(history)

    def append(self, tokens) -> None:
        """Append tokens (an int or a sequence) to the history and index them: O(1) amortised per token."""
        arr = np.asarray(tokens, np.int32)
        if arr.ndim != 1:
            arr = arr.ravel()
        if arr.size == 0:
            return
        self._n, dropped = _append(self._buf, self._n, arr, self._pos, self._tags, self._mask, self._two)
        self._base += dropped

    def _sync(self, history: Sequence[int]) -> None:
        """O(new tokens): trusts that `history` extends what is indexed (the session only appends between
        start() calls), checking only its length and the last indexed token; rebuilds when either fails.
        Use start() (a full comparison) after arbitrary edits."""
        total = len(history)
        have = self._base + self._n
        if total == have:
            if self._n and history[total - 1] != self._buf[self._n - 1]:
                self.rebuild(history)
        elif total > have and (self._n == 0 or history[have - 1] == self._buf[self._n - 1]):
            self.append(history[have:])
        else:
            self.rebuild(history)

    # ---------------------------------------------------------------- proposing
    def propose(self, history: Sequence[int], k: int) -> np.ndarray:
        """Up to k tokens continuing `history` (int32; empty = no usable match)."""
        self._sync(history)
        n = self._n
        q, m, f, g = _lookup(self._buf, n, self._pos, self._tags, self._mask, self._two,
                             self.min_match, self.max_match)
        self.last_match_len, self.last_freq, self.last_group = m, f, g
        self.last_consensus = f / g if g else 0.0
        self.last_dist = n - 1 - q if q >= 0 else 0
        if q < 0 or k <= 0:
            return np.empty(0, np.int32)
        return self._buf[q + 1 : min(q + 1 + k, n)].copy()

    # ---------------------------------------------------------------- inspection (tests, debugging)
    def anchor_positions(self, gram: Sequence[int]) -> list[int]:
        """Absolute end positions stored for a 2- or 3-token anchor, newest first (unverified: tag matches)."""
        g = np.asarray(gram, np.int32).ravel()
        if g.size not in (2, 3):
            raise ValueError("anchors are 2- or 3-grams")
        s = _anchor_slot(self._tags, self._mask, g)
        if s < 0:
            return []
        return [int(p) + self._base for p in self._pos[s] if p >= 0]
