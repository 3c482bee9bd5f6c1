"""Drafters propose draft tokens for a verification window; the verifier decides what is kept.

The strategies' table (what each needs: an MTP head, a corpus) is guild.options.STRATEGIES; BUILDERS below is
how each one's drafter is built. Everything else asks these two.
"""

from __future__ import annotations

from collections.abc import Callable

from ..errors import BadFlagError
from ..options import MTP_K, MTP_VOCAB, STRATEGIES, MtpOptions, SpecOptions
from .adaptive import AdaptiveDrafter
from .base import Drafter, NoDrafter
from .lookup import SuffixDrafter
from .mtp import MtpDrafter
from .retrieval import RetrievalDrafter


def _lookup(o: SpecOptions) -> SuffixDrafter:
    return SuffixDrafter(min_match=o.min_match, max_history=o.lookup_window)


def _mtp(o, costs, head, n_ctx) -> MtpDrafter:
    if head is None:
        raise BadFlagError("--decode-strategy mtp needs an MTP head (guild train-mtp MODEL -o HEAD.gguf)")
    return MtpDrafter(head, n_ctx, max_k=o.mtp.k, min_p=o.mtp.min_p)


def _adaptive(o, costs, head, n_ctx) -> AdaptiveDrafter:
    drafters = [_lookup(o), RetrievalDrafter()]
    if head is not None:  # the scheduler weighs the head's confidence itself: no min_p here
        drafters.append(MtpDrafter(head, n_ctx, max_k=o.mtp.k))
    return AdaptiveDrafter(drafters, costs, mtp_cap_k=o.mtp.k)


BUILDERS: dict[str, Callable] = {  # (SpecOptions, costs, mtp_head, n_ctx) -> Drafter
    "normal": lambda o, costs, head, n_ctx: NoDrafter(),
    "lookup": lambda o, costs, head, n_ctx: _lookup(o),
    "retrieval": lambda o, costs, head, n_ctx: RetrievalDrafter(),
    "mtp": _mtp,
    "adaptive": _adaptive,
}
assert BUILDERS.keys() == STRATEGIES.keys()


def make_drafter(strategy: str | SpecOptions = "adaptive", *, costs=None, mtp_head=None, n_ctx: int = 4096,
                 **options) -> Drafter:
    """The drafter for a strategy (a name plus SpecOptions fields, or SpecOptions). `costs` (a SpecCosts from a
    plan, or None) seeds the adaptive scheduler's cost model; `mtp_head` (guild.models.mtp, or None) drafts for
    `mtp` and joins `adaptive`, with its own KV cache of n_ctx rows."""
    o = strategy if isinstance(strategy, SpecOptions) else SpecOptions(strategy=strategy, **options)
    return BUILDERS[o.strategy](o, costs, mtp_head, n_ctx)


__all__ = ["MTP_K", "MTP_VOCAB", "STRATEGIES", "Drafter", "MtpOptions", "NoDrafter", "SpecOptions", "make_drafter"]
