"""guild.tools.kbench --attention: one layer's attention timed per KV cache type and window size; bad flag values
are argparse's one-line usage errors."""

import pytest

from guild.tools import kbench


def test_attention_times_every_type_and_window(capsys):
    kbench.main(["--attention", "64", "--cache-types", "f32,f16,q8_0", "--threads", "1", "--rows", "1,2",
                 "--seconds", "0.001"])
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.strip().startswith("64 ")]
    assert [ln.split()[1] for ln in lines] == ["f32", "f16", "q8_0"]
    assert all("T1" in ln and "(1.00)" in ln and "T2" in ln for ln in lines)


@pytest.mark.parametrize("args, msg", [
    (["--attention", "4k"], "--attention: expected comma-separated positive integers, got '4k'"),
    (["--attention", "64", "--rows", "0"], "--rows: expected comma-separated positive integers, got '0'"),
    (["--attention", "64", "--rows", "128"], "--rows: a window of 128 rows does not fit a context of 64"),
    (["--attention", "64", "--cache-types", "q4_0"], "--cache-types: q4_0 is not one of"),
])
def test_bad_attention_flags_are_one_line(capsys, args, msg):
    with pytest.raises(SystemExit) as e:
        kbench.main(args)
    assert e.value.code == 2 and msg in capsys.readouterr().err.strip().splitlines()[-1]
