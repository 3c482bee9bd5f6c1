"""Records out and back: JSON Lines round trip, the markdown table with ratios to the baseline runner, the
current-figures table for docs/benchmarks.md, a bad records file as a one-line error."""

import pytest

from guild.bench import output
from guild.bench.record import Record, series, stats
from guild.errors import BadFlagError

META = {"commit": "abc123", "host": {"cpu": "Xeon", "isa": "avx2", "threads": 2, "cores": 2},
        "command": "python -m guild.bench decode", "date": "2026-12-04", "load": [0.1, 0.1, 0.1]}


def _recs():
    return [Record("decode", {"model": "m.gguf"}, "guild", {"decode_tok_s": stats([30.0, 32.0]),
                                                             "window_ms": series({1: [2.0]})}, True, META),
            Record("decode", {"model": "m.gguf"}, "llama.cpp", {"decode_tok_s": stats([20.0])}, False, META)]


def test_jsonl_round_trip(tmp_path):
    output.write(_recs(), tmp_path, "decode", "table")
    back = output.read([str(tmp_path / "decode.jsonl")])
    assert [r.to_json() for r in back] == [r.to_json() for r in _recs()]
    assert (tmp_path / "decode.md").read_text() == "table\n"


def test_markdown_shows_medians_spread_and_ratio():
    md = output.markdown(_recs(), "llama.cpp")
    assert "| model=m.gguf | guild | 31.0 (30.0–32.0) | 2 | decode 1.55× |" in md
    assert "| llama.cpp ≠ | 20.0 |" in md


def test_current_table():
    t = output.current(_recs(), ["decode_tok_s"])
    assert "| decode | model=m.gguf | decode tok/s | guild | 31.0 | 20.0 | 1.55× | [1] |" in t
    assert t.endswith("- [1] Xeon (avx2), 2 threads of 2 cores, commit abc123: `python -m guild.bench decode`")


def test_bad_records_file(tmp_path):
    (tmp_path / "x.jsonl").write_text('{"case": 1}\n')
    with pytest.raises(BadFlagError, match="x.jsonl:1: not a benchmark record"):
        output.read([str(tmp_path / "x.jsonl")])
    with pytest.raises(BadFlagError, match="nope.jsonl"):
        output.read([str(tmp_path / "nope.jsonl")])


def test_report_beside_another_runner(tmp_path, capsys):
    """`report --baseline RUNNER`: guild beside any runner of the records (an ik_llama.cpp llama-bench, say)."""
    from guild.bench import main

    recs = [*_recs(), Record("decode", {"model": "m.gguf"}, "ik", {"decode_tok_s": stats([25.0])}, None, META)]
    output.write(recs, tmp_path, "decode", "t")
    assert main.main(["report", "--baseline", "ik", str(tmp_path / "decode.jsonl")]) == 0
    out = capsys.readouterr().out
    assert "| guild | 31.0 | 25.0 | 1.24× | [1] |" in out and "| llama.cpp | 20.0 | 25.0 | 0.80× |" in out


@pytest.mark.parametrize("argv", [["report"], ["report", "--baseline"], ["report", "--baseline", "ik"]])
def test_report_without_files_is_a_one_line_error(argv, capsys):
    from guild.bench import main

    assert main.main(argv) == 2
    assert capsys.readouterr().err.strip() == "error: report: give [--baseline RUNNER] FILE.jsonl ..."
