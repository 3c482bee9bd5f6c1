"""Drafters propose draft tokens for a verification window; the verifier decides what is kept.

A drafter is a plain object with no I/O and no clock, owned by one session:
- `propose(history, k)` returns up to k token ids (int32; empty = a plain one-token step this window)
  continuing `history` (every token so far, ending with the root that the window will feed first);
- `start(history, prompt_start)` (optional) is called when a generation starts (history[prompt_start:] is the
  new prompt; earlier tokens are previous turns), so the drafter can re-sync its indexes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from ..errors import BadFlagError

STRATEGIES = ("normal", "lookup", "retrieval", "mtp", "adaptive")


class Drafter(Protocol):
    name: str

    def propose(self, history: Sequence[int], k: int) -> np.ndarray: ...

    def start(self, history: Sequence[int], prompt_start: int) -> None: ...


class NoDrafter:
    """Plain decoding: never proposes."""

    name = "normal"

    def propose(self, history: Sequence[int], k: int) -> np.ndarray:
        return np.empty(0, np.int32)

    def start(self, history: Sequence[int], prompt_start: int) -> None:
        pass


MTP_K = 1  # default MTP draft depth: an untrained chain is seldom right past its first draft (README numbers)
MTP_VOCAB = 8192  # draft LM head rows by default (0 = the whole vocabulary): same acceptance, half the step (README)


@dataclass(frozen=True)
class MtpOptions:
    """How the MTP head drafts (`--mtp-head`, `--spec-mtp-k`, `--spec-min-p`, `--spec-mtp-vocab`)."""

    head: str | None = None  # a head GGUF (default: the model's nextn block, a sidecar beside it, a shipped one)
    k: int = MTP_K  # drafts per window at most
    min_p: float = 0.0  # fixed mtp: a plain step when the head's top-1 probability is below this
    vocab: int = MTP_VOCAB  # score only the head's most frequent `vocab` tokens (0 = all)

    def __post_init__(self):
        if not 1 <= self.k <= 7:
            raise BadFlagError(f"--spec-mtp-k must be in 1..7, got {self.k}")
        if not 0.0 <= self.min_p < 1.0:
            raise BadFlagError(f"--spec-min-p must be in [0, 1), got {self.min_p}")
        if self.vocab < 0:
            raise BadFlagError(f"--spec-mtp-vocab must be >= 0, got {self.vocab}")


def check_flags(strategy: str, *, min_match: int = 3, lookup_window: int = 65536) -> None:
    """The strategy flags' values, checked before any model is loaded."""
    if strategy not in STRATEGIES:
        raise BadFlagError(f"--decode-strategy must be one of {', '.join(STRATEGIES)}, got '{strategy}'")
    if min_match not in (2, 3):
        raise BadFlagError(f"--spec-min-match must be 2 or 3, got {min_match}")
    if lookup_window < 64:
        raise BadFlagError(f"--spec-lookup-window must be >= 64, got {lookup_window}")


def make_drafter(strategy: str, *, min_match: int = 3, lookup_window: int = 65536, costs=None, mtp_head=None,
                 n_ctx: int = 4096, mtp: MtpOptions = MtpOptions()) -> Drafter:
    """The drafter for `--decode-strategy`. `costs` (a SpecCosts from a plan, or None) seeds the adaptive
    scheduler's cost model; `mtp_head` (guild.models.mtp, or None) drafts for `mtp` and joins `adaptive`, with
    its own KV cache of n_ctx rows, at most mtp.k drafts a window."""
    check_flags(strategy, min_match=min_match, lookup_window=lookup_window)
    if strategy == "normal":
        return NoDrafter()
    if strategy == "lookup":
        from .suffix_drafter import SuffixDrafter

        return SuffixDrafter(min_match=min_match, max_history=lookup_window)
    if strategy == "retrieval":
        from .retrieval_drafter import RetrievalDrafter

        return RetrievalDrafter()
    from .mtp_drafter import MtpDrafter

    if strategy == "mtp":
        if mtp_head is None:
            raise BadFlagError("--decode-strategy mtp needs an MTP head (guild train-mtp MODEL -o HEAD.gguf)")
        return MtpDrafter(mtp_head, n_ctx, max_k=mtp.k, min_p=mtp.min_p)
    from .adaptive import AdaptiveDrafter

    drafters = [make_drafter("lookup", min_match=min_match, lookup_window=lookup_window), make_drafter("retrieval")]
    if mtp_head is not None:  # the scheduler weighs the head's confidence itself: no min_p here
        drafters.append(MtpDrafter(mtp_head, n_ctx, max_k=mtp.k))
    return AdaptiveDrafter(drafters, costs, mtp_cap_k=mtp.k)
