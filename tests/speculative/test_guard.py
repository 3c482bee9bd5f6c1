"""The adaptive scheduler's guard (guard.Guard): realised cost against plain's, rests, peeks and probes, alone
and replayed over long-context traces whose asking costs what the cost model does not price."""

import pytest

from guild.speculative.adaptive import AdaptiveDrafter
from guild.speculative.guard import Guard
from guild.speculative.scheduler import AdaptiveScheduler, Proposal, SchedulerConfig
from guild.tools import replay as R

CFG = SchedulerConfig()
OFF = SchedulerConfig(guard_windows=10**9, guard_budget=1e9)  # never judges: the scheduler as it was


def _run(g, n, ms, emitted=1, plain=10.0, asked=True):
    for _ in range(n):
        g.observe(asked, ms, emitted, plain)


def test_a_losing_run_rests_then_shorter_probes_double_the_rest_and_a_win_resets_it():
    g = Guard(CFG)
    _run(g, CFG.guard_windows - 1, 10.5)  # 5% over plain, one window short of a verdict
    assert not g.resting
    _run(g, 1, 10.5)
    assert g.rest_left == CFG.rest_min and g.rests == 1
    _run(g, CFG.rest_min, 10.0, asked=False)
    assert not g.resting
    _run(g, CFG.probe_windows, 10.5)  # the probe after a rest is shorter, and a second loss doubles the rest
    assert g.rest_left == 2 * CFG.rest_min and g.rests == 2
    _run(g, 2 * CFG.rest_min, 10.0, asked=False)
    _run(g, CFG.probe_windows, 12.0, emitted=2)  # drafts that pay: 6 ms a token
    assert not g.resting and g.rest == CFG.rest_min and g.run == CFG.guard_windows


def test_a_run_within_the_margin_never_rests():
    g = Guard(CFG)
    _run(g, 20 * CFG.guard_windows, 10.0 * (1 + CFG.guard_margin / 2))
    assert g.rests == 0


def test_a_loss_of_the_budget_rests_at_once():
    g = Guard(CFG)
    _run(g, 1, 10.0 * (CFG.guard_budget + 1.5))  # e.g. a mis-priced long window at a long context
    assert g.rest_left == CFG.rest_min


def test_the_scheduler_rests_peeks_and_wakes():
    """While resting, `rest()` answers plain steps without asking; every peek_every-th window it lets the cheap
    drafters be asked, and a proposal that pays ends the rest."""
    s = AdaptiveScheduler()
    s.observe_window("normal", 0, 0.0, 10.0, 1)
    s.guard.rest_left = 2 * CFG.peek_every
    rests = 0
    while s.rest() is not None:
        s.observe_window("normal", 0, 0.0, 10.0, 1)
        rests += 1
    assert rests == CFG.peek_every - 1 and s.guard.peek  # the windows before the first peek
    d = s.decide([Proposal("lookup", (), {})], 4)
    assert (d.k, d.reason) == (0, "rest") and not s.asked
    s.observe_window("normal", 0, 0.0, 10.0, 1)
    while s.rest() is not None:
        s.observe_window("normal", 0, 0.0, 10.0, 1)
    d = s.decide([Proposal("lookup", tuple(range(4)), {"match_len": 12, "freq": 3})], 4)
    assert d.k > 0 and s.asked and not s.guard.resting


def _long_trace(n_out=400, ask_ms=2.0, copy_from=None, v1=50.0):
    """One long-context turn: a plain step of `v1` ms, V(T)/V(1) as at 16K positions (1.95 at T = 4), lookup
    asked at `ask_ms` per window (its cost at a long history), proposing a wrong 4-token draft every 16th window
    and nothing else, until `copy_from`, after which the reply copies and lookup proposes the true
    continuation."""
    toks = list(range(1000, 1003)) + [2000 + i for i in range(n_out)]
    n0 = 4
    windows = {}
    for n in range(n0, len(toks)):
        if copy_from is not None and n - n0 >= copy_from:
            lk, sig = toks[n : n + 4], {"match_len": 12, "freq": 3}
        elif n % 16 == 0:
            lk, sig = [7, 7, 7, 7], {"match_len": 5, "freq": 2}
        else:
            lk, sig = [], {}
        windows[str(n)] = {"room": 4, "proposals": {"lookup": {"tokens": lk, "signals": sig, "ms": ask_ms,
                                                              "lazy": False, "rows": 0}}}
    return {"id": "W10@16384", "rho": [1.0, 1.3, 1.62, 1.95, 2.3],
            "turns": [{"tokens": toks, "n0": n0, "max_tokens": n_out + 1, "v1_ms": v1, "windows": windows}]}


def _replay(wl, cfg):
    ads = []

    def make(ds, clock):
        ad = AdaptiveDrafter(ds, clock=clock)
        ad.scheduler.cfg = cfg
        ad.scheduler.guard = Guard(cfg)
        ads.append(ad)
        return ad

    return R.replay(wl, make=make), ads[0].scheduler.guard


def test_replayed_long_context_asking_that_does_not_pay_keeps_adaptive_at_plain_speed():
    """Asking costs 4% of a plain step and nothing pays: without the guard adaptive runs at ~0.96x plain; the
    guard rests the drafters and holds it at >= 0.98x."""
    wl = _long_trace()
    off, _ = _replay(wl, OFF)
    on, g = _replay(wl, CFG)
    assert off["speedup"] < 0.97, off["speedup"]
    assert on["speedup"] >= 0.98 and g.rests >= 2, (on["speedup"], g.rests)


def test_replayed_peeks_catch_a_reply_that_starts_to_copy():
    """The same text turns to copying after 200 tokens, inside a long rest: a peek wakes the drafters within
    peek_every windows, so adaptive keeps what drafting without a guard gains there (1.41x; without peeks the
    rest runs on: 1.29x)."""
    wl = _long_trace(n_out=500, copy_from=200)
    off, _ = _replay(wl, OFF)
    on, g = _replay(wl, CFG)
    assert g.rests >= 2 and on["speedup"] > 1.3
    assert on["speedup"] >= 0.97 * off["speedup"], (on["speedup"], off["speedup"])


@pytest.mark.parametrize("bad", [dict(guard_windows=0), dict(probe_windows=0), dict(guard_margin=1.0),
                                 dict(guard_budget=0.0), dict(rest_min=0), dict(rest_min=9, rest_max=8),
                                 dict(peek_every=0)])
def test_config_is_validated(bad):
    with pytest.raises(ValueError):
        SchedulerConfig(**bad)
