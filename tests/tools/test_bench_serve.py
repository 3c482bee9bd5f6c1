"""make bench-serve's report: the servers side by side per workload and client count, and a --llama-server that
is not there named in one error before anything starts."""

import pytest

from guild.tools import bench_serve


def _row(server, strategy, wid, clients, tok_s, ttft):
    return {"server": server, "strategy": strategy, "workload": wid, "clients": clients, "aggregate_tok_s": tok_s,
            "per_request_tok_s": tok_s / clients, "ttft_ms_p50": ttft, "ttft_ms_max": ttft, "tokens": 64}


def test_side_by_side_puts_each_server_in_its_column():
    rows = [_row("guild", "normal", "W2", 1, 10.0, 50.0), _row("guild", "adaptive", "W2", 1, 12.0, 55.0),
            _row("guild", "normal", "W2", 4, 30.0, 80.0), _row("guild", "adaptive", "W2", 4, 33.0, 90.0),
            _row("llama-server", "-", "W2", 1, 20.0, 40.0), _row("llama-server", "-", "W2", 4, 50.0, 70.0)]
    md = bench_serve.side_by_side(rows).splitlines()
    assert md[0] == ("| workload | clients | tok/s guild normal | tok/s guild adaptive | tok/s llama-server | "
                     "TTFT p50 ms guild normal | TTFT p50 ms guild adaptive | TTFT p50 ms llama-server |")
    assert md[2:] == ["| W2 | 1 | 10.0 | 12.0 | 20.0 | 50.0 | 55.0 | 40.0 |",
                      "| W2 | 4 | 30.0 | 33.0 | 50.0 | 80.0 | 90.0 | 70.0 |"]
    only_guild = bench_serve.side_by_side(rows[:4]).splitlines()
    assert "llama-server" not in only_guild[0] and only_guild[2] == "| W2 | 1 | 10.0 | 12.0 | 50.0 | 55.0 |"


def test_a_missing_llama_server_is_named_before_anything_starts(tmp_path):
    with pytest.raises(RuntimeError, match=r"--llama-server .*nope: not an executable file \(make llama-server"):
        bench_serve.main(["--llama-server", str(tmp_path / "nope"), "--out", str(tmp_path)])
    assert not (tmp_path / "bench_serve.json").exists()
