"""guild.tools.replay: the scheduler replayed over recorded proposals, against the oracle's ceiling."""

import json

import pytest

from guild.tools import replay as R


def _trace(n_out=60, lookup_from=20, mtp_right=False, lookup=True):
    """One turn of a period-7 text: lookup proposes the true continuation from `lookup_from` on, the lazy MTP
    head one token (right or wrong) with probability 0.9. Plain step 10 ms; V(T)/V(1) = 1 + 0.3 (T - 1)."""
    period = [11, 12, 13, 14, 15, 16, 17]
    prompt = [1, 2, 3]
    toks = prompt + [period[i % 7] for i in range(n_out)]
    n0 = len(prompt) + 1
    windows = {}
    for n in range(n0, len(toks)):
        room = min(64 - (n - n0 + 1) - 1, 4)
        lk = toks[n : n + 4] if lookup and n - n0 >= lookup_from else []
        windows[str(n)] = {"room": room, "proposals": {
            "lookup": {"tokens": lk, "signals": {"match_len": 9, "freq": 3}, "ms": 0.05, "lazy": False, "rows": 0},
            "mtp": {"tokens": [toks[n] if mtp_right else 999], "signals": {"prob": 0.9}, "ms": 1.0, "lazy": True,
                    "rows": 1},
        }}
    return {"id": "T", "rho": [1 + 0.3 * t for t in range(5)],
            "turns": [{"tokens": toks, "n0": n0, "max_tokens": 64, "v1_ms": 10.0, "windows": windows}]}


def test_replay_gains_where_lookup_is_right_and_stays_under_the_oracle():
    wl = _trace()
    r = R.replay(wl)
    # lookup is always right; the head never is, though it says 90%: two misses overturn that before the back-off
    assert r["drafted"] > 0 and r["accepted"] >= r["drafted"] - 2
    assert 1.3 < r["speedup"] <= R.oracle(wl) + 1e-9
    # an MTP head that is never right adds nothing a perfect policy would use
    assert R.oracle(wl) == pytest.approx(R.oracle(wl, ("lookup",)))
    assert R.oracle(_trace(mtp_right=True)) > R.oracle(wl)


def test_a_model_fitted_in_hindsight_sits_between_the_scheduler_and_the_oracle():
    """`fitted` freezes the acceptance model at the weights fitted to the workload's own outcomes: on a text where
    lookup is always right and the head never, it knows that from the first window, so it beats the learning
    scheduler and stays under the oracle; `fit_priors` reads those outcomes back as the drafters' priors."""
    wl = _trace()
    f = R.fitted(wl)
    assert R.replay(wl)["speedup"] < f <= R.oracle(wl) + 1e-9
    pri = R.fit_priors({"max_draft": 4, "workloads": [wl]})
    assert pri["lookup"]["priors"]["m8"] > 0.9 and pri["mtp"]["priors"]["hi"] < 0.1
    assert R.fit_priors({"max_draft": 4, "workloads": [wl]}, ["W1"]) == {}  # no such workload: nothing pooled


def test_nothing_to_draft_costs_only_the_asking():
    wl = _trace(lookup=False)
    assert R.oracle(wl, ("lookup",)) == pytest.approx(1.0)
    r = R.replay(wl)
    assert r["drafted"] <= 2  # a wrong head is muted after its first failures
    assert 0.9 < r["speedup"] <= 1.0


def test_bad_traces_are_one_line_errors(tmp_path):
    from guild.errors import GuildError

    with pytest.raises(GuildError, match="No such file"):
        R.load_trace(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(GuildError, match="not a trace"):
        R.load_trace(tmp_path / "bad.json")
    (tmp_path / "short.json").write_text(json.dumps({"max_draft": 4, "workloads": [{**_trace(), "rho": [1.0]}]}))
    with pytest.raises(GuildError, match="V\\(T\\)"):
        R.load_trace(tmp_path / "short.json")


def test_record_is_plain_decoding_on_the_embedded_model(tmp_path, moe_path):
    """Recording asks every drafter at every position but never drafts: the stream is plain decoding's, and the
    trace replays."""
    from guild.bench.runners import guild_workload
    from guild.engine.options import DecodeOptions
    from guild.load import load_for
    from guild.workloads import load_workloads

    tr = R.record(["W9"], moe_path, max_tokens=8)
    wl = tr["workloads"][0]
    turn = wl["turns"][0]
    # every window but the last (max_tokens leaves it no room to draft)
    assert sorted(int(n) for n in turn["windows"]) == list(range(turn["n0"], len(turn["tokens"]) - 1))
    assert set(next(iter(turn["windows"].values()))["proposals"]) == {"lookup", "retrieval", "mtp"}
    lm = load_for(moe_path, DecodeOptions())
    w = load_workloads(["W9"])[0].instances(lm.tokenizer, 8192)[0]
    plain = guild_workload(lm, w, DecodeOptions(strategy="normal", max_tokens=8, sampling=w.sampling_params()))
    assert turn["tokens"][turn["n0"] - 1 :] == plain.tokens
    assert len(wl["rho"]) == 5 and wl["rho"][0] == 1.0
    (tmp_path / "t.json").write_text(json.dumps(tr))
    R.main(["run", str(tmp_path / "t.json")])


def test_a_constrained_workload_is_recorded_constrained(moe_path):
    """W11's replies follow its JSON schema: the recording (the bench's oracle) decodes under the same grammar,
    so its tokens are constrained normal's, not the unconstrained model's."""
    import dataclasses

    from guild.bench.runners import guild_workload
    from guild.engine.options import DecodeOptions
    from guild.load import load_for
    from guild.workloads import load_workloads

    lm = load_for(moe_path, DecodeOptions())
    w = load_workloads(["W11"])[0]
    o = DecodeOptions(strategy="adaptive", max_tokens=6, sampling=w.sampling_params())
    turn = R.record_instance(lm, w, o)["turns"][0]
    plain = guild_workload(lm, w, dataclasses.replace(o, strategy="normal"))
    free = guild_workload(lm, dataclasses.replace(w, json_schema=None), dataclasses.replace(o, strategy="normal"))
    assert turn["tokens"][turn["n0"] - 1 :] == plain.tokens != free.tokens
