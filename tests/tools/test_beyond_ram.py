"""`make bench-beyond-ram` (guild.tools.beyond_ram) on the embedded MoE with an expert cache a third of its size:
the report's figures come from the run (reads, hits, the disk probe) and the strategies emit the same tokens."""

import json
import subprocess
import sys

import pytest

from guild.tools import beyond_ram

pytestmark = pytest.mark.slow


def test_smoke_run_reports_the_cache_and_the_disk_bound(moe_path, capsys):
    rc = beyond_ram.main(["--model", moe_path, "--expert-cache-mem", "150M", "-n", "4", "--no-llama", "--json",
                          "--strategies", "normal,lookup", "--workloads", "W9", "--rounds", "2"])
    assert rc == 0
    rep = json.loads(capsys.readouterr().out)
    c = rep["cache"]
    assert c["resident_bytes"] <= c["bound"] == 150 << 20 < c["expert_bytes"]
    assert rep["read_gb_s"] > 0 and rep["peak_rss"] > 0
    # alternated rounds, each from an emptied cache (every round reads)
    assert [(r["strategy"], r["round"]) for r in rep["guild"]] == [
        ("normal", 0), ("lookup", 0), ("lookup", 1), ("normal", 1)]
    assert all(r["bytes_read_per_token"] > 0 for r in rep["guild"])
    normal, lookup = rep["guild"][:2]
    assert normal["tokens"] == lookup["tokens"] and len(normal["tokens"]) == 4
    assert sum(normal["draft_lengths"].values()) == normal["windows"] and set(normal["draft_lengths"]) == {"0"}
    assert normal["bytes_read_per_token"] > 0 and 0 <= normal["hit_rate"] <= 1 and normal["decode_tok_s"] > 0
    b = normal["breakdown"]  # the cache's counters: each read is one expert, by the window or ahead of it
    assert 0 < normal["bytes_read_per_token"] / b["reads_per_token"] <= c["slot_bytes"]
    assert 0 <= b["sync_reads_per_token"] <= b["reads_per_token"] and b["mean_depth"] >= 1
    assert 0 <= b["ms_per_token"]["wait_s"] < b["ms_per_token"]["wall_s"]
    md = beyond_ram.report(rep)
    assert "| W9 | guild | normal |" in md and "strategies emit the same tokens: True" in md
    assert "W9 normal: " in md and "ms/token = waiting on reads" in md and "every round's tok/s: W9 normal" in md


def test_a_bad_mem_value_is_one_line(moe_path, capsys):
    assert beyond_ram.main(["--model", moe_path, "--expert-cache-mem", "lots", "--no-llama"]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        "error: --expert-cache-mem must be auto, off or a size such as 3G or 512MiB, got 'lots'"]


def test_a_cap_kills_a_process_that_outgrows_it_and_spares_one_that_fits():
    cap = beyond_ram.make_cap(64 << 20, "test")
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
