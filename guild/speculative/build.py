"""make_drafter: the drafter a strategy runs with (guild.speculative.registry lists the strategies)."""

from __future__ import annotations

from .adaptive import AdaptiveDrafter
from .base import Drafter, NoDrafter
from .costs import DraftCosts
from .options import DraftOptions
from .registry import ADAPTIVE, DRAFTERS, NORMAL


def make_drafter(strategy: str | DraftOptions = "adaptive", *, costs: DraftCosts | None = None, mtp_head=None,
                 n_ctx: int = 4096, **options) -> Drafter:
    """The drafter for a strategy (a name plus DraftOptions fields, or DraftOptions). `costs` (a DraftCosts from
    a plan, or None) seeds the adaptive scheduler's cost model; `mtp_head` (guild.models.mtp, or None) drafts for
    the drafters that use one, with its own KV cache of n_ctx rows."""
    o = strategy if isinstance(strategy, DraftOptions) else DraftOptions(strategy=strategy, **options)
    if o.strategy == NORMAL:
        return NoDrafter()
    if o.strategy == ADAPTIVE:
        pool = [d for d in (c.member(o, mtp_head, n_ctx) for c in DRAFTERS.values()) if d is not None]
        for d in pool:
            d.warm()
        # the lazy ones (a forward per proposal) last: asked only when they could beat what is on the table
        return AdaptiveDrafter(sorted(pool, key=lambda d: d.lazy), costs, mtp_cap_k=o.mtp.depth(mtp_head))
    d = DRAFTERS[o.strategy].build(o, mtp_head, n_ctx)
    d.warm()
    return d
