"""A grammar over the tokens a generation emits (constrained decoding), as the engine sees it.

The mask of the matcher's state after the committed tokens plus d1..dt applies to row t of a verification
window exactly as it applies to the plain step at that position, so speculative and plain constrained decoding
emit the same tokens (docs/contracts.md "Sampling"). The verifier walks the window row by row and advances the
matcher only over tokens it emits, so a rejected draft never enters it; drafts the grammar refuses are cut
before the window runs (they could never be accepted). The grammar itself is compiled in guild.text.grammar.
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

    def allowed(self, n_logits: int) -> np.ndarray:
        """bool [n_logits]: the tokens the grammar allows next (output rows past the vocabulary never)."""
        m = self.matcher
        if m.is_error():
            raise ConstraintError(f"grammar: {m.get_error()}")
        bits = np.unpackbits(np.frombuffer(m.compute_bitmask(), np.uint8), bitorder="little")
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

    def valid_prefix(self, draft: Sequence[int]) -> int:
        """How many leading draft tokens the grammar would take from here (the state is unchanged)."""
        if len(draft) == 0:
            return 0
        return int(self.matcher.validate_tokens([int(t) for t in draft]))

    @property
    def accepting(self) -> bool:
        return bool(self.matcher.is_accepting())
