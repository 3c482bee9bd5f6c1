"""The adaptive scheduler alone, on synthetic traces: no model, no clock (times are made up and passed in)."""

import numpy as np
import pytest

from guild.speculative.costs import DraftCosts
from guild.speculative.scheduler import AdaptiveScheduler, Proposal, SchedulerConfig, bucket, features


def linear_v(v1, slope):
    return lambda t: v1 * (1 + slope * (t - 1))


def simulate(sched, n, v, accept, signals=None, noise=0.0, seed=0, strategy="lookup", length=7, room=7, cold=None):
    """Drive `sched` for n windows. accept(i, rng) -> how many of the proposal's tokens the emitted text confirms
    (the same for shadow and executed windows: decoding is exact); cold[T-1]: ms of expert reads a window of T
    rows waits for (told to the scheduler before each window, and paid). Returns the decisions."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        sig = signals(i) if callable(signals) else (signals or {"match_len": 6, "freq": 1})
        p = Proposal(strategy, tuple(range(length)), sig)
        if cold is not None:
            sched.observe_residency(cold)
        d = sched.decide([p], room)
        a = accept(i, rng)
        k = d.k
        emitted = (min(a, k) + 1) if k else 1
        ms = v(k + 1) * (1 + noise * rng.standard_normal()) + (cold[k] if cold is not None else 0.0)
        sched.observe_window(d.strategy, k, 0.01 if k else 0.0, ms, emitted)
        sched.observe_proposal(p, a)
        out.append(d)
    return out


def test_high_acceptance_converges_to_lookup_at_max_k():
    s = AdaptiveScheduler()
    ds = simulate(s, 80, linear_v(10, 0.3), lambda i, r: 7, room=4)
    tail = ds[-30:]
    assert all(d.strategy == "lookup" and d.k == 4 for d in tail), [(d.strategy, d.k) for d in tail]


def test_cold_experts_of_the_drafts_shrink_the_draft():
    """Drafts whose rows would fault experts in from disk (an expert cache's cold experts of the window's union,
    20 ms per extra row here) make long windows dear: the scheduler drafts less than with every expert resident,
    while a cold cost every window pays alike (the root's own experts) leaves k at its maximum."""
    v = linear_v(10, 0.3)
    warm = simulate(AdaptiveScheduler(), 80, v, lambda i, r: 7, room=4)[-30:]
    steep = simulate(AdaptiveScheduler(), 80, v, lambda i, r: 7, room=4, cold=[20.0 * t for t in range(8)])[-30:]
    flat = simulate(AdaptiveScheduler(), 80, v, lambda i, r: 7, room=4, cold=[30.0] * 8)[-30:]
    assert all(d.k == 4 for d in warm) and all(d.k == 4 for d in flat)
    assert all(d.k < 4 for d in steep) and sum(d.k for d in steep) < sum(d.k for d in warm) / 2
    s = AdaptiveScheduler()
    simulate(s, 20, v, lambda i, r: 7, room=4, cold=[20.0 * t for t in range(8)])
    assert s.costs.verify(3) == pytest.approx(s.costs.warm(3) + 40.0)  # the reads are priced apart, not learnt


def test_low_acceptance_backs_off_to_normal_quickly():
    s = AdaptiveScheduler()
    # long matches (prior 0.85) that never verify
    ds = simulate(s, 200, linear_v(10, 0.6), lambda i, r: 0, room=4)
    executed = [i for i, d in enumerate(ds) if d.k]
    assert len(executed) <= 4, executed
    assert all(d.strategy == "normal" for d in ds[20:])


def test_isolated_distant_trigrams_are_not_drafted():
    """An isolated 3-gram matched 2,000 tokens back (prior acceptance about 0.5: short and far) does not pay on a
    steep V(T) with a plan that says so: no window is spent on it."""
    steep = DraftCosts(verify_ms=tuple(10 * (1 + 0.6 * t) for t in range(8)))
    s = AdaptiveScheduler(costs=steep)
    sig = {"match_len": 3, "freq": 1, "dist": 2000}
    assert 0.3 < s.acc.probs("lookup", sig, 1)[0] < 0.6
    ds = simulate(s, 100, linear_v(10, 0.6), lambda i, r: 0, signals=sig, room=4)
    assert all(d.k == 0 for d in ds)


def test_no_flip_flop_around_a_tie():
    s = AdaptiveScheduler()
    # acceptance 0.5 per token with V(T) slope 0.5: lookup's expected ms/token ~ normal's
    v = linear_v(10, 0.5)
    ds = simulate(s, 400, v, lambda i, r: int(r.geometric(0.5) - 1), noise=0.1, seed=3, room=4)
    chosen = [d.strategy for d in ds[10:]]
    switches = sum(a != b for a, b in zip(chosen, chosen[1:], strict=False))
    modes = [d.mode for d in ds[10:]]
    mode_switches = sum(a != b for a, b in zip(modes, modes[1:], strict=False))
    assert mode_switches <= 20, mode_switches
    assert switches <= 60, switches


def test_reprobes_after_fallback():
    s = AdaptiveScheduler()
    phase = lambda i, r: 7 if i < 60 or i >= 90 else 0  # noqa: E731
    ds = simulate(s, 130, linear_v(10, 0.3), phase, room=4)
    assert ds[59].strategy == "lookup"
    # the bad stretch: back to normal within a few windows
    assert all(d.strategy == "normal" for d in ds[72:90])
    # good text again: drafting resumes within a bounded number of windows
    resumed = next(i for i in range(90, 130) if ds[i].strategy == "lookup")
    assert resumed - 90 <= 12, resumed
    assert all(d.strategy == "lookup" for d in ds[resumed + 10:])


def _mean_k(slope):
    s = AdaptiveScheduler()
    ds = simulate(s, 300, linear_v(10, slope), lambda i, r: int(min(r.geometric(0.2) - 1, 7)), seed=5)
    ks = [d.k for d in ds[100:] if d.k]
    return np.mean(ks) if ks else 0.0


def test_steep_verify_curve_gives_shorter_windows():
    flat, steep = _mean_k(0.1), _mean_k(0.45)
    assert flat > steep + 1, (flat, steep)
    assert steep >= 1


def test_empty_proposal_means_normal():
    s = AdaptiveScheduler()
    s.observe_window("normal", 0, 0.0, 10.0, 1)
    d = s.decide([Proposal("lookup", (), {}), Proposal("retrieval", (), {})], 4)
    assert (d.strategy, d.k) == ("normal", 0)


def test_unseeded_first_window_is_plain():
    d = AdaptiveScheduler().decide([Proposal("lookup", (1, 2, 3), {"match_len": 20})], 4)
    assert (d.strategy, d.k, d.reason) == ("normal", 0, "unseeded")


def test_plan_costs_shape_predictions():
    """With a plan, V(T)/V(1) comes from it until measured: a flat plan makes long drafts pay at once."""
    flat = DraftCosts(verify_ms=tuple(10 + 0.5 * t for t in range(8)), draft_ms={"lookup": 0.01})
    steep = DraftCosts(verify_ms=tuple(10 * (1 + 0.9 * t) for t in range(8)))
    p = Proposal("lookup", tuple(range(7)), {"match_len": 6})
    ks = []
    for plan in (flat, steep):
        s = AdaptiveScheduler(costs=plan)
        s.observe_window("normal", 0, 0.0, 10.0, 1)
        ks.append(s.decide([p], 7).k)
    assert ks[0] > ks[1]


def test_plan_v1_is_replaced_by_the_live_first_step():
    """A plan measured V(1) at its --context; the first plain step here seeds V(1) at this context."""
    s = AdaptiveScheduler(costs=DraftCosts(verify_ms=tuple(90.0 * (1 + 0.5 * t) for t in range(8))))
    assert s.decide([Proposal("lookup", (1, 2), {"match_len": 9})], 4).reason == "unseeded"
    s.observe_window("normal", 0, 0.0, 14.0, 1)
    assert s.costs.verify(1) == 14.0 and s.costs.verify(3) == pytest.approx(28.0)


def test_one_off_stall_barely_moves_the_estimate():
    s = AdaptiveScheduler()
    for _ in range(5):
        s.observe_window("normal", 0, 0.0, 10.0, 1)
    s.observe_window("normal", 0, 0.0, 5000.0, 1)  # e.g. a JIT compilation inside the window
    assert s.costs.verify(1) < 13.0


def test_acceptance_starts_at_the_priors_and_tracks_data():
    """Before any outcome the model reads the drafter's priors (its bucket's acceptance, its feature weights);
    then it follows what the text does, both ways."""
    import math

    s = AdaptiveScheduler()
    sig = {"match_len": 3, "freq": 1}
    z = math.log(0.83 / 0.17) + 0.45 * (math.log2(3) - 3)  # iso3's prior, a 3-token match's length weight
    assert s.acc.probs("lookup", sig, 1)[0] == pytest.approx(1 / (1 + math.exp(-z)))
    p = Proposal("lookup", tuple(range(4)), sig)
    for _ in range(60):
        s.observe_proposal(p, 4)
    assert min(s.acc.probs("lookup", sig, 4)) > 0.95
    for _ in range(150):
        s.observe_proposal(p, 0)
    assert s.acc.probs("lookup", sig, 1)[0] < 0.1


def test_buckets_follow_signals():
    assert bucket("lookup", {"match_len": 3, "freq": 1}) == "iso3"
    assert bucket("lookup", {"match_len": 3, "freq": 2}) == "rep3"
    assert bucket("lookup", {"match_len": 5, "freq": 1}) == "m4"
    assert bucket("lookup", {"match_len": 12, "freq": 1, "group": 3, "consensus": 1 / 3}) == "split"
    assert bucket("retrieval", {"match_len": 3, "confidence": 0.9}) == "conf3"
    assert bucket("retrieval", {"match_len": 9, "confidence": 0.9}) == "m8"


def test_muted_strategy_returns():
    """A back-off mutes a strategy for clamp(2r, 2, 6) windows only: it is never latched off."""
    s = AdaptiveScheduler()
    ds = simulate(s, 40, linear_v(10, 0.3), lambda i, r: 0 if i in (20, 21, 22, 23) else 7, room=4)
    assert any(d.reason == "only" or d.strategy == "normal" for d in ds[21:26])
    assert ds[-1].strategy == "lookup"


# ------------------------------------------------------------------ MTP: lazy asking, four-way arbitration
def test_mtp_is_asked_only_when_it_could_pay():
    s = AdaptiveScheduler(SchedulerConfig(mtp_cap_k=1, probe_every=8, probe_max=32, default_slope=0.3))
    s.observe_window("normal", 0, 0.0, 10.0, 1)  # seeds V(1)
    s.observe_draft_ms("mtp", 1.0)
    strong = Proposal("lookup", tuple(range(7)), {"match_len": 12, "freq": 3})
    # deep lookup at its 0.95 prior beats one MTP draft in every bucket: the head runs only as a probe, and each
    # probe that finds nothing worth drafting doubles the gap to the next (8, 16, 32, then 32)
    asked = [s.ask("mtp", [strong], 4) for _ in range(100)]
    assert [i for i, a in enumerate(asked) if a] == [7, 23, 55, 87]
    assert s.ask("mtp", [], 4)  # nothing else on the table: at its prior shares the head is worth its forward
    for _ in range(60):
        s.observe_lazy("mtp", {"prob": 0.05})  # the head has been unsure for a while: its T=2 window would not pay
    assert s.ask_value("mtp", s.costs.verify(1), 4) < 0
    assert not s.ask("mtp", [], 4)
    s.muted["mtp"] = 3
    assert not any(s.ask("mtp", [], 4) for _ in range(20))  # never while muted
    assert not s.ask("mtp", [], 0)  # no room
    s0 = AdaptiveScheduler(SchedulerConfig(mtp_cap_k=0))
    s0.observe_window("normal", 0, 0.0, 10.0, 1)
    assert s0.ask_value("mtp", 10.0, 7) == 0.0  # no draft allowed: nothing to gain, and no error


def test_mtp_confident_part_of_the_time_is_asked_every_window():
    """A head that is sure (and right) on half the tokens and unsure (and wrong) on the rest: its mean
    confidence says a draft would not pay, but drafting only when it is sure does, so asking is worth its
    forward (the option value, docs/adaptive.md "MTP confidence"). Accepted drafts reset the probe gap."""
    s = AdaptiveScheduler(SchedulerConfig(mtp_cap_k=1, default_slope=0.5))
    s.observe_window("normal", 0, 0.0, 10.0, 1)
    s.observe_draft_ms("mtp", 1.0)
    for i in range(40):
        p = 0.95 if i % 2 else 0.1
        s.observe_lazy("mtp", {"prob": p})
        s.observe_proposal(Proposal("mtp", (1,), {"prob": p}), int(p > 0.5))
    assert (1.0 + s.costs.verify(2)) / (1 + 0.5) > s.costs.verify(1)  # at the mean, one draft costs more
    assert s.ask_value("mtp", s.costs.verify(1), 4) > 0
    assert all(s.ask("mtp", [], 4) for _ in range(10))
    s.probe_gap["mtp"] = 64
    s.observe_window("mtp", 1, 1.0, 15.0, 2)
    assert "mtp" not in s.probe_gap


def _arbitrate(s, n_tokens, segment, v, rng, fixed=None):
    """Decode n_tokens of a text whose kind changes with segment(position): 'copy' (lookup matches long and is
    always right; the head is unsure and right 30% of the time) or 'novel' (no lookup match; the head is right
    80% of the time with top-1 probability 0.9). `fixed`: always that drafter at its longest draft (normal when
    it has none), as `--decode-strategy lookup|mtp`. Returns (choices with their segment, ms per token)."""
    total_ms, pos, out = 0.0, 0, []
    while pos < n_tokens:
        seg = segment(pos)
        props = []
        if seg == "copy" and fixed in (None, "lookup"):
            props.append(Proposal("lookup", tuple(range(7)), {"match_len": 16, "freq": 3}))
        mtp_ok = rng.random() < (0.3 if seg == "copy" else 0.8)
        draft_ms = 0.0
        if fixed == "mtp" or (fixed is None and s.ask("mtp", props, 4)):
            prob = 0.4 if seg == "copy" else 0.9
            s.observe_draft_ms("mtp", 1.0)
            s.observe_lazy("mtp", {"prob": prob})
            props.append(Proposal("mtp", (1,), {"prob": prob}))
            draft_ms = 1.0
        if fixed is None:
            d = s.decide(props, 4)
            strategy, k = d.strategy, d.k
        else:
            strategy, k = (props[0].strategy, min(len(props[0].tokens), 4)) if props else ("normal", 0)
        acc = {"lookup": 7, "mtp": int(mtp_ok)}
        emitted = min(acc.get(strategy, 0), k) + 1 if k else 1
        s.observe_window(strategy, k, draft_ms, v(k + 1), emitted)
        for p in props:
            s.observe_proposal(p, acc[p.strategy])
        total_ms += v(k + 1) + draft_ms
        pos += emitted
        out.append((seg, strategy))
    return out, total_ms / pos


def test_four_way_arbitration_follows_the_text():
    v = linear_v(10, 0.35)

    def segment(pos):
        return "copy" if (pos // 150) % 2 == 0 else "novel"

    cfg = SchedulerConfig(mtp_cap_k=1)
    ch, adaptive = _arbitrate(AdaptiveScheduler(cfg), 1200, segment, v, np.random.default_rng(1))
    copy = [c for g, c in ch if g == "copy"]
    novel = [c for g, c in ch if g == "novel"]
    assert copy.count("lookup") >= 0.8 * len(copy), copy
    assert novel.count("mtp") >= 0.7 * len(novel), novel
    # better than every fixed strategy (the seed's W5/W10 result, on a synthetic trace)
    fixed = {f: _arbitrate(AdaptiveScheduler(cfg), 1200, segment, v, np.random.default_rng(1), fixed=f)[1]
             for f in ("lookup", "mtp")}
    assert adaptive < 0.95 * min(*fixed.values(), 10.0), (adaptive, fixed)


def _calibration_error(s, stream, k):
    """Mean |predicted - kept| over a stream of (signals, accepted) proposals of k drafts, each predicted, then
    learnt, in turn (online: as the scheduler sees them), over the draft positions the text reached."""
    err, n = 0.0, 0
    for sig, a in stream:
        probs = s.acc.probs("lookup", sig, k)
        for i in range(min(a + 1, k)):
            err += abs(probs[i] - (a > i))
            n += 1
        s.observe_proposal(Proposal("lookup", tuple(range(k)), sig), a)
    return err / n


def test_acceptance_learns_what_depends_on_the_draft_position():
    """A synthetic stream (no clock) whose first drafts are kept 35% of the time and every deeper one (given its
    predecessors) 95%: the model's first and deeper rates separate, so its predictions over the second half are
    closer to what happened than over the first, and each rate ends near its truth."""
    rng = np.random.default_rng(0)
    stream = []
    for _ in range(400):
        a = 0 if rng.random() > 0.35 else 1 + int(sum(np.cumprod(rng.random(3) < 0.95)))
        stream.append(({"match_len": 5, "freq": 1, "dist": 40}, a))
    s = AdaptiveScheduler()
    early, late = _calibration_error(s, stream[:200], 4), _calibration_error(s, stream[200:], 4)
    assert late < early, (early, late)
    first, deep = s.acc.probs("lookup", stream[0][0], 2)
    assert abs(first - 0.35) < 0.12 and abs(deep - 0.95) < 0.08, (first, deep)


def test_features_read_the_signals_and_the_agreement():
    """The model's inputs: a bias, the bucket, the drafter's own features (0 where typical) and, when another
    drafter proposed too, whether it starts with the same token."""
    f = features("lookup", {"match_len": 8, "freq": 1, "group": 2, "consensus": 0.5, "dist": 63, "agree": -1.0})
    assert f == {"bias": 1.0, "b:m8": 1.0, "len": 0.0, "dist": 0.0, "split": 0.5, "agree": -1.0}
    assert set(features("mtp", {"prob": 0.9})) == {"bias", "b:hi", "prob"}
    s = AdaptiveScheduler()
    sig = {"prob": 0.6}
    assert s.acc.probs("mtp", {**sig, "agree": 1.0}, 1)[0] > 0.85 > s.acc.probs("mtp", sig, 1)[0] > \
        s.acc.probs("mtp", {**sig, "agree": -1.0}, 1)[0]


def test_adaptive_drafter_marks_agreement_and_does_not_ask_muted_drafters():
    """Each proposal carries whether the other drafters' proposals start with its first token; a drafter the
    scheduler muted after a back-off is not asked at all (its lookup costs nothing meanwhile)."""
    from guild.speculative.adaptive import AdaptiveDrafter
    from guild.speculative.base import Drafter

    class Fixed(Drafter):
        def __init__(self, name, toks):
            self.name, self.toks, self.asked = name, toks, 0

        def propose(self, history, k):
            self.asked += 1
            return np.asarray(self.toks[:k], np.int32)

    # the head (uses_head) against the copying drafters, which copy from the same text: only across kinds
    a, b, c = Fixed("lookup", [5, 6]), Fixed("retrieval", [5, 9]), Fixed("mtp", [5])
    ad = AdaptiveDrafter([a, b, c])
    ad.start([1, 2, 3], 0)
    ad.draft([1, 2, 3], 4)
    assert [p.signals["agree"] for p, _ in ad.pending] == [1.0, 1.0, 1.0]
    c.toks = [7]
    ad.draft([1, 2, 3, 4], 4)
    assert [p.signals["agree"] for p, _ in ad.pending[-3:]] == [-1.0, -1.0, -1.0]
    ad.scheduler.muted["mtp"] = 3
    asked = c.asked
    ad.draft([1, 2, 3, 4, 5], 4)
    assert c.asked == asked and a.asked == b.asked == asked + 1
    assert all("agree" not in p.signals for p, _ in ad.pending[-2:])  # no drafter of the other kind proposed


# ------------------------------------------------------------------ grammar-forced drafts
def test_grammar_forced_runs_are_drafted_at_full_length():
    """Tokens a grammar forces are accepted with probability 1 once their predecessors are: on a text where the
    drafter's own token after the forced run never verifies, every window still drafts the whole forced run and
    learns to stop before the drafter's token; a muted drafter's forced-only proposal still runs whole."""
    s = AdaptiveScheduler()
    v = linear_v(10, 0.3)
    sig = {"match_len": 6, "freq": 1}
    ds = []
    for _ in range(60):
        d = s.decide([Proposal("lookup", (1, 2, 3, 4), sig, (True, True, True, False))], 4)
        s.observe_window(d.strategy, d.k, 0.01 if d.k else 0.0, v(d.k + 1), min(d.k, 3) + 1)
        s.observe_proposal(Proposal("lookup", (4,), sig), 0)  # the drafter's own token: rejected
        ds.append(d)
    assert ds[0].reason == "unseeded" and all(d.k >= 3 for d in ds[1:]), [d.k for d in ds]
    assert all(d.k == 3 for d in ds[-30:]), [d.k for d in ds[-30:]]
    p = Proposal("lookup", (1, 2), sig, (True, True))
    assert p.acceptance([0.3, 0.2]) == [1.0, 1.0] and not p.uncertain
    s.muted["lookup"] = 5
    assert s.decide([p], 4).k == 2 and s.decide([Proposal("lookup", (1, 2), sig)], 4).k == 0


def test_adaptive_drafter_carries_proposals_through_forced_tokens():
    """Under a grammar each proposal runs as: the forced run from the root where it stops inside it (or proposes
    nothing), its own tokens the grammar takes, then the tokens forced after them, marked certain; the raw
    proposal is what shadow verification learns from."""
    from guild.speculative.adaptive import AdaptiveDrafter, with_forced
    from guild.speculative.base import Drafter

    class Grammar:  # forces 7 8 from the root and 10 after 7 8 9; refuses 5
        runs = {(): (7, 8), (7, 8, 9): (10,)}

        def forced(self, path=(), limit=1):
            return self.runs.get(tuple(path), ())[:limit]

        def valid_prefix(self, draft):
            return next((i for i, t in enumerate(draft) if t == 5), len(draft))

    class Fixed(Drafter):
        name = "lookup"

        def __init__(self, toks):
            self.toks = toks

        def propose(self, history, k):
            return np.asarray(self.toks[:k], np.int32)

    g, sig = Grammar(), {"match_len": 6, "freq": 1}
    p = with_forced(Proposal("lookup", (7, 8, 9, 11), sig), (7, 8), g, 4)
    assert p.tokens == (7, 8, 9, 11) and p.certain == (True, True, False, False)
    p = with_forced(Proposal("lookup", (7, 8, 9), sig), (7, 8), g, 4)
    assert p.tokens == (7, 8, 9, 10) and p.certain == (True, True, False, True)
    p = with_forced(Proposal("lookup", (7, 5, 9), sig), (7, 8), g, 4)
    assert p.tokens == (7, 8) and p.certain == (True, True) and p.signals is sig
    ad = AdaptiveDrafter([Fixed([])])
    ad.observe_constraint(g)
    ad.start([1, 2, 3], 0)
    first = ad.draft([1, 2, 3], 4)  # unseeded: the first window is a plain step
    assert first.tokens.size == 0 and first.decision.reason == "unseeded"
    ad.observe("normal", 0, 0.0, 10.0, 1)
    d = ad.draft([1, 2, 3, 4], 4)
    assert d.tokens.tolist() == [7, 8] and d.forced == 2 and d.strategy == "lookup" == d.decision.strategy
    ad.drafters[0].toks = [7, 8, 9]
    assert ad.draft([1, 2, 3, 4, 5], 4).tokens.tolist()[:2] == [7, 8]
    assert ad.pending[-1][0].tokens == (7, 8, 9)  # learnt from as the drafter proposed it
    ad.observe_constraint(None)
    ad.drafters[0].toks = []
    d = ad.draft([1, 2, 3, 4, 5, 6], 4)
    assert d.tokens.size == 0 and d.forced == 0


def test_the_draft_cap_is_the_room_it_is_given():
    """One cap, passed one way: the room of each decision (the session's: tokens and context left,
    --spec-max-draft). The scheduler has none of its own, so a drafter proposing more than the room is cut to it,
    and a wider room lets it draft deeper."""
    for room in (2, 5):
        ds = simulate(AdaptiveScheduler(), 80, linear_v(10, 0.1), lambda i, r: 7, room=room)
        assert max(d.k for d in ds) == room and all(d.k == room for d in ds[-30:]), [d.k for d in ds]
