"""The kernels case: one layer's attention timed per KV cache type and window size, the matmul kernels' G weights/s
per type and shape; bad flag values are one-line errors."""

import json

import pytest

from guild.bench.main import main


def _records(capsys) -> list[dict]:
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def test_attention_times_every_type_and_window(capsys, threads):
    assert main(["kernels", "--attention", "64", "--cache-types", "f32,f16,q8_0", "-t", "1", "--rows", "1,2",
                 "--seconds", "0.001", "--json"]) == 0
    recs = _records(capsys)
    assert [r["point"] for r in recs] == [{"context": 64, "kv": kv} for kv in ("f32", "f16", "q8_0")]
    for r in recs:
        assert set(r["figures"]["window_ms"]["series"]) == {"1", "2"}
        assert r["figures"]["window_ratio"]["series"]["1"]["median"] == 1.0 and r["host"]["threads"] == 1


def test_matmul_weights_per_second_per_shape(capsys, threads):
    """Q4_K's 256-weight blocks do not divide K = 576: those shapes run at K = 768."""
    assert main(["kernels", "--types", "q8_0,Q4_K", "-t", "1", "--rows", "1", "--seconds", "0.001", "--json"]) == 0
    recs = _records(capsys)
    assert [(r["point"]["type"], r["point"]["k"]) for r in recs][:5] == [("Q8_0", 576), ("Q8_0", 576),
                                                                         ("Q8_0", 1536), ("Q8_0", 576), ("Q4_K", 768)]
    assert len(recs) == 8 and all(r["figures"]["gweights_s"]["series"]["1"]["median"] > 0 for r in recs)


@pytest.mark.parametrize("args, msg", [
    (["--attention", "4k"], "--attention: expected comma-separated positive integers, got '4k'"),
    (["--attention", "64", "--rows", "0"], "--rows: expected comma-separated positive integers, got '0'"),
    (["--attention", "64", "--rows", "128"], "--rows: a window of 128 rows does not fit a context of 64"),
    (["--attention", "64", "--cache-types", "q4_0"], "--cache-types: q4_0 is not one of"),
    (["--types", "Q9_9"], "--types: Q9_9 is not one of"),
])
def test_bad_flags_are_one_line(capsys, args, msg):
    assert main(["kernels", *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and msg in err
