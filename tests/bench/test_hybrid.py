"""The hybrid case on a small random qwen35moe: V(T) with the recurrence's share, commit(keep), the recurrence
alone under both layouts, plain and lookup on the copy workload (lookup's tokens held to plain's), and the
rollbacks' price against V(5) in the notes."""

import json

import numpy as np

from guild.bench import deltanet as D
from guild.bench.cases import hybrid
from guild.bench.main import main
from guild.models import load_model
from guild.tools.tiny_hybrid import write_tiny_hybrid


def test_windows_and_commits_time_the_recurrence(tmp_path):
    m = load_model(str(write_tiny_hybrid(tmp_path / "h.gguf", seed=2, context=512)))
    for mode in D.ROLLBACKS:
        w = D.windows(m, mode, 1, 512)
        assert sorted(w["window_ms"]) == list(range(1, 9)) and w["window_ratio"][1] == 1.0
        assert all(0 < s < 1 for s in w["recurrence_share"].values()) and set(w["commit_ms"]) == {1, 2, 3, 4, 5}


def test_recurrence_alone_under_both_layouts():
    replay = D.recurrence("replay", 1, layers=2, Hv=4, Hk=2, d=16)
    snapshot = D.recurrence("snapshot", 1, layers=2, Hv=4, Hk=2, d=16)
    assert replay["recurrence_ms"] > 0 and snapshot["recurrence_ms"] > 0 and set(replay["commit_ms"]) == {1, 2, 3, 4}
    assert "commit_ms" not in snapshot


def test_the_case_end_to_end(monkeypatch, capsys, threads):
    monkeypatch.setattr(hybrid, "MODEL", dict(context=2048, vocab=512, seed=11))
    # Qwen3.5's size is timed above; here a stand-in
    monkeypatch.setattr(D, "recurrence", lambda mode, repeats: {"recurrence_ms": 1.0})
    small = ["hybrid", "--repeats", "1", "--rounds", "1", "-n", "12", "--edit-every", "4", "-t", "1", "--qtype", "F32"]
    assert main(small) == 0
    md = capsys.readouterr().out
    assert "lookup / plain, replay:" in md and "replay's rollback (worst keep < 5)" in md
    assert main([*small, "--json"]) == 0
    recs = {(r["runner"], r["point"]["rollback"]): r for r in map(json.loads, capsys.readouterr().out.splitlines())}
    assert len(recs) == 8 and all(recs[("lookup", m)]["parity"] for m in D.ROLLBACKS)
    for m in D.ROLLBACKS:
        assert recs[("plain", m)]["figures"]["commit_ms"]["median"] > 0
        assert np.isfinite(recs[("window", m)]["figures"]["recurrence_share"]["series"]["5"]["median"])


def test_repeats_beyond_the_state_are_one_line(capsys):
    assert main(["hybrid", "--repeats", "60"]) == 2
    assert capsys.readouterr().err == "error: --repeats must be in 1..48, got 60\n"
