"""GuildSession: one conversation's state and the decode loop.

Prefill the prompt in chunks, then run verification windows [root, d1..dk] until EOS, max_tokens or the
context ends. Drafts come from a drafter (empty = plain step); the Verifier keeps exactly what plain decoding
would have produced. Time is measured here, never inside drafters or the model, and kept per window.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from .errors import BadFlagError, ContextOverflowError
from .sampling import GREEDY, SamplingParams, sample
from .spec import Drafter, NoDrafter
from .verify import Verifier

MAX_DRAFT = 7  # k <= 7: windows of T <= 8 rows (DESIGN.md "Window")


@dataclass(frozen=True)
class WindowRecord:
    strategy: str
    k: int  # drafts proposed (after cropping)
    draft_ms: float
    verify_ms: float  # forward of the window + accept rule + commit
    kept: int  # window inputs committed
    emitted: int  # tokens emitted (accepted drafts + 1)
    distinct_experts: tuple[int, ...]  # per layer, union of experts over the window's rows (MoE models)


@dataclass
class GenerationStats:
    prompt_tokens: int = 0
    generated_tokens: int = 0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    stop_reason: str = ""
    windows: list[WindowRecord] = field(default_factory=list)

    @property
    def prefill_tok_s(self) -> float:
        return self.prompt_tokens / self.prefill_s if self.prefill_s else 0.0

    @property
    def decode_tok_s(self) -> float:
        # the first generated token comes from the prefill logits; the rest from the windows
        n = max(self.generated_tokens - 1, 0)
        return n / self.decode_s if self.decode_s and n else 0.0

    @property
    def ms_per_token(self) -> float:
        t = self.decode_tok_s
        return 1000.0 / t if t else 0.0

    def summary(self) -> dict:
        w = self.windows
        drafted = sum(r.k for r in w)
        accepted = sum(r.emitted - 1 for r in w)
        by_strategy: dict[str, dict] = {}
        for r in w:
            s = by_strategy.setdefault(r.strategy, {"windows": 0, "tokens": 0, "drafted": 0, "accepted": 0})
            s["windows"] += 1
            s["tokens"] += r.emitted
            s["drafted"] += r.k
            s["accepted"] += r.emitted - 1
        return {
            "windows": len(w),
            "drafted": drafted,
            "accepted": accepted,
            "acceptance": round(accepted / drafted, 4) if drafted else None,
            "tokens_per_window": round(sum(r.emitted for r in w) / len(w), 3) if w else None,
            "t_histogram": dict(sorted(Counter(r.k + 1 for r in w).items())),
            "strategies": by_strategy,
        }

    def as_dict(self) -> dict:
        d = {k: v for k, v in asdict(self).items() if k != "windows"}
        d.update(
            prefill_tok_s=round(self.prefill_tok_s, 2),
            decode_tok_s=round(self.decode_tok_s, 2),
            ms_per_token=round(self.ms_per_token, 3),
            **self.summary(),
        )
        return d


class GuildSession:
    """Owns a model state (KV cache) and the token history of one conversation."""

    def __init__(self, model, n_ctx: int | None = None, prefill_batch: int = 512, eos_ids: Sequence[int] = ()):
        if prefill_batch < 1:
            raise BadFlagError(f"--prefill-batch must be >= 1, got {prefill_batch}")
        self.model = model
        self.state = model.new_state(n_ctx)
        self.prefill_batch = prefill_batch
        self.eos_ids = frozenset(int(i) for i in eos_ids)
        self.tokens: list[int] = []  # every token of the conversation; the first state.pos are in the cache

    @property
    def n_ctx(self) -> int:
        return self.state.n_ctx

    def prefill(self, tokens: Sequence[int]) -> np.ndarray:
        """Append tokens and feed everything not yet in the cache, in chunks of up to prefill_batch rows.
        Returns the last row's logits [vocab]."""
        new = [int(t) for t in tokens]
        pending = self.tokens[self.state.pos :] + new
        if not pending:
            raise BadFlagError("empty prompt")
        if self.state.pos + len(pending) >= self.n_ctx:
            raise ContextOverflowError(
                f"prompt of {len(pending)} tokens does not fit --context {self.n_ctx} "
                f"({self.state.pos} already used; at least one generated token must fit)"
            )
        self.tokens += new
        arr = np.asarray(pending, np.int64)
        logits = None
        for s in range(0, arr.size, self.prefill_batch):
            chunk = arr[s : s + self.prefill_batch]
            logits = self.model.forward(chunk, self.state, last_only=True)
            self.state.commit(chunk.size)
        return logits[-1]

    def generate(
        self,
        prompt: Sequence[int],
        max_tokens: int,
        on_token: Callable[[int], None] | None = None,
        *,
        sampling: SamplingParams = GREEDY,
        drafter: Drafter | None = None,
        max_draft: int = 4,
        strategy: str | None = None,
    ) -> tuple[list[int], GenerationStats]:
        """Decode up to max_tokens after `prompt`; returns the emitted ids and the stats."""
        if max_tokens < 1:
            raise BadFlagError(f"--max-tokens must be >= 1, got {max_tokens}")
        if not 0 <= max_draft <= MAX_DRAFT:
            raise BadFlagError(f"--spec-max-draft must be in 0..{MAX_DRAFT}, got {max_draft}")
        drafter = drafter or NoDrafter()
        strategy = strategy or drafter.name
        verifier = Verifier(sampling, self.eos_ids)
        st = GenerationStats(prompt_tokens=len(prompt))
        t0 = time.perf_counter()
        prompt_start = len(self.tokens)
        logits = self.prefill(prompt)
        st.prefill_s = time.perf_counter() - t0
        drafter.start(self.tokens, prompt_start)

        out: list[int] = []
        t0 = time.perf_counter()
        first = sample(logits, self.tokens, len(self.tokens), sampling)
        self._emit([first], out, on_token)
        st.stop_reason = self._stop_reason(first, out, max_tokens)
        while not st.stop_reason:
            pos0 = self.state.pos  # the root (last emitted token) goes here
            room = min(max_tokens - len(out) - 1, self.n_ctx - pos0 - 1, max_draft)
            td = time.perf_counter()
            draft = np.asarray(drafter.propose(self.tokens, room), np.int64)[:room] if room > 0 else ()
            tv = time.perf_counter()
            window = [self.tokens[-1], *(int(d) for d in draft)]
            logits = self.model.forward(window, self.state)
            res = verifier.verify(logits, window, self.tokens, pos0, max_tokens - len(out))
            self.state.commit(res.keep)
            te = time.perf_counter()
            st.windows.append(WindowRecord(
                strategy if len(window) > 1 else "normal", len(window) - 1, (tv - td) * 1e3, (te - tv) * 1e3,
                res.keep, len(res.tokens), tuple(int(x) for x in self.state.distinct_experts),
            ))
            self._emit(res.tokens, out, on_token)
            st.stop_reason = res.stop or ("context" if self.state.pos >= self.n_ctx else "")
        st.decode_s = time.perf_counter() - t0
        st.generated_tokens = len(out)
        return out, st

    def rewind(self, n: int) -> None:
        """Keep the first n tokens of the conversation (and of the cache)."""
        self.tokens = self.tokens[:n]
        self.state.truncate(n)

    def _emit(self, toks: list[int], out: list[int], on_token) -> None:
        for t in toks:
            self.tokens.append(t)
            out.append(t)
            if on_token is not None:
                on_token(t)

    def _stop_reason(self, tok: int, out: list[int], max_tokens: int) -> str:
        if tok in self.eos_ids:
            return "eos"
        if len(out) >= max_tokens:
            return "max_tokens"
        if self.state.pos >= self.n_ctx:
            return "context"
        return ""
