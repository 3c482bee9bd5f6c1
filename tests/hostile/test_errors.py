"""Bad input gets a one-line GuildError naming what is wrong; the CLI exits non-zero without a traceback."""

import pytest
from gguf import GGMLQuantizationType

from guild.errors import (
    ContextOverflowError,
    GgufFormatError,
    GuildError,
    MissingTensorError,
    UnsupportedArchitectureError,
    UnsupportedQuantTypeError,
)
from guild.formats.gguf import GGUFFile, Tensor
from guild.models import load_model
from guild.tools.tiny import write_tiny_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    p = tmp_path_factory.mktemp("err") / "tiny.gguf"
    write_tiny_model(p, qtype="Q8_0")
    return p


def _one_line(e):
    assert isinstance(e, GuildError) and "\n" not in str(e)
    return str(e)


def test_truncated(tiny, tmp_path):
    data = tiny.read_bytes()
    for cut in (10, 200, len(data) // 2, len(data) - 7):
        bad = tmp_path / f"cut{cut}.gguf"
        bad.write_bytes(data[:cut])
        with pytest.raises(GgufFormatError) as ei:
            load_model(str(bad))
        assert str(bad) in _one_line(ei.value)


def test_bad_magic(tiny, tmp_path):
    bad = tmp_path / "magic.gguf"
    bad.write_bytes(b"GGML" + tiny.read_bytes()[4:])
    with pytest.raises(GgufFormatError, match="bad magic"):
        GGUFFile(bad)


def test_missing_file():
    with pytest.raises(GgufFormatError, match="no such file"):
        GGUFFile("/nonexistent/model.gguf")


def test_missing_tensor(tiny):
    g = GGUFFile(tiny)
    del g.tensors["blk.1.attn_q.weight"]
    with pytest.raises(MissingTensorError) as ei:
        load_model(g)
    assert "blk.1.attn_q.weight" in _one_line(ei.value)


def test_unsupported_architecture(tiny):
    g = GGUFFile(tiny)
    g.architecture = "mamba"
    with pytest.raises(UnsupportedArchitectureError) as ei:
        load_model(g)
    assert "mamba" in _one_line(ei.value)


def test_unsupported_quant_type(tiny):
    g = GGUFFile(tiny)
    t = g.tensors["blk.0.ffn_up.weight"]
    g.tensors[t.name] = Tensor(t.name, GGMLQuantizationType.TQ2_0, t.shape, t.data)
    with pytest.raises(UnsupportedQuantTypeError) as ei:
        load_model(g)
    msg = _one_line(ei.value)
    assert "blk.0.ffn_up.weight" in msg and "TQ2_0" in msg


def test_context_overflow(tiny):
    m = load_model(str(tiny))
    st = m.new_state(8)
    with pytest.raises(ContextOverflowError):
        m.forward(list(range(9)), st)


def _cli(*args):
    """In-process: the commands' own error reporting is under test (tests/cli/test_run.py runs the whole program's)."""
    from typer.testing import CliRunner

    from guild.cli import app

    return CliRunner().invoke(app, list(args))


@pytest.mark.parametrize(
    "args, needle",
    [
        (["run", "/nonexistent.gguf", "-p", "hi"], "/nonexistent.gguf"),
        (["run", "smollm2-135m", "-p", "hi", "--threads", "0"], "--threads"),
        (["run", "smollm2-135m", "-p", "hello " * 40, "--context", "16"], "--context 16"),
        (["run", "smollm2-135m", "-p", "hi", "-n", "0"], "--max-tokens"),
        (["run", "smollm2-135m", "-p", "hi", "--decode-strategy", "mtp"], "has no MTP head"),
        (["run", "smollm2-135m", "-p", "hi", "--decode-strategy", "mtp", "--spec-mtp-k", "9"], "--spec-mtp-k"),
        (["run", "smollm2-135m", "-p", "hi", "--mtp-head", "/nonexistent.mtp.gguf"], "/nonexistent.mtp.gguf"),
    ],
)
def test_cli_errors_are_one_line(args, needle):
    r = _cli(*args)
    assert r.exit_code != 0
    assert type(r.exception) is SystemExit  # any other exception would have been a traceback
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], r.stderr
