"""`guild run`, `guild bench` and `guild optimize` with `--device cuda` end to end, CLI defaults otherwise, on the
counting host backend standing in for a GPU (GUILD_FAKE_GPU=1, guild.engine.device): the tokens of
`--device cpu`, the placement said in words, the plan's placement used by `run --gexec`; and the VRAM budget
forcing a split."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from guild.cli import app
from guild.engine.backends import HostBackend
from guild.engine.device import Device
from guild.engine.gpu import describe, split_onto_device
from guild.engine.placement import VRAM_RESERVE, VRAM_SHARE, GpuSplit, Parts, default_placement, spill_report
from guild.models import load_model
from guild.tools.tiny import write_tiny_model, write_tiny_mtp_head
from guild.tools.tiny_hybrid import write_tiny_hybrid

pytestmark = pytest.mark.gpu  # the GPU path, on the fake device (HostBackend.fake_device)

PROMPT = "abc abc abc abc abc"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("gpucli")
    path = write_tiny_model(d / "tiny_moe.gguf", n_experts=4, top_k=2, qtype="Q8_0", context=4096, seed=5)
    write_tiny_mtp_head(path, d / "tiny_moe.mtp.gguf")
    return path


def cli(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def _run(path, device, *extra):
    r = cli("run", path, "-p", PROMPT, "-n", 10, "--json", "--device", device, *extra)
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


@pytest.mark.parametrize("strategy,kv", [(None, ()), ("mtp", ()), (None, ("-ctk", "f16", "-ctv", "f16"))])
def test_run_on_the_fake_gpu_equals_the_cpu(tiny, monkeypatch, strategy, kv):
    extra = (*kv, *(() if strategy is None else ("--decode-strategy", strategy)))  # None: the default, adaptive
    want = _run(tiny, "cpu", *extra)
    monkeypatch.setenv("GUILD_FAKE_GPU", "1")
    got = _run(tiny, "cuda", *extra)
    assert got["tokens"] == want["tokens"]
    assert got["device"] == "cuda" and "fake GPU" in got["device_detail"] and "2/2 layers" in got["device_detail"]


def test_optimize_then_run_and_bench_on_the_fake_gpu(tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("GUILD_FAKE_GPU", "1")
    plan = tmp_path / "p.gexec"
    r = cli("optimize", tiny, "-o", plan, "--mode", "quick", "--context", 128, "--device", "cuda")
    assert r.exit_code == 0, r.output
    r = cli("inspect", plan, "--plan")
    assert r.exit_code == 0 and "fake GPU" in r.output and "VRAM:" in r.output, r.output
    got = _run(tiny, "cuda", "--gexec", plan)
    monkeypatch.delenv("GUILD_FAKE_GPU")
    assert got["tokens"] == _run(tiny, "cpu")["tokens"]
    monkeypatch.setenv("GUILD_FAKE_GPU", "1")
    out = tmp_path / "bench"
    r = cli("bench", tiny, "--workloads", "W2,W7", "--strategies", "normal,adaptive", "-n", 6, "--device", "cuda",
            "--out", out)
    assert r.exit_code == 0, r.output
    assert (out / "bench.md").is_file()


def test_bad_fake_gpu_value_is_one_line(tiny, monkeypatch):
    monkeypatch.setenv("GUILD_FAKE_GPU", "lots")
    r = cli("run", tiny, "-p", "x", "-n", 2, "--device", "cuda")
    assert r.exit_code != 0 and "GUILD_FAKE_GPU" in r.output and "Traceback" not in r.output


def test_a_gtx_1070_budget_and_a_tiny_budget_force_a_split(tmp_path):
    """Placement within the VRAM free: everything on an 8 GiB card; a budget of about two layers leaves the
    rest, the output head (with the MTP head) and the embeddings on the CPU, says so, and still runs exactly."""
    path = write_tiny_hybrid(tmp_path / "h.gguf", arch="qwen35moe", n_layers=4, nextn=True, seed=2)
    m = load_model(str(path))
    gtx1070 = 8 * 2**30
    assert default_placement(m, gtx1070, 4096) == GpuSplit(4, True, True)
    s = Parts.of_model(m, 256)
    assert s.mtp > 0 and all(s.layer(i) > 0 for i in range(4))
    free = int((VRAM_RESERVE + s.layer(0) + s.layer(1) + s.layer(2) // 2) / VRAM_SHARE)
    split = default_placement(m, free, 256)
    assert split == GpuSplit(2, False, False)
    report = spill_report(m, split, 256)
    assert "layers 2..3" in report and "output head" in report and "MTP head" in report and "embeddings" in report
    eng = split_onto_device(m, HostBackend.fake_device(), split)
    assert "spilled to the CPU" in describe(eng)
    a, b = m.new_state(64), eng.new_state(64)
    toks = [5, 77, 12, 200, 31, 9]
    assert (m.forward(toks, a) == eng.forward(toks, b)).all()
    with pytest.raises(Exception, match="nothing fits"):
        from guild.engine.gpu import build

        build(m, Device("cuda", "Tiny GPU", 61, 2**20, 2**20), 256)
