"""The serve case: each server's records at every (workload, clients) point beside llama-server's, guild alone when
there is none (and the report says so), a --llama-server that is not there named in one error before anything
starts, and a real `guild serve` measured under two streaming clients."""

import json
import os

import pytest

from guild.bench import main as bench
from guild.bench.cases import serve
from guild.bench.harness import measure
from guild.bench.output import markdown


def _case(argv):
    a = bench.parser("serve", serve).parse_args(argv)
    serve.check(a)
    return a


class FakeServer:
    """Started without a process: its port names the command it was given."""

    def __init__(self, cmd, ready, port, log):
        self.port = 1 if "guild" in cmd else 2

    def start(self):
        return self

    def stop(self):
        pass


def test_records_put_each_server_beside_llama_server(moe_path, tmp_path, monkeypatch):
    binary = tmp_path / "llama-server"
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    speed = {(1, "normal"): 10.0, (1, "adaptive"): 12.0, (2, None): 20.0}

    def chats(port, prompts, clients, max_tokens, extra):
        tok_s = speed[(port, extra.get("decode_strategy"))] * clients
        return {"aggregate_tok_s": tok_s, "per_request_tok_s": tok_s / clients, "ttft_ms_p50": 50.0 * port,
                "ttft_ms_max": 60.0 * port, "tokens": 64}

    monkeypatch.setattr(serve.S, "Server", FakeServer)
    monkeypatch.setattr(serve.S, "concurrent_chats", chats)
    a = _case(["--model", moe_path, "--clients", "1,4", "--workloads", "W2", "--llama-server", str(binary)])
    recs = measure("serve", serve.points(a), serve.runners(a), 1, {})
    assert [(r.point["clients"], r.runner) for r in recs] == [
        (c, n) for c in (1, 4) for n in ("guild normal", "guild adaptive", "llama-server")]
    by = {(r.point["clients"], r.runner): r for r in recs}
    assert by[(4, "guild adaptive")].median("aggregate_tok_s") == 48.0
    assert by[(4, "llama-server")].median("ttft_ms") == 100.0 and by[(1, "guild normal")].median("ttft_max_ms") == 60
    md = markdown(recs, serve.BASELINE).splitlines()
    assert md[0].endswith("| vs llama-server |")
    assert md[6] == ("| workload=W2 clients=4 | guild adaptive | 12.0 | 50.0 | 48.0 | 60.0 | decode 0.60×, time to "
                     "first token 0.50×, all clients' tokens 0.60×, slowest time to first token 0.50× |")
    assert serve.notes(recs, a) == []
    alone = _case(["--model", moe_path, "--clients", "1", "--workloads", "W2"])
    assert [r.name for r in serve.runners(alone)] == ["guild normal", "guild adaptive"]
    assert "llama-server: not run" in serve.notes([], alone)[0]


def test_a_missing_llama_server_is_named_before_anything_starts(tmp_path, capsys):
    assert bench.main(["serve", "--llama-server", str(tmp_path / "nope"), "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"error: --llama-server {tmp_path / 'nope'}: not an executable file (make llama-server builds it)"]
    assert os.listdir(tmp_path) == []


@pytest.mark.slow
def test_guild_serve_under_two_clients(moe_path, tmp_path, capsys):
    assert bench.main(["serve", "--model", moe_path, "--clients", "2", "--workloads", "W2", "-n", "4", "-t", "2",
                       "--out", str(tmp_path), "--json"]) == 0
    recs = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [r["runner"] for r in recs] == ["guild normal", "guild adaptive"]
    for r in recs:
        f = r["figures"]
        assert f["aggregate_tok_s"]["median"] > 0 and 0 < f["ttft_ms"]["median"] <= f["ttft_max_ms"]["median"]
        assert r["point"] == {"workload": "W2", "clients": 2} and r["commit"] and r["host"]["threads"] == 2
    assert "llama-server: not run" in (tmp_path / "serve.md").read_text()
    assert (tmp_path / "serve.guild.log").is_file()  # the server's log beside the records
