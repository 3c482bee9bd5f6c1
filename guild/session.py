"""GuildSession: one conversation's state and the decode loop (plain greedy for now; windows come in issue 3).

Time is measured here and nowhere in the model: the stats are what `guild run` prints.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from .errors import BadFlagError, ContextOverflowError


@dataclass
class GenerationStats:
    prompt_tokens: int = 0
    generated_tokens: int = 0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    stop_reason: str = ""

    @property
    def prefill_tok_s(self) -> float:
        return self.prompt_tokens / self.prefill_s if self.prefill_s else 0.0

    @property
    def decode_tok_s(self) -> float:
        # the first generated token comes from the prefill logits; later ones cost one forward each
        n = max(self.generated_tokens - 1, 0)
        return n / self.decode_s if self.decode_s and n else 0.0

    @property
    def ms_per_token(self) -> float:
        t = self.decode_tok_s
        return 1000.0 / t if t else 0.0

    def as_dict(self) -> dict:
        d = asdict(self)
        d.update(
            prefill_tok_s=round(self.prefill_tok_s, 2),
            decode_tok_s=round(self.decode_tok_s, 2),
            ms_per_token=round(self.ms_per_token, 3),
        )
        return d


class GuildSession:
    """Owns a model state (KV cache) for one conversation."""

    def __init__(self, model, n_ctx: int | None = None, prefill_batch: int = 512, eos_ids: Sequence[int] = ()):
        if prefill_batch < 1:
            raise BadFlagError(f"--prefill-batch must be >= 1, got {prefill_batch}")
        self.model = model
        self.state = model.new_state(n_ctx)
        self.prefill_batch = prefill_batch
        self.eos_ids = frozenset(int(i) for i in eos_ids)

    @property
    def n_ctx(self) -> int:
        return self.state.n_ctx

    def prefill(self, tokens: Sequence[int]) -> np.ndarray:
        """Feed the prompt in chunks of up to prefill_batch rows; returns the last row's logits [vocab]."""
        tokens = np.asarray(tokens, np.int64)
        if tokens.size == 0:
            raise BadFlagError("empty prompt")
        if self.state.pos + tokens.size >= self.n_ctx:
            raise ContextOverflowError(
                f"prompt of {tokens.size} tokens does not fit --context {self.n_ctx} "
                f"({self.state.pos} already used; at least one generated token must fit)"
            )
        logits = None
        for s in range(0, tokens.size, self.prefill_batch):
            chunk = tokens[s : s + self.prefill_batch]
            logits = self.model.forward(chunk, self.state, last_only=True)
            self.state.commit(chunk.size)
        return logits[-1]

    def generate(
        self, prompt: Sequence[int], max_tokens: int, on_token: Callable[[int], None] | None = None
    ) -> tuple[list[int], GenerationStats]:
        """Greedy plain decoding: prefill, then one token per forward until EOS, max_tokens or the context."""
        if max_tokens < 1:
            raise BadFlagError(f"--max-tokens must be >= 1, got {max_tokens}")
        st = GenerationStats(prompt_tokens=len(prompt))
        t0 = time.perf_counter()
        logits = self.prefill(prompt)
        st.prefill_s = time.perf_counter() - t0
        out: list[int] = []
        t0 = time.perf_counter()
        while True:
            tok = int(np.argmax(logits))
            out.append(tok)
            if on_token is not None:
                on_token(tok)
            if tok in self.eos_ids:
                st.stop_reason = "eos"
                break
            if len(out) >= max_tokens:
                st.stop_reason = "max_tokens"
                break
            if self.state.pos >= self.n_ctx:
                st.stop_reason = "context"
                break
            logits = self.model.forward([tok], self.state)[0]
            self.state.commit(1)
        st.decode_s = time.perf_counter() - t0
        st.generated_tokens = len(out)
        return out, st
