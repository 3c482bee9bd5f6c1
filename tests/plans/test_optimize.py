"""`guild optimize`, `guild inspect`, and `--gexec` in `run`/`bench` (tiny random models; a few seconds)."""

import dataclasses
import json
import sys
import time

import pytest
from typer.testing import CliRunner

from guild.calib.optimize import local_plan_path, optimize
from guild.cli import app
from guild.errors import BadFlagError, GuildError, KVTypeMismatch, PlanSealError
from guild.kvtypes import KVTypes
from guild.load import load
from guild.plans.plan import MAX_T, CpuTuning, DraftCalibration, GpuInfo, KernelTuning, Placement, load_plan, read_plan
from guild.plans.plan import write_plan as write
from guild.tools.tiny import write_tiny_model
from tests.helpers.optional import installed

# the quick optimize of the tiny MoE in CPU seconds, every thread's (Numba compiles included on a cold cache):
# measured 36 s on a cold Numba cache, 0.5 s warm; the bound leaves room for a slower CPU, not for a runaway
CPU_BOUND_S = 120

@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("opt") / "tiny_moe.gguf", n_experts=4, top_k=2, qtype="Q4_1",
                            context=512)


@pytest.fixture(scope="module")
def plan(tiny):
    return optimize(load(str(tiny)), tiny.with_name("tiny.gexec"), mode="quick", context=200, progress=False)


