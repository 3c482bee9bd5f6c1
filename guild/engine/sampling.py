"""The sampling chain and position-keyed draws (docs/contracts.md "Sampling").

Chain, in llama.cpp's order: repetition / frequency / presence penalties → top_k → top_p → min_p →
temperature → inverse CDF. The target token at absolute position q is Y_q = F⁻¹(u_q) over the processed
distribution, its survivors taken in ascending token id (the canonical order), with u_q = Philox(seed, q):
the first 64-bit output of numpy's Philox4x64-10 keyed by the seed with its counter set to q, as a float in
[0, 1) from the top 53 bits. A draw depends on (seed, q) alone, so plain and speculative decoding, which
evaluate the same positions, emit the same tokens for any seed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import BadFlagError


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off
    min_p: float = 0.0  # 0 = off
    repeat_penalty: float = 1.0  # 1 = off
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    penalty_last_n: int = 64  # tokens of history the penalties look at; 0 = none, -1 = all
    seed: int = 0

    def __post_init__(self):
        def bad(flag, why, v):
            raise BadFlagError(f"{flag} {why}, got {v}")

        if not np.isfinite(self.temperature) or self.temperature < 0:
            bad("--temperature", "must be >= 0", self.temperature)
        if self.top_k < 0:
            bad("--top-k", "must be >= 0 (0 = off)", self.top_k)
        if not 0.0 < self.top_p <= 1.0:
            bad("--top-p", "must be in (0, 1]", self.top_p)
        if not 0.0 <= self.min_p <= 1.0:
            bad("--min-p", "must be in [0, 1]", self.min_p)
        if not np.isfinite(self.repeat_penalty) or self.repeat_penalty <= 0:
            bad("--repeat-penalty", "must be > 0 (1 = off)", self.repeat_penalty)
        for flag, v in (("--frequency-penalty", self.frequency_penalty), ("--presence-penalty", self.presence_penalty)):
            if not np.isfinite(v) or abs(v) > 100:
                bad(flag, "must be a finite number in [-100, 100]", v)
        if self.penalty_last_n < -1:
            bad("--repeat-last-n", "must be >= -1 (-1 = whole context)", self.penalty_last_n)
        if not 0 <= self.seed < 2**64:
            bad("--seed", "must be in [0, 2^64)", self.seed)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def penalized(self) -> bool:
        return self.penalty_last_n != 0 and (
            self.repeat_penalty != 1.0 or self.frequency_penalty != 0.0 or self.presence_penalty != 0.0
        )


GREEDY = SamplingParams()


def philox_uniform(seed: int, q: int) -> float:
    """u_q in [0, 1): Philox4x64-10 keyed by `seed`, counter q, first output's top 53 bits."""
    x = int(np.random.Philox(key=seed, counter=q).random_raw())
    return (x >> 11) * (1.0 / 9007199254740992.0)


def apply_penalties(logits: np.ndarray, history: Sequence[int], p: SamplingParams) -> np.ndarray:
    """Penalised copy of one row's logits [vocab] given the token history (llama.cpp's penalties sampler)."""
    if not p.penalized or len(history) == 0:
        return logits
    tail = history if p.penalty_last_n == -1 else history[-p.penalty_last_n :]
    ids, counts = np.unique(np.asarray(tail, np.int64), return_counts=True)
    z = logits.copy()
    v = z[ids]
    v = np.where(v <= 0, v * np.float32(p.repeat_penalty), v / np.float32(p.repeat_penalty))
    v = v - (counts * np.float32(p.frequency_penalty) + np.float32(p.presence_penalty)).astype(np.float32)
    z[ids] = v.astype(np.float32)
    return z


def _top_k(z: np.ndarray, k: int) -> np.ndarray:
    """Ids of the k largest logits, ties at the boundary to the lower id; ascending."""
    if k >= z.size:
        return np.arange(z.size)
    thr = z[np.argpartition(-z, k - 1)[:k]].min()
    above = np.flatnonzero(z > thr)
    tied = np.flatnonzero(z == thr)[: k - above.size]
    return np.sort(np.concatenate([above, tied]))


