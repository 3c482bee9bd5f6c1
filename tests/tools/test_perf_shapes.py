"""perf_shapes on a small synthetic real-architecture file: both numerics measured (decode, prefill, time to
first token, V(T) for T = 1..8; distinct experts and the bandwidth bound under i8), bad flags are one-line
errors."""

import json

import pytest

from guild.tools import perf_shapes, synth


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    path = tmp_path_factory.mktemp("shapes") / "q3.gguf"
    synth.main(["qwen3-30b-a3b", "--layers", "1", "--scale", "0.0625", "--type", "Q4_K_M", "-o", str(path)])
    return str(path)


def test_measures_both_numerics(small, capsys):
    assert perf_shapes.main([small, "--rounds", "1", "--tokens", "3", "--no-llama", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)["results"][small]
    assert set(r) == {"guild i8", "guild f32"}
    assert all(v["decode"] > 0 and v["prefill"] > 0 and v["ttft_ms"] > 0 for v in r.values())
    assert all(sorted(map(int, v["vt_ms"])) == list(range(1, 9)) for v in r.values())
    i8 = r["guild i8"]
    assert all(1 <= d <= 8 * T for T, d in ((int(t), d) for t, d in i8["distinct"].items()))  # top-8 of 128
    assert i8["bound"] > 0 and 0 < i8["bound_share"] < 10
    bvt = {int(T): v for T, v in i8["bytes_vt"].items()}  # a window reads at least one row's bytes
    assert sorted(bvt) == list(range(1, 9)) and bvt[1] == 1.0 and all(v >= 1 for v in bvt.values())


def test_bad_flags_are_one_line_errors(small, capsys):
    assert perf_shapes.main([small, "--rounds", "0"]) == 1
    assert perf_shapes.main(["/nonexistent.gguf"]) == 1
    assert perf_shapes.main([]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(e.startswith("error: ") for e in err)