def cli(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def test_optimize_tiny_moe_measures_every_pass(tiny, tmp_path):
    # the quick mode's bound in CPU time (all threads): a loaded machine stretches the wall time, not this
    c0 = time.process_time()
    p = optimize(load(str(tiny)), tmp_path / "p.gexec", mode="quick", context=128, progress=False)
    cpu = time.process_time() - c0
    assert cpu < CPU_BOUND_S, cpu
    assert read_plan(tmp_path / "p.gexec") == p and p.path == str(tmp_path / "p.gexec")
    s = p.drafting
    assert s.calibrated and s.context == 128 and 0 < s.filled_tokens <= 128 and s.repeats == 3
    assert len(s.verify_window_ms) == MAX_T and all(v > 0 for v in s.verify_window_ms)
    # the experts are part of the window: their share is positive and smaller than the window
    assert all(0 < e < v for e, v in zip(s.verify_cpu_expert_ms, s.verify_window_ms, strict=True))
    # real routing: one row picks exactly top-k experts, T rows at most min(E, T * k)
    assert s.distinct_experts[0] == 2.0 and s.distinct_expert_ratio[0] == 1.0
    assert all(2.0 <= u <= min(4, 2 * (t + 1)) for t, u in enumerate(s.distinct_experts))
    assert s.distinct_experts[-1] > s.distinct_experts[0]
    assert set(s.draft_ms) == {"lookup", "retrieval"} and all(v > 0 for v in s.draft_ms.values())
    assert s.kv_commit_ms > 0 and s.prefill_tok_s > 0
    assert s.catchup_ms == {} and "no MTP" in s.mtp_note
    assert s.device == "cpu" and s.device_note == ""  # no --device: the loaded model, on the CPU
    c = p.cpu
    kinds = {k.qtype: k for k in c.kernels}
    assert set(kinds) == {"Q4_1", "F32"} and kinds["Q4_1"].role == "experts"
    assert kinds["Q4_1"].matrices == 2 * 4 * 2 + 2 * 2 + 1  # experts (gate+up fused, down) + qkv, wo + output
    assert c.threads in kinds["Q4_1"].threads_tried and c.memory_bandwidth_gbs > 0
    assert all(k.gweights_s > 0 and k.kernel in k.variants for k in c.kernels)
    if p.hardware.gpu is None:
        assert p.placement.gpu is None and p.placement.gpu_bytes == 0 and "no GPU" in p.placement.note
    assert p.model.expert_count == 4 and p.model.expert_used_count == 2 and p.model.file == "tiny_moe.gguf"


def test_optimize_dense_model_has_no_expert_costs(tmp_path):
    m = write_tiny_model(tmp_path / "dense.gguf", qtype="Q8_0")
    s = optimize(load(str(m)), None, mode="quick", context=64, progress=False).drafting
    assert s.verify_cpu_expert_ms is None and s.distinct_experts is None and s.distinct_expert_ratio is None
    assert len(s.verify_window_ms) == MAX_T


def test_optimize_flags_are_checked(tiny):
    for kw, match in ((dict(mode="slow"), "--mode"), (dict(context=4), "--context"), (dict(spec=2), "--spec 2"),
                      (dict(prefill_batch=0), "--prefill-batch"), (dict(repeats=0), "repeats")):
        with pytest.raises(BadFlagError, match=match):
            optimize(load(str(tiny)), None, progress=False, **kw)


def _fields(cls) -> set:
    return {f.name for f in dataclasses.fields(cls)}


def test_inspect_json_has_every_calibrated_field(plan):
    r = cli("inspect", plan.path, "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["seal"] == "ok" and d["this_machine"]["matches"] is True
    assert set(d) >= {"header", "hardware", "model", "placement", "cpu", "drafting"}
    assert set(d["drafting"]) == _fields(DraftCalibration)
    assert set(d["cpu"]) == _fields(CpuTuning) and all(set(k) == _fields(KernelTuning) for k in d["cpu"]["kernels"])
    assert set(d["placement"]) == _fields(Placement) | {"gpu_bytes", "cpu_bytes"}
    for key in ("verify_window_ms", "verify_cpu_expert_ms", "distinct_experts", "distinct_expert_ratio"):
        assert len(d["drafting"][key]) == MAX_T and d["drafting"][key] == list(getattr(plan.drafting, key))
    for key in ("draft_ms", "catchup_ms", "kv_commit_ms", "noise_cv"):
        assert d["drafting"][key] == getattr(plan.drafting, key)
    assert "mtp" not in d["drafting"]["draft_ms"] and d["model"]["sha256"] == plan.model.sha256


def test_inspect_plan_tables_and_chart(plan):
    r = cli("inspect", plan.path)
    assert r.exit_code == 0 and "this machine" in r.stdout and "matches" in r.stdout and "verify curve" not in r.stdout
    r = cli("inspect", plan.path, "--plan")
    out = r.stdout
    assert r.exit_code == 0, r.output
    for s in ("placement", "CPU tuning", "speculative costs", "U(T)/U(1)", "lookup", "retrieval", "MTP step —",
              "verify curve", "T=8", "routed_experts", "Q4_1"):
        assert s in out, s
    assert "█" in out  # the CPU-expert share of each bar


@pytest.mark.gpu
def test_an_auto_fallback_is_said_recorded_and_inspected(tiny, tmp_path, monkeypatch, capsys):
    """A GPU too small for one layer (a 2 MiB fake one): pass 4 measures on the CPU under --device auto, says so
    in one line, and the plan records it; with --device cuda on a GPU that fits, the plan names the GPU."""
    from guild.plans.machine import FAKE_GPU_NAME

    monkeypatch.setenv("GUILD_FAKE_GPU", "2")  # 2 MiB
    p = optimize(load(str(tiny)), tmp_path / "auto.gexec", mode="quick", context=64, device="auto", progress=False)
    notice = [line for line in capsys.readouterr().err.splitlines() if "pass 4" in line]
    assert notice == [f"pass 4 measures on the CPU: {p.drafting.device_note}"]
    assert p.placement.gpu == FAKE_GPU_NAME and p.drafting.device == "cpu"
    assert p.drafting.device_note.startswith("auto: nothing fits on") and read_plan(p.path) == p
    r = cli("inspect", p.path, "--plan")
    out = " ".join(r.stdout.split())  # the terminal's line breaks aside
    assert r.exit_code == 0 and "measured on cpu" in out and p.drafting.device_note in out, r.output
    assert f"on cpu ({p.drafting.device_note})" in " ".join(cli("inspect", p.path).stdout.split())
    monkeypatch.setenv("GUILD_FAKE_GPU", "8192")
    p = optimize(load(str(tiny)), None, mode="quick", context=64, device="cuda", progress=False)
    assert p.drafting.device == f"cuda:0 {FAKE_GPU_NAME} (sm_61)" and p.drafting.device_note == ""
    assert "pass 4" not in capsys.readouterr().err


def test_inspect_another_machines_plan_says_why(plan, tmp_path):
    other = dataclasses.replace(plan, hardware=dataclasses.replace(plan.hardware, numa_nodes=4))
    p = write(other, tmp_path / "numa.gexec")
    d = json.loads(cli("inspect", p, "--json").stdout)
    assert d["this_machine"]["matches"] is False and d["this_machine"]["mismatch"]["type"] == "NumaTopologyMismatch"


def test_inspect_gguf(tiny):
    r = cli("inspect", tiny)
    assert r.exit_code == 0, r.output
    assert "llama" in r.stdout and "4 (top-2)" in r.stdout and "Q4_1" in r.stdout
    d = json.loads(cli("inspect", tiny, "--json").stdout)
    assert d["expert_count"] == 4 and d["expert_used_count"] == 2 and d["layers"] == 2
    # per layer q, k, v, o + 3 expert stacks (Q4_1), 2 norms + router (F32); embeddings, output, output norm
    assert d["quant_types"] == {"Q4_1": 16, "F32": 7} and d["tensor_count"] == 23 and "layer_pattern" not in d


def test_inspect_hybrid_layer_pattern_from_metadata(tmp_path):
    import numpy as np
    from gguf import GGUFWriter

    path = tmp_path / "hybrid.gguf"
    w = GGUFWriter(path, "qwen35moe")
    w.add_block_count(9)
    w.add_uint32("qwen35moe.full_attention_interval", 4)
    w.add_uint32("qwen35moe.nextn_predict_layers", 1)
    w.add_expert_count(8)
    w.add_expert_used_count(2)
    w.add_tensor("token_embd.weight", np.zeros((4, 32), np.float32))  # no weights are loaded by inspect
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    d = json.loads(cli("inspect", path, "--json").stdout)
    assert d["layer_pattern"] == "RRRARRRAM" and d["layer_pattern_short"] == "RRRA × 2 + M"
    assert "must be in" in d["repack"]["error"]  # no weights: the repack account says a load would refuse it
    r = cli("inspect", path)
    assert "RRRA × 2 + M" in r.stdout and "R recurrent" in r.stdout and "a load would refuse" in r.stdout


def test_inspect_plot(plan, tmp_path):
    installed("matplotlib")  # in the test extra: skips only where it is not installed, fails where it is broken
    png = tmp_path / "v.png"
    r = cli("inspect", plan.path, "--plot", png)
    assert r.exit_code == 0, r.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_inspect_plot_without_matplotlib(plan, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    r = cli("inspect", plan.path, "--plot", tmp_path / "w.png")
    assert r.exit_code == 1 and "pip install 'guild[plot]'" in r.stderr  # the extra's name survives rich markup
    assert r.stdout == ""  # fails before printing the plan


def test_inspect_errors_are_one_line(tiny, tmp_path):
    r = cli("inspect", tmp_path / "none.gexec")
    assert r.exit_code == 1 and "no such file" in r.stderr
    r = cli("inspect", tiny, "--plot", tmp_path / "x.png")
    assert r.exit_code == 1 and "needs a .gexec plan" in r.stderr


def test_cli_optimize_prints_a_line_per_pass(tiny, tmp_path):
    out = tmp_path / "cli.gexec"
    r = cli("optimize", tiny, "--mode", "quick", "--context", "64", "-o", out)
    assert r.exit_code == 0, r.output
    assert r.stdout.strip() == str(out) and load_plan(out, model=tiny).header.context == 64
    for i in range(1, 5):
        assert f"pass {i}/4" in r.stderr
    r = cli("optimize", tiny, "--mode", "fast", "-o", out)
    assert r.exit_code == 1 and "--mode" in r.stderr


# -- --gexec in run and bench -------------------------------------------------------------------------------
def test_runner_uses_the_plan_costs_and_threads(plan, tiny, monkeypatch):
    import guild.load as load_mod
    from guild.cli.run import Runner
    from guild.engine.options import DecodeOptions

    seen = []
    real = load_mod.make_drafter

    def spy(*a, **kw):
        seen.append(kw.get("costs"))
        return real(*a, **kw)

    monkeypatch.setattr(load_mod, "make_drafter", spy)
    r = Runner(str(tiny), DecodeOptions(strategy="adaptive", max_tokens=4, gexec=plan.path))
    assert r.plan == plan and r.threads == plan.cpu.threads
    assert seen[-1] == plan.draft_costs()
    assert r.complete("hello").tokens
    with pytest.raises(BadFlagError, match="--strict-plan needs --gexec"):
        DecodeOptions(strict_plan=True)


OTHER_MACHINES = [
    ("isa", dict(isa=("avx", "avx2", "fma")), "CpuIsaMismatch"),
    ("gpu", dict(gpu=GpuInfo("NVIDIA GeForce RTX 5070", "12.0", 12 * 2**30)), "GpuArchitectureMismatch"),
]


@pytest.mark.parametrize("name,change,error", OTHER_MACHINES, ids=[m[0] for m in OTHER_MACHINES])
def test_plan_from_another_machine_strict_fails_else_regenerates(plan, tiny, tmp_path, name, change, error):
    if all(getattr(plan.hardware, k) == v for k, v in change.items()):
        pytest.skip("this machine is that machine")
    p = write(dataclasses.replace(plan, hardware=dataclasses.replace(plan.hardware, **change)), tmp_path / "o.gexec")
    local = local_plan_path(p)
    r = cli("run", tiny, "-p", "hello", "-n", "4", "--gexec", p, "--strict-plan")
    assert r.exit_code == 1 and error in r.stderr and "Traceback" not in r.stderr and not local.exists()
    r = cli("run", tiny, "-p", "hello", "-n", "4", "--gexec", p)
    assert r.exit_code == 0, r.output
    assert error in r.stderr and "regenerating" in r.stderr and "pass 4/4" in r.stderr
    regenerated = load_plan(local, model=tiny)  # valid here
    assert regenerated.header.context == plan.header.context and regenerated.header.mode == plan.header.mode
    r = cli("run", tiny, "-p", "hello", "-n", "4", "--gexec", p)  # the next run reuses it
    assert r.exit_code == 0 and "using the local plan" in r.stderr and "regenerating" not in r.stderr


def test_cpu_plan_on_a_gpu_machine_is_regenerated_with_a_placement(plan, tiny, tmp_path, monkeypatch):
    from guild.cli.run import Runner
    from guild.engine.options import DecodeOptions
    from guild.plans import machine as probe

    if plan.hardware.gpu is not None:
        pytest.skip("this machine has a GPU")
    p = write(plan, tmp_path / "cpu.gexec")
    monkeypatch.setattr(probe, "gpu_info", lambda: GpuInfo("fake H200", "9.0", 141 * 2**30))
    r = Runner(str(tiny), DecodeOptions(strategy="normal", max_tokens=2, gexec=str(p)))
    assert r.plan.path == str(local_plan_path(p)) and r.plan.hardware.gpu.name == "fake H200"
    dev = {g.name: g.device for g in r.plan.placement.groups}
    assert dev["routed_experts"] == "cpu" and dev["attention"] == "gpu" and dev["kv_cache"] == "gpu"


def test_tampered_plan_is_always_an_error(plan, tiny, tmp_path):
    data = bytearray(open(plan.path, "rb").read())
    i = data.index(b"verify_window_ms")
    data[i + 25] ^= 1  # a digit of V(1)
    p = tmp_path / "t.gexec"
    p.write_bytes(bytes(data))
    with pytest.raises(PlanSealError):
        load_plan(p)
    r = cli("run", tiny, "-p", "hello", "-n", "4", "--gexec", p)  # no --strict-plan: still refused
    assert r.exit_code == 1 and "seal" in r.stderr and not local_plan_path(p).exists()


def test_bench_takes_the_plan(plan, tiny):
    from guild.bench.command import bench

    rep = bench(str(tiny), ["W9"], ["adaptive"], max_tokens=4, context=512, out=None, progress=False,
                gexec=plan.path)
    assert rep["records"][0].meta["settings"]["plan"] == plan.path
    assert {r.runner for r in rep["records"]} >= {"normal", "adaptive"}
    with pytest.raises(GuildError, match="--strict-plan needs --gexec"):
        bench(str(tiny), ["W9"], ["adaptive"], out=None, progress=False, strict_plan=True)


def test_optimize_measures_the_mtp_head(tmp_path):
    from guild.errors import BadFlagError
    from guild.tools.tiny import write_tiny_mtp_head

    base = write_tiny_model(tmp_path / "m.gguf", n_experts=4, top_k=2, context=512)
    with pytest.raises(BadFlagError, match="needs an MTP head"):
        optimize(load(str(base)), tmp_path / "x.gexec", mode="quick", context=128, spec=1, progress=False)
    write_tiny_mtp_head(base, tmp_path / "m.mtp.gguf")  # the sidecar beside the model
    p = optimize(load(str(base)), tmp_path / "p.gexec", mode="quick", context=128, spec=1, progress=False)
    s = p.drafting
    assert 0 < s.catchup_ms["mtp"] and 0 < s.draft_ms["mtp"] and "sidecar m.mtp.gguf" in s.mtp_note
    assert p.header.spec == 1
    c = p.draft_costs()
    assert c.draft_ms == s.draft_ms and c.catchup_ms == s.catchup_ms == {"mtp": s.catchup_ms["mtp"]}


def test_a_plan_says_which_kv_types_it_measured_and_serves_only_them(tiny, tmp_path):
    kv = KVTypes("f16", "f16")
    p = optimize(load(str(tiny), kv=kv), tmp_path / "f16.gexec", mode="quick", context=64, progress=False)
    assert p.header.kv == kv and load_plan(p.path, model=tiny, kv=kv).header.cache_type_v == "f16"
    with pytest.raises(KVTypeMismatch, match="measured with the KV cache K f16 · V f16; this run stores K f32 · V f32"):
        load_plan(p.path, kv=KVTypes())
    r = CliRunner().invoke(app, ["inspect", p.path], env={"COLUMNS": "200"})
    assert r.exit_code == 0 and "--cache-type-k f16 --cache-type-v f16" in r.stdout and "(KV K f16 · V f16)" in r.stdout
    assert json.loads(cli("inspect", p.path, "--json").stdout)["header"]["cache_type_k"] == "f16"
    r = cli("run", tiny, "-p", "hello", "-n", "4", "--gexec", p.path, "--strict-plan")  # f32: not what it measured
    assert r.exit_code == 1 and "KVTypeMismatch" in r.stderr and "Traceback" not in r.stderr
    r = cli("run", tiny, "-p", "hello", "-n", "4", "--gexec", p.path, "--strict-plan", "-ctk", "f16", "-ctv", "f16")
    assert r.exit_code == 0, r.output
