"""A grammar over the tokens a generation emits (constrained decoding), as the engine sees it.

The mask of the matcher's state after the committed tokens plus d1..dt applies to row t of a verification
window exactly as it applies to the plain step at that position, so speculative and plain constrained decoding
emit the same tokens (docs/contracts.md "Sampling"). The verifier walks the window row by row and advances the
matcher only over tokens it emits, so a rejected draft never enters it; drafts the grammar refuses are cut
before the window runs (they could never be accepted). The grammar itself is compiled in guild.text.grammar.

Where the mask allows a single token that token is emitted whatever the logits (greedy or sampled), so a drafter
may propose it as a certain draft (`forced`). The masks computed to find it are the ones the verifier needs at
those positions, so they are kept, keyed by the tokens between the committed state and theirs.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..errors import GuildError


class ConstraintError(GuildError):
    """The matcher refused a token it had allowed, or hit one of its limits."""


class Constraint:
    """One generation's matcher (llguidance's LLMatcher) over a vocabulary of `vocab` ids; `eos_ids` (which the
    matcher allows wherever the grammar accepts) end the generation rather than enter the matcher."""

    def __init__(self, matcher, vocab: int, eos_ids: Sequence[int]):
        self.matcher, self.vocab = matcher, vocab
        self.eos_ids = np.asarray(sorted(int(i) for i in eos_ids if 0 <= int(i) < vocab), np.int64)
        # packed masks (llguidance's little-endian bits) of the states `path` tokens past the committed one: the
        # state is a function of the tokens consumed, so a kept mask is the one compute_bitmask would return
        self._masks: dict[tuple[int, ...], np.ndarray] = {}

    def _mask(self, path: tuple[int, ...]) -> np.ndarray:
        """The packed mask of the matcher's current state, which is `path` past the committed one."""
        bits = self._masks.get(path)
        if bits is None:
            m = self.matcher
            if m.is_error():
                raise ConstraintError(f"grammar: {m.get_error()}")
            bits = self._masks[path] = np.frombuffer(m.compute_bitmask(), np.uint8)
        return bits

    def allowed(self, n_logits: int) -> np.ndarray:
        """bool [n_logits]: the tokens the grammar allows next (output rows past the vocabulary never)."""
        bits = np.unpackbits(self._mask(()), bitorder="little")
        out = np.zeros(n_logits, bool)
        n = min(n_logits, self.vocab, bits.size)
        out[:n] = bits[:n].astype(bool)
        if not out.any():
            raise ConstraintError("grammar: no token is allowed next")
        return out

    def advance(self, token: int) -> None:
        """The matcher takes an emitted token (an end-of-generation token ends it instead)."""
        if token in self.eos_ids:
            return
        if not self.matcher.consume_token(int(token)):
            raise ConstraintError(f"grammar: token {token} refused: {self.matcher.get_error()}")
        t = int(token)
        self._masks = {p[1:]: b for p, b in self._masks.items() if p and p[0] == t}

    def valid_prefix(self, draft: Sequence[int]) -> int:
        """How many leading draft tokens the grammar would take from here (the state is unchanged)."""
        if len(draft) == 0:
            return 0
        return int(self.matcher.validate_tokens([int(t) for t in draft]))

    def forced(self, path: Sequence[int] = (), limit: int = 1) -> tuple[int, ...]:
        """Up to `limit` tokens the grammar forces after the committed tokens plus `path` (which it must take):
        each is the only token its state's mask allows, so decoding emits it whatever the logits. An
        end-of-generation token is never among them. The state is unchanged."""
        path = tuple(int(t) for t in path)
        if limit <= 0:
            return ()
        m = self.matcher
        if path and not m.consume_tokens(list(path)):
            raise ConstraintError(f"grammar: draft refused: {m.get_error()}")
        out: list[int] = []
        try:
            while len(out) < limit:
                t = _single(self._mask(path + tuple(out)))
                if t is None or t >= self.vocab or t in self.eos_ids or not m.consume_token(t):
                    break
                out.append(t)
        finally:
            if path or out:
                m.rollback(len(path) + len(out))
        return tuple(out)

    @property
    def accepting(self) -> bool:
        return bool(self.matcher.is_accepting())


def _single(bits: np.ndarray) -> int | None:
    """The one token a packed mask allows, or None when it allows none or several."""
    nz = np.flatnonzero(bits)
    if nz.size != 1:
        return None
    b = int(bits[nz[0]])
    return int(nz[0]) * 8 + b.bit_length() - 1 if b & (b - 1) == 0 else None
