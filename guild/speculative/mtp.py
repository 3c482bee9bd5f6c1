"""`--decode-strategy mtp`: greedy drafts from the model's MTP head (guild/models/mtp.py).

The session hands over the base's final hidden rows of everything it commits (`observe_hidden`). At propose
time the head first catches its own KV cache up over the committed rows it has not seen (one batched pass, no
LM head but the last row's, whose logits are draft 1), commits them, then chains on its own output for drafts
2..k and rolls those rows back: the head's cache always holds exactly the committed positions, so catch-up
after any accept/reject equals a fresh recompute (tests/models/test_mtp.py).

Drafts are greedy (argmax), so the verifier's exact rule holds for sampling too. `last_prob` is the head's
top-1 probability of draft 1 — the scheduler's confidence signal (docs/adaptive.md "MTP confidence"). With
`min_p > 0` a window whose first draft is less likely than that is a plain step, and the chain stops at the
first draft under it. No I/O, no clock.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ..errors import BadFlagError
from ..window import MAX_DRAFT
from .base import Drafter, top1


class MtpDrafter(Drafter):
    name = "mtp"
    lazy = True  # a head forward per proposal: the adaptive scheduler asks only when it could pay
    follows_rows = True  # catches its own cache up over the base's committed rows
    uses_head = needs_head = True
    priors = {"lo": 0.21, "mid": 0.45, "hi": 0.76}
    weights = {"prob": 0.85, "agree": 2.0}  # a copying drafter starting with the head's token: mostly right

    @classmethod
    def build(cls, o, head, n_ctx: int) -> MtpDrafter:
        if head is None:
            raise BadFlagError("--decode-strategy mtp needs an MTP head (guild train-mtp MODEL -o HEAD.gguf)")
        return cls(head, n_ctx, max_k=o.mtp.depth(head), min_p=o.mtp.min_p)

    @classmethod
    def member(cls, o, head, n_ctx: int) -> MtpDrafter | None:
        # the scheduler weighs the head's confidence itself: no min_p here
        return None if head is None else cls(head, n_ctx, max_k=o.mtp.depth(head))

    @classmethod
    def bucket(cls, signals: dict) -> str:
        p = float(signals.get("prob", 0.0))  # the head's top-1 probability of the first draft
        return "hi" if p >= 0.8 else "mid" if p >= 0.5 else "lo"

    @classmethod
    def features(cls, signals: dict) -> dict[str, float]:
        # the head's confidence within its bucket: its probability's logit beside the bucket's typical one
        p = min(max(float(signals.get("prob", 0.0)), 1e-3), 1 - 1e-3)
        q = cls.priors[cls.bucket(signals)]
        return {"prob": math.log(p / (1 - p) * (1 - q) / q)}

    def __init__(self, head, n_ctx: int, max_k: int = 3, min_p: float = 0.0):
        if not 1 <= max_k <= MAX_DRAFT:
            raise ValueError(f"mtp max_k must be in 1..{MAX_DRAFT}, got {max_k}")
        self.head, self.max_k, self.min_p = head, max_k, min_p
        self.cache = head.new_cache(n_ctx)
        self._rows: list[tuple] = []  # (position, final residual rows, fused layers' rows) not yet in the cache
        self.last_prob = 0.0
        self.catchup_rows = 0  # rows the last propose caught up (the M_catchup part of its cost)

    # -- the session's hooks --------------------------------------------------------------------------------
    def observe_hidden(self, pos0: int, rows, features=()) -> None:
        """The base committed rows at positions pos0..; rows: their final residuals [n, dim], features: their
        output rows of the layers the head fuses (ForwardResult.features)."""
        end = self._end()
        if pos0 < end:  # a rewind: forget what is past pos0
            self._rows = [(p, r[: max(0, pos0 - p)], tuple(f[: max(0, pos0 - p)] for f in fs))
                          for p, r, fs in self._rows if p < pos0]
            if self.cache.pos > pos0:
                self.cache.truncate(pos0)
            end = self._end()
        if pos0 != end:
            raise RuntimeError(f"MtpDrafter: rows at {pos0} after {end} (the drafter missed the rows between)")
        if len(rows):
            self._rows.append((pos0, rows, tuple(features)))

    def signals(self) -> dict:
        return {"prob": self.last_prob}

    def start(self, history: Sequence[int], prompt_start: int) -> None:
        """After the prompt's prefill: catch up over its rows now (the session counts this as prefill), all but
        the last, whose token is the one about to be sampled."""
        n = self._end() - self.cache.pos - 1
        if n > 0:
            p, r, fs = self._rows[-1]
            self._rows[-1] = (p, r[:-1], tuple(f[:-1] for f in fs))
            self.catch_up(history, False)
            self._rows = [(p + len(r) - 1, r[-1:], tuple(f[-1:] for f in fs))]

    def _end(self) -> int:
        return self._rows[-1][0] + len(self._rows[-1][1]) if self._rows else self.cache.pos

    # -- drafting -----------------------------------------------------------------------------------------
    def catch_up(self, history: Sequence[int], with_logits: bool) -> tuple[np.ndarray, np.ndarray | None]:
        """Run the head over the pending committed rows (row p reads token history[p+1]) and commit them.
        Returns (the last row's normed output [1, dim], its draft logits or None)."""
        rows = [r for r in self._rows if len(r[1])]
        self._rows = []
        x, *fs = (np.concatenate(c) if len(rows) > 1 else c[0]
                  for c in zip(*((r, *f) for _, r, f in rows), strict=True))
        p0 = self.cache.pos
        toks = np.asarray(history[p0 + 1 : p0 + 1 + x.shape[0]], np.int64)
        h, logits = self.head.forward(toks, self.head.base_hidden(x, fs), self.cache, 1 if with_logits else 0)
        self.cache.commit(toks.size)
        self.catchup_rows = toks.size
        return h[-1:], logits

    def propose(self, history: Sequence[int], k: int) -> np.ndarray:
        self.last_prob = 0.0
        self.catchup_rows = 0
        if k <= 0 or not self._rows:
            return np.empty(0, np.int32)
        h, logits = self.catch_up(history, True)
        committed = self.cache.pos
        drafts: list[int] = []
        for i in range(min(k, self.max_k)):
            if i:
                h, logits = self.head.forward([drafts[-1]], h, self.cache, 1)
                self.cache.commit(1)
            j, p = top1(logits[0])
            if i == 0:
                self.last_prob = p
            if p < self.min_p:
                break
            drafts.append(self.head.token(j))
        if self.cache.pos > committed:
            self.cache.truncate(committed)  # chained rows are speculative: the cache keeps committed rows only
        return np.asarray(drafts, np.int32)