def process(logits: np.ndarray, p: SamplingParams, allowed: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The processed distribution of one (already penalised) row: survivor ids ascending and their
    probabilities (float64, summing to 1) after a grammar's mask (`allowed`, bool [vocab]) → top_k → top_p →
    min_p → temperature."""
    z = np.asarray(logits, np.float32)
    if allowed is None:
        ids = _top_k(z, p.top_k) if p.top_k > 0 else np.arange(z.size)
    else:  # the mask first, so that top_k counts only tokens the grammar allows
        ids = np.flatnonzero(allowed)
        if p.top_k > 0:
            ids = ids[_top_k(z[ids], p.top_k)]
    zs = z[ids].astype(np.float64)
    if p.top_p < 1.0:
        order = np.lexsort((ids, -zs))  # by probability descending, ties to the lower id
        e = np.exp(zs[order] - zs[order[0]])
        cum = np.cumsum(e / e.sum())
        n = int(np.searchsorted(cum, p.top_p, side="left")) + 1  # smallest prefix reaching top_p
        keep = np.sort(order[: min(n, order.size)])
        ids, zs = ids[keep], zs[keep]
    if p.min_p > 0.0:
        keep = zs >= zs.max() + np.log(p.min_p)
        ids, zs = ids[keep], zs[keep]
    t = p.temperature if p.temperature > 0 else 1.0
    e = np.exp((zs - zs.max()) / t)
    return ids, e / e.sum()


def target(logits: np.ndarray, history: Sequence[int], position: int, p: SamplingParams,
           allowed: np.ndarray | None = None) -> tuple[int, np.ndarray]:
    """Y_q for one row (the token at absolute position `position` given the history before it) and the row the
    chain drew it from: penalised, and -inf wherever a grammar's mask `allowed` (bool [vocab]) says no."""
    z = apply_penalties(np.asarray(logits, np.float32), history, p)
    if allowed is not None:
        z = np.where(allowed, z, np.float32(-np.inf))
    if p.greedy:
        return int(np.argmax(z)), z  # first maximum = lowest id
    ids, probs = process(z, p, allowed)
    u = philox_uniform(p.seed, position)
    i = int(np.searchsorted(np.cumsum(probs), u, side="right"))
    return int(ids[min(i, ids.size - 1)]), z


def sample(logits: np.ndarray, history: Sequence[int], position: int, p: SamplingParams,
           allowed: np.ndarray | None = None) -> int:
    """Y_q for one row: the token at absolute position `position` given the history before it."""
    return target(logits, history, position, p, allowed)[0]


MAX_TOP_LOGPROBS = 20  # OpenAI's limit


@dataclass(frozen=True)
class TokenLogprob:
    token: int
    logprob: float
    top: tuple[tuple[int, float], ...]  # the most likely tokens, most likely first (ties: lower id first)


def logprobs(z: np.ndarray, token: int, n_top: int) -> TokenLogprob:
    """The emitted token's log-probability and the `n_top` most likely, under log-softmax of the row the chain
    drew from (`target`'s: penalties and the grammar's mask applied; temperature 1, no truncation), in float64."""
    x = np.asarray(z, np.float64)
    m = x.max()
    lp = x - (m + np.log(np.exp(x - m).sum()))
    top: tuple = ()
    if n_top > 0:
        n = min(n_top, lp.size)
        cand = np.argpartition(-lp, n - 1)[:n]
        thr = lp[cand].min()
        pool = np.flatnonzero(lp >= thr)  # every tie at the boundary, so the lower ids win it
        order = pool[np.lexsort((pool, -lp[pool]))][:n]
        top = tuple((int(i), float(lp[i])) for i in order)
    return TokenLogprob(int(token), float(lp[token]), top)
