"""Adaptive decoding on the embedded models: token-ID parity with plain decoding on every workload (greedy and
seeded sampling), per-window decisions recorded, the trace file, and the CLI default."""

import json

import pytest

from guild.engine.sampling import SamplingParams
from guild.workloads import load_workloads

ALL = [w.id for w in load_workloads()]
SEEDED = SamplingParams(temperature=0.3, top_k=40, top_p=0.9, min_p=0.05, seed=7)


def _workload_runs(lm, strategy, sampling, clock, crop=64, n=12):
    """Each workload's turns, cropped to their last `crop` tokens, decoded in turn on one session per workload
    (so later turns continue the session, as W5's conversation does); with the windows that drafted, accepted a
    draft and rejected one."""
    from guild.engine.session import GuildSession
    from guild.speculative.build import make_drafter

    out = {}
    for w in load_workloads():
        inst = w.instances(lm.tokenizer, 8192)[0]  # W10: its 512-token instance
        s = GuildSession(lm.model, n_ctx=1024, eos_ids=lm.tokenizer.eos_ids)
        d = make_drafter(strategy, mtp_head=lm.mtp_head(strategy), n_ctx=1024)
        if strategy == "adaptive":  # its choices then rest on acceptance alone, the same under any load
            d.clock = clock
        for text in inst.corpus_texts():
            if hasattr(d, "ingest"):
                d.ingest(lm.tokenizer.encode(text))
        toks, windows = [], [0, 0, 0]
        for turn in inst.render_turns():
            ids = lm.tokenizer.encode(turn, add_special=False)[-crop:]
            got, st = s.generate(ids, n, sampling=inst.sampling_params() if sampling is None else sampling,
                                 drafter=d, max_draft=4)
            toks.append(got)
            for i, kind in enumerate((lambda r: r.k, lambda r: r.emitted > 1, lambda r: r.emitted <= r.k)):
                windows[i] += sum(1 for r in st.windows if r.k and kind(r))
        out[w.id] = (toks, windows)
    return out


@pytest.mark.parametrize("model,sampling,strategies", [
    ("moe", SamplingParams(), ("adaptive", "mtp")), ("moe", SEEDED, ("mtp",)), ("dense", SEEDED, ("adaptive",))],
    ids=["moe-greedy", "moe-seeded", "dense-seeded"])
def test_parity_on_every_workload(model, sampling, strategies, moe_path, dense_path, fixed_clock):
    """adaptive (with the shipped MTP head on the MoE) and mtp emit exactly plain decoding's tokens."""
    from guild.load import load

    lm = load(moe_path if model == "moe" else dense_path)
    assert (lm.mtp_head("adaptive") is not None) == (model == "moe")  # the MoE's head ships with guild
    plain = _workload_runs(lm, "normal", sampling, fixed_clock)
    for strategy in strategies:
        got = _workload_runs(lm, strategy, sampling, fixed_clock)
        assert list(got) == ALL
        for wid in ALL:
            assert got[wid][0] == plain[wid][0], (strategy, wid)
        drafted, accepted, rejected = (sum(w[i] for _, w in got.values()) for i in range(3))
        assert drafted and accepted and rejected, (strategy, drafted, accepted, rejected)


def test_cli_trace_and_default_strategy(tmp_path, moe_path):
    from typer.testing import CliRunner

    from guild.cli import app

    trace = tmp_path / "t.jsonl"
    prompt = "Copy this list exactly: alpha beta gamma delta epsilon zeta eta theta. Again: alpha beta gamma"
    r = CliRunner().invoke(app, ["run", moe_path, "-p", prompt, "-n", "24", "--trace", str(trace), "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["strategy"] == "adaptive"
    lines = [json.loads(x) for x in trace.read_text().splitlines()]
    assert len(lines) == out["windows"] and lines[0]["decision"]["reason"] == "unseeded"
    decided = [x for x in lines if x["decision"] and x["decision"]["candidates"]]
    assert decided and all("normal" in x["decision"]["candidates"] for x in decided)
    for x in lines:
        assert x["strategy"] in ("normal", "lookup", "retrieval", "mtp") and x["verify_ms"] > 0
        assert x["emitted"] >= 1 and 1 <= x["kept"] <= x["k"] + 1
        assert x["measured_ms_per_token"] == pytest.approx((x["draft_ms"] + x["verify_ms"]) / x["emitted"], abs=1e-3)
    # the per-window breakdown: where each window's rows start, each drafter's propose time, the context V(T)
    # was last measured at (live: the window before)
    assert [x["context"] for x in lines] == sorted(x["context"] for x in lines) and lines[0]["context"] >= 20
    for a, b in zip(lines, lines[1:], strict=False):
        assert b["context"] == a["context"] + a["kept"]
        assert b["decision"] is None or b["decision"]["vt_context"] == a["context"]  # None: no room to draft
    assert {"lookup", "retrieval"} <= set(decided[0]["propose_ms"])
    assert out["propose_ms"]["lookup"] > 0 and out["measured_ms_per_token"] > 0 and out["rest_windows"] >= 0
    assert out["predicted_ms_per_token"] > 0


def test_cli_mtp_uses_the_shipped_head(moe_path):
    """`--decode-strategy mtp` on the embedded MoE finds the head shipped in guild/heads/, drafts every window,
    and emits plain decoding's tokens; `guild inspect` names the head."""
    from typer.testing import CliRunner

    from guild.cli import app

    prompt = "Explain in two sentences why the sky is blue."
    args = ["run", moe_path, "--chat", "-p", prompt, "-n", "32", "--json", "--device", "cpu"]
    plain = json.loads(CliRunner().invoke(app, [*args, "--decode-strategy", "normal"]).stdout)
    r = CliRunner().invoke(app, [*args, "--decode-strategy", "mtp"])
    assert r.exit_code == 0, r.output
    got = json.loads(r.stdout)
    assert got["tokens"] == plain["tokens"]
    assert got["mtp_head"].endswith("heads/smollm2-135m-moe.mtp.gguf")
    assert got["strategies"]["mtp"]["windows"] >= got["windows"] - 1 and got["accepted"] > 0
    r = CliRunner().invoke(app, ["inspect", moe_path, "--json"])
    assert json.loads(r.stdout)["mtp_head"].endswith("heads/smollm2-135m-moe.mtp.gguf")
