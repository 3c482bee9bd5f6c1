"""The beyond_ram case on the embedded MoE with an expert cache a third of its size: a run reads its experts through
the bounded cache and reports the disk's bound and where its time went, strategies alternate over rounds with the
same tokens, a bad size is one line, and a memory cap kills a process that outgrows it."""

import json
import re
import subprocess
import sys

import pytest

from guild.bench import main as bench
from guild.bench.memcap import make_cap

ARGS = ["--expert-cache-mem", "150M", "-n", "4", "--no-llama", "--strategies", "normal,lookup", "--workloads", "W9"]


@pytest.mark.slow
def test_a_run_reads_through_a_cache_below_the_model_and_reports_the_disk_bound(moe_path):
    p = subprocess.run([sys.executable, "-m", "guild.bench", "beyond_ram", "--model", moe_path, *ARGS,
                        "--child", "normal", "--point", '{"workload": "W9"}'], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-2000:]
    run = json.loads(p.stdout.strip().splitlines()[-1])
    c, f = run["extra"], run["figures"]
    assert c["resident_bytes"] <= c["bound"] == 150 << 20 < c["expert_bytes"]
    assert len(run["tokens"]) == 4 and f["decode_tok_s"] > 0 and 0 <= f["hit_rate"] <= 1
    assert f["gb_s"] > 0 and f["rss_added_mb"] > 0 and f["bound_tok_s"] > 0 and f["bound_share"] > 0
    assert f["tokens_per_window"] == 1 and "acceptance" not in f  # normal drafts nothing
    ev, ms = f["events_per_token"], f["token_ms"]  # the cache's counters: each read is one expert
    assert 0 < f["mb_per_token"] * 1e6 / ev["reads"] <= c["slot_bytes"]
    assert 0 <= ev["window_reads"] <= ev["reads"] and f["reads_in_flight"] >= 1
    assert 0 <= ms["waiting"] < ms["token"]


@pytest.mark.slow
def test_strategies_alternate_over_rounds_with_the_same_tokens(moe_path, tmp_path, capsys):
    assert bench.main(["beyond_ram", "--model", moe_path, *ARGS, "--rounds", "2", "--json", "--out",
                       str(tmp_path)]) == 0
    recs = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [(r["runner"], r["parity"]) for r in recs] == [("normal", True), ("lookup", True)]  # lookup: exact
    for r in recs:  # each round from a fresh process and an emptied cache: every round reads
        f = r["figures"]
        assert len(f["decode_tok_s"]["runs"]) == 2 and min(f["mb_per_token"]["runs"]) > 0
        assert len(f["rss_added_mb"]["runs"]) == 2 and r["point"] == {"workload": "W9"}
    md = (tmp_path / "beyond_ram.md").read_text()
    assert re.search(r"\| workload=W9 \| normal \| [\d.]+ \([\d.]+–[\d.]+\) \|", md)  # every round's tok/s
    assert "W9 normal: " in md and "ms/token = waiting on reads" in md
    assert "memory: " in md and "≠" not in md


def test_a_bad_mem_value_is_one_line(moe_path, capsys):
    assert bench.main(["beyond_ram", "--model", moe_path, "--expert-cache-mem", "lots", "--no-llama"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "error: --expert-cache-mem must be auto, off or a size such as 3G or 512MiB, got 'lots'"]


def test_a_cap_kills_a_process_that_outgrows_it_and_spares_one_that_fits():
    cap = make_cap(64 << 20, "test")
    if cap is None:
        pytest.skip("no memory cgroup can be made here (no rights or no memory controller)")
    try:
        def run(mb):
            return subprocess.run(["sh", "-c", f'echo $$ > "{cap}/cgroup.procs" && exec "$@"', "sh", sys.executable,
                                   "-c", f"b = bytearray({mb} << 20); b[::4096] = b'x' * len(b[::4096])"]).returncode
        assert run(8) == 0
        assert run(256) != 0
    finally:
        cap.rmdir()
