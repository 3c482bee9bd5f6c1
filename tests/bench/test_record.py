"""One record schema: figures only under the names FIGURES lists, stats or series; the host's ISA level read from
its CPU flags; every record carries commit, host, versions and command."""

import pytest

from guild.bench import host
from guild.bench.record import Record, ratio, series, stats


def test_unknown_figure_is_refused():
    with pytest.raises(ValueError, match="unknown figure"):
        Record("c", {}, "r", {"tok_s": stats([1.0])})
    with pytest.raises(ValueError, match="not stats"):
        Record("c", {}, "r", {"decode_tok_s": 3.0})


def test_stats_series_and_ratio():
    a = Record("c", {}, "a", {"decode_tok_s": stats([3, 1, 2]), "window_ms": series({1: [1.0, 3.0], 2: [4.0]})})
    b = Record("c", {}, "b", {"decode_tok_s": stats([4.0])})
    assert a.median("decode_tok_s") == 2 and a.median("window_ms", 1) == 2.0 and a.median("window_ms", 2) == 4.0
    assert ratio(a, b, "decode_tok_s") == 0.5 and ratio(a, b, "ttft_ms") is None
    with pytest.raises(ValueError):
        stats([])


@pytest.mark.parametrize("flags,level", [
    ({"avx512f", "avx512bw", "avx512_vnni", "amx_int8", "amx_tile", "avx2", "fma"}, "amx-int8"),
    ({"avx512f", "avx512bw", "avx512_vnni", "avx2", "fma"}, "avx512-vnni"),
    ({"avx2", "fma", "avx_vnni"}, "avx-vnni"),
    ({"avx2", "fma", "sse4_2"}, "avx2"),
    ({"sse2"}, "baseline"),
])
def test_isa_level(flags, level):
    assert host.isa_level(flags) == level


def test_provenance_names_commit_host_and_command():
    p = host.provenance(2, "python -m guild.bench decode")
    assert p["command"] == "python -m guild.bench decode" and p["date"] and len(p["load"]) == 3
    assert p["host"]["threads"] == 2 and p["host"]["cores"] >= 1 and p["host"]["isa"]
    assert len(p["commit"].split("+")[0]) == 12 or p["commit"] == "unknown"
    assert {"guild", "numpy", "numba"} <= set(p["versions"])


def test_the_command_line_as_started(monkeypatch):
    monkeypatch.setattr(host.sys, "argv", ["guild/bench/__main__.py", "decode", "--models", "a b.gguf"])
    assert host.provenance(1)["command"] == "python -m guild.bench decode --models 'a b.gguf'"
    monkeypatch.setattr(host.sys, "argv", ["/x/guild/__main__.py", "bench", "-n", "4"])
    assert host.provenance(1)["command"] == "python -m guild bench -n 4"
