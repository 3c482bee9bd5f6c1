"""Verifier: the exact accept rule for a window of T = 1 + k rows (docs/contracts.md "Window").

Row t of the window [root, d1..dk] predicts absolute position pos0 + t + 1 from the history up to d_t. Its
target token Y is drawn exactly as plain decoding would draw it (same logits by row invariance, same
penalty history, same position-keyed u, the same grammar state), so accepting the longest prefix with
d_{t+1} == Y_t and emitting Y at the first mismatch (or as the bonus after the last draft) reproduces plain
decoding token for token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from .constraint import Constraint
from .sampling import SamplingParams, TokenLogprob, logprobs, target


@dataclass(frozen=True)
class WindowResult:
    tokens: list[int]  # emitted: accepted drafts then the correction / bonus token
    keep: int  # window inputs to commit (root + accepted drafts)
    accepted: int  # drafts accepted
    stop: str | None  # "eos" or "max_tokens" if the generation ends inside this window
    logprobs: list[TokenLogprob] = field(default_factory=list)  # per emitted token, when asked for


class Verifier:
    """`constraint`: a grammar the emitted tokens follow (its matcher advances over each emitted token);
    `n_logprobs`: None, or how many top alternatives each emitted token's TokenLogprob lists."""

    def __init__(self, params: SamplingParams, eos_ids: Sequence[int] = (), constraint: Constraint | None = None,
                 n_logprobs: int | None = None):
        self.params = params
        self.eos_ids = frozenset(int(i) for i in eos_ids)
        self.constraint, self.n_logprobs = constraint, n_logprobs

    def draw(self, row: np.ndarray, history: Sequence[int], position: int) -> tuple[int, TokenLogprob | None]:
        """The token plain decoding emits at `position` from this row's logits (and the grammar advanced
        over it), with its log-probabilities when asked for."""
        c = self.constraint
        y, z = target(row, history, position, self.params, None if c is None else c.allowed(row.shape[-1]))
        if c is not None:
            c.advance(y)
        return y, None if self.n_logprobs is None else logprobs(z, y, self.n_logprobs)

    def verify(self, logits: np.ndarray, window: Sequence[int], history: list[int], pos0: int,
               max_emit: int) -> WindowResult:
        """logits [T, vocab] of `window` = [root, d1..dk] fed at positions pos0..; `history` is every token
        before the root's successor (ending with the root). At most `max_emit` (>= 1) tokens are emitted."""
        T = len(window)
        staged = list(history)  # row t sees history + d1..dt
        out: list[int] = []
        lps: list[TokenLogprob] = []
        for t in range(T):
            y, lp = self.draw(logits[t], staged, pos0 + t + 1)
            out.append(y)
            if lp is not None:
                lps.append(lp)
            match = t + 1 < T and window[t + 1] == y
            if y in self.eos_ids:  # nothing after EOS is committed
                return WindowResult(out, t + 1, t + match, "eos", lps)
            if len(out) >= max_emit:
                return WindowResult(out, t + 1, t + match, "max_tokens", lps)
            if match:
                staged.append(y)
                continue
            return WindowResult(out, t + 1, t, None, lps)
        raise AssertionError("unreachable: the last row always emits")
