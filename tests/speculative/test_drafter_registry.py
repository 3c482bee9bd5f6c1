"""One declaration per drafter: a class registered in guild.speculative.registry is a --decode-strategy, a member
of the adaptive pool, a scheduler strategy with its own priors and buckets, and a key of a plan's per-drafter
costs, without any other file naming it; an unregistered name is a clean error everywhere."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from guild.engine.options import DecodeOptions
from guild.errors import BadFlagError, PlanError, UnknownStrategyError
from guild.plans.plan import read_plan, write_plan
from guild.speculative import registry
from guild.speculative.adaptive import AdaptiveDrafter
from guild.speculative.base import Drafter
from guild.speculative.build import make_drafter
from guild.speculative.options import DraftOptions
from guild.speculative.scheduler import AdaptiveScheduler, Proposal, bucket
from tests.fuzz.gen import seed_plan


class EchoDrafter(Drafter):
    """Proposes the last token again."""

    name = "echo"
    priors = {"any": 0.5}

    def propose(self, history, k):
        return np.full(min(k, 2), history[-1], np.int32)


@pytest.fixture
def echo(monkeypatch):
    monkeypatch.setitem(registry.DRAFTERS, "echo", EchoDrafter)
    return EchoDrafter


def test_the_registry_is_the_strategy_list():
    assert registry.strategies() == ("normal", "lookup", "retrieval", "mtp", "adaptive")
    assert registry.needs("adaptive") == registry.Needs(uses_head=True, uses_corpus=True)
    assert registry.needs("mtp") == registry.Needs(uses_head=True, needs_head=True)
    assert registry.needs("retrieval").uses_corpus and registry.needs("normal") == registry.Needs()


def test_a_registered_drafter_is_a_strategy(echo):
    assert registry.strategies() == ("normal", "lookup", "retrieval", "mtp", "echo", "adaptive")
    assert DecodeOptions(strategy="echo").strategy == "echo"
    with pytest.raises(BadFlagError, match="one of normal, lookup, retrieval, mtp, echo, adaptive"):
        DraftOptions(strategy="nosuch")
    assert isinstance(make_drafter("echo"), EchoDrafter)
    ad = make_drafter("adaptive")
    assert isinstance(ad, AdaptiveDrafter) and [d.name for d in ad.drafters] == ["lookup", "retrieval", "echo"]


def test_the_scheduler_takes_a_registered_drafters_priors_and_bucket(echo):
    assert bucket("echo", {"match_len": 9}) == "any"
    s = AdaptiveScheduler()
    assert s.acc.probs("echo", {}, 1) == [pytest.approx(0.5)]
    s.observe_window("normal", 0, 0.0, 10.0, 1)  # seeds V(1)
    s.observe_draft_ms("echo", 0.01)
    d = s.decide([Proposal("echo", (7, 7), {})], 4)
    assert d.strategy in ("normal", "echo") and "echo" in d.costs
    s.observe_proposal(Proposal("echo", (7, 7), {}), 2)
    assert s.acc.probs("echo", {}, 1)[0] > 0.5


def test_a_plan_carries_a_registered_drafters_costs(echo, tmp_path, monkeypatch):
    src = tmp_path / "seed.gexec"
    src.write_bytes(seed_plan())
    plan = read_plan(src)
    cal = dataclasses.replace(plan.drafting, draft_ms={**plan.drafting.draft_ms, "echo": 0.003})
    p = write_plan(dataclasses.replace(plan, drafting=cal), tmp_path / "echo.gexec")
    back = read_plan(p)
    assert back.drafting.draft_ms["echo"] == 0.003 and back.draft_costs().draft_ms["echo"] == 0.003
    monkeypatch.delitem(registry.DRAFTERS, "echo")  # the same plan where no drafter declares echo
    with pytest.raises(PlanError, match="drafting.draft_ms.echo: unknown field"):
        read_plan(p)


def test_an_unknown_strategy_is_a_clean_error():
    with pytest.raises(BadFlagError, match="--decode-strategy must be one of .* got 'nosuch'"):
        DraftOptions(strategy="nosuch")
    with pytest.raises(UnknownStrategyError, match="unknown strategy 'nosuch'"):
        registry.needs("nosuch")
    # never the MTP head's bucket rule (which reads only "prob") and a KeyError in the priors
    with pytest.raises(UnknownStrategyError, match="unknown drafter 'nosuch' \\(registered: lookup, retrieval, mtp\\)"):
        bucket("nosuch", {"prob": 0.9})
    s = AdaptiveScheduler()
    s.observe_window("normal", 0, 0.0, 10.0, 1)
    with pytest.raises(UnknownStrategyError, match="nosuch"):
        s.decide([Proposal("nosuch", (1, 2), {"prob": 0.9})], 4)
    with pytest.raises(UnknownStrategyError, match="nosuch"):
        s.ask("nosuch", [], 4)


def test_options_for_another_strategy_keep_only_what_it_uses(tmp_path):
    """A bench or server running several strategies from one set of flags: `normal` drops the head and the corpus
    (given for it alone they are refused), the strategies that use them keep them."""
    from guild.speculative.options import DraftOptions, MtpOptions

    corpus = tmp_path / "c.txt"
    corpus.write_text("text")
    o = DraftOptions(strategy="adaptive", mtp=MtpOptions(head="h.gguf"), corpus=(str(corpus),))
    n = o.with_strategy("normal", max_draft=2)
    assert (n.strategy, n.mtp.head, n.corpus, n.max_draft) == ("normal", None, (), 2)
    m = o.with_strategy("mtp")
    assert (m.mtp.head, m.corpus) == ("h.gguf", ())
    r = o.with_strategy("retrieval")
    assert (r.mtp.head, r.corpus) == (None, (str(corpus),))
