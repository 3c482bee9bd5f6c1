"""The .gexec plan contract: round trip, seal and section digests, typed identity mismatches, placement, probe."""

import dataclasses
import hashlib
import sys

import pytest
import yaml

from guild.calib.probe import _cpuinfo, gpu_info, hardware_identity
from guild.engine.placement import Parts, plan_placement, vram_budget
from guild.errors import (
    CpuIsaMismatch,
    GpuArchitectureMismatch,
    ModelMismatch,
    NumaTopologyMismatch,
    PlanError,
    PlanSealError,
)
from guild.load import load
from guild.plans.plan import (
    FORMAT_VERSION,
    SECTIONS,
    GpuInfo,
    Plan,
    load_plan,
    read_plan,
    render,
    section_digest,
    write_plan,
)
from guild.tools.tiny import write_tiny_model

GPU_5070 = GpuInfo("NVIDIA GeForce RTX 5070", "12.0", 12 * 2**30)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("plan") / "tiny_moe.gguf", n_experts=4, top_k=2, qtype="Q4_1")


@pytest.fixture(scope="module")
def plan(tiny) -> Plan:
    from guild.calib.optimize import optimize

    return optimize(load(str(tiny)), tiny.with_name("tiny.gexec"), mode="quick", context=96, progress=False)


def _reseal(body: bytes) -> bytes:
    return body + f"seal: {hashlib.sha256(body).hexdigest()}\n".encode()


def test_round_trip(plan, tmp_path):
    p = write_plan(plan, tmp_path / "a.gexec")
    back = read_plan(p)
    assert back == plan and back.path == str(p)
    assert render(back) == p.read_bytes()  # reading loses nothing the file holds
    assert load_plan(p, model=plan.model) == plan  # this machine, this model
    assert not list(tmp_path.glob(".*.tmp"))  # the atomic write left no temp file


def test_every_changed_byte_breaks_the_seal(plan, tmp_path):
    data = render(plan)
    p = tmp_path / "t.gexec"
    for i in range(len(data)):
        bad = bytearray(data)
        bad[i] ^= 0x01  # a different byte, still ASCII
        p.write_bytes(bytes(bad))
        with pytest.raises(PlanSealError):
            read_plan(p)
    for cut in (1, 10, len(data) // 2):  # truncated
        p.write_bytes(data[:-cut])
        with pytest.raises(PlanSealError):
            read_plan(p)
    p.write_bytes(data.replace(b"\nseal:", b"\n# a comment\nseal:"))
    with pytest.raises(PlanSealError):
        read_plan(p)


def test_resealed_edit_of_any_section_field_fails_its_digest(plan, tmp_path):
    """An edit that recomputes the file seal but not the section's own digest is still caught, field by field."""
    data = render(plan)
    d = yaml.safe_load(data)
    p = tmp_path / "e.gexec"
    n = 0
    for sec in SECTIONS:
        for key, val in d[sec].items():
            if key == "sha256":
                continue
            e = yaml.safe_load(data)
            e[sec][key] = [val, 1] if isinstance(val, list) else f"{val}x" if isinstance(val, str) else 7
            if e[sec][key] == val:
                e[sec][key] = 8
            e.pop("seal")
            body = yaml.safe_dump(e, sort_keys=False).encode()
            p.write_bytes(_reseal(body))
            with pytest.raises(PlanSealError, match=f"section '{sec}'"):
                read_plan(p)
            n += 1
    assert n >= 15
    # the digests themselves are what the sections hold
    for sec in SECTIONS:
        assert d[sec]["sha256"] == section_digest(d[sec])


def test_other_format_version_is_a_plan_error(plan, tmp_path):
    d = yaml.safe_load(render(plan))
    d.pop("seal")
    d["header"]["version"] = 99
    p = tmp_path / "v.gexec"
    p.write_bytes(_reseal(yaml.safe_dump(d, sort_keys=False).encode()))
    with pytest.raises(PlanError, match="format version 99"):
        read_plan(p)
    p.write_bytes(_reseal(b"hello: world\n"))
    with pytest.raises(PlanError, match="not a guild plan"):
        read_plan(p)
    with pytest.raises(PlanError, match="cannot read"):
        read_plan(tmp_path / "missing.gexec")


def test_a_version_1_plan_says_to_re_run_optimize(plan, tmp_path):
    """Version 1 kept the drafting costs in a `spec` section with one field per drafter: one line, no field noise."""
    d = yaml.safe_load(render(plan))
    d.pop("seal")
    d["header"]["version"] = 1
    old = d.pop("drafting")
    draft = old.pop("draft_ms")
    old.pop("catchup_ms")
    d["spec"] = {**old, "lookup_draft_ms": draft["lookup"], "retrieval_draft_ms": draft["retrieval"],
                 "mtp_draft_step_ms": None, "mtp_kv_catchup_ms": None}
    p = tmp_path / "v1.gexec"
    p.write_bytes(_reseal(yaml.safe_dump(d, sort_keys=False).encode()))
    with pytest.raises(PlanError) as e:
        read_plan(p)
    assert str(e.value) == f"{p}: plan format version 1 is not {FORMAT_VERSION} (re-run guild optimize)"


def test_a_version_2_plan_says_to_re_run_optimize(plan, tmp_path):
    """Version 2 did not record the device that measured the drafting costs: one line, no field noise."""
    d = yaml.safe_load(render(plan))
    d.pop("seal")
    d["header"]["version"] = 2
    for key in ("device", "device_note"):
        d["drafting"].pop(key)
    p = tmp_path / "v2.gexec"
    p.write_bytes(_reseal(yaml.safe_dump(d, sort_keys=False).encode()))
    with pytest.raises(PlanError) as e:
        read_plan(p)
    assert str(e.value) == f"{p}: plan format version 2 is not {FORMAT_VERSION} (re-run guild optimize)"


def test_a_resealed_kv_type_outside_the_table_is_one_line(plan, tmp_path):
    d = yaml.safe_load(render(plan))
    d.pop("seal")
    assert d["header"]["cache_type_k"] == d["header"]["cache_type_v"] == "f32"
    d["header"]["cache_type_k"] = "q4_0"
    p = tmp_path / "kv.gexec"
    p.write_bytes(_reseal(yaml.safe_dump(d, sort_keys=False).encode()))
    with pytest.raises(PlanError) as e:
        read_plan(p)
    assert str(e.value) == f"{p}: plan header.cache_type_k: expected one of f32, f16, q8_0, got 'q4_0'"


HW_CHANGES = [
    ("cpu_model", "AMD Ryzen 5 5600X 6-Core Processor", CpuIsaMismatch),
    ("isa", ("avx", "avx2", "f16c", "fma"), CpuIsaMismatch),
    ("numa_nodes", 2, NumaTopologyMismatch),
    ("physical_cores", 1, NumaTopologyMismatch),
    ("logical_cpus", 64, NumaTopologyMismatch),
    ("gpu", GPU_5070, GpuArchitectureMismatch),
]


@pytest.mark.parametrize("field,value,error", HW_CHANGES, ids=[c[0] for c in HW_CHANGES])
def test_plan_from_another_machine_gets_its_typed_error(plan, tiny, tmp_path, field, value, error):
    if getattr(plan.hardware, field) == value:
        pytest.skip(f"this machine already has {field}={value}")
    other = dataclasses.replace(plan, hardware=dataclasses.replace(plan.hardware, **{field: value}))
    p = write_plan(other, tmp_path / "other.gexec")  # a correctly sealed plan, made elsewhere
    assert read_plan(p) == other
    with pytest.raises(error):
        load_plan(p, model=tiny)


def test_gpu_plans_and_gpu_machines(plan, tmp_path):
    here = hardware_identity()
    with_gpu = dataclasses.replace(here, gpu=GPU_5070)
    p = write_plan(plan, tmp_path / "cpu.gexec")
    if here.gpu is None:  # a CPU-only plan on a machine with a GPU
        with pytest.raises(GpuArchitectureMismatch, match="no GPU"):
            load_plan(p, hardware=with_gpu)
    g = write_plan(dataclasses.replace(plan, hardware=with_gpu), tmp_path / "gpu.gexec")
    load_plan(g, hardware=with_gpu)
    for other in (GpuInfo("NVIDIA GeForce GTX 1070", "6.1", 8 * 2**30), dataclasses.replace(GPU_5070, vram_bytes=8)):
        with pytest.raises(GpuArchitectureMismatch):
            load_plan(g, hardware=dataclasses.replace(here, gpu=other))


MODEL_CHANGES = [("sha256", "0" * 64), ("architecture", "qwen3moe"), ("layers", 3), ("expert_count", 8),
                 ("expert_used_count", 1)]


@pytest.mark.parametrize("field,value", MODEL_CHANGES, ids=[c[0] for c in MODEL_CHANGES])
def test_plan_for_another_model_is_model_mismatch(plan, tiny, tmp_path, field, value):
    other = dataclasses.replace(plan, model=dataclasses.replace(plan.model, **{field: value}))
    p = write_plan(other, tmp_path / "m.gexec")
    with pytest.raises(ModelMismatch):
        load_plan(p, model=tiny)
    load_plan(p)  # no model given: only the machine is checked


def test_another_file_of_the_same_model_is_fine_but_other_weights_are_not(plan, tiny, tmp_path):
    renamed = dataclasses.replace(plan, model=dataclasses.replace(plan.model, file="elsewhere.gguf"))
    load_plan(write_plan(renamed, tmp_path / "r.gexec"), model=tiny)
    other = write_tiny_model(tmp_path / "other.gguf", n_experts=4, top_k=2, qtype="Q4_1", seed=1)
    with pytest.raises(ModelMismatch, match="sha256"):
        load_plan(write_plan(plan, tmp_path / "o.gexec"), model=other)


def test_draft_costs_are_the_plan_fields(plan):
    from guild.speculative.build import make_drafter
    from guild.speculative.costs import DraftCosts

    c = plan.draft_costs()
    s = plan.drafting
    assert isinstance(c, DraftCosts)
    assert c.verify_ms == s.verify_window_ms and len(c.verify_ms) == 8 and c.context == s.context
    assert c.draft_ms == s.draft_ms and set(c.draft_ms) == {"lookup", "retrieval"}
    assert c.commit_ms == s.kv_commit_ms and c.catchup_ms == {}
    make_drafter("adaptive", costs=c)


# -- placement (pass 2) -------------------------------------------------------------------------------------
def _big_moe(n_layers=48):
    """A synthetic 30B-class MoE tensor table: 40 MiB attention and 1 GiB of routed experts per layer."""
    t = [("token_embd.weight", 300 * 2**20), ("output.weight", 300 * 2**20), ("output_norm.weight", 8192)]
    for i in range(n_layers):
        p = f"blk.{i}."
        t += [(p + "attn_q.weight", 20 * 2**20), (p + "attn_k.weight", 5 * 2**20), (p + "attn_v.weight", 5 * 2**20),
              (p + "attn_output.weight", 10 * 2**20), (p + "attn_norm.weight", 8192), (p + "ffn_norm.weight", 8192),
              (p + "ffn_gate_inp.weight", 2**20), (p + "ffn_gate_exps.weight", 2**29),
              (p + "ffn_up_exps.weight", 2**28), (p + "ffn_down_exps.weight", 2**28),
              (p + "ffn_gate_shexp.weight", 4 * 2**20)]
    return t, {i: 16 * 2**20 for i in range(n_layers)}


def _placement(tensors, kv, gpu, context, n_layers=48):
    return plan_placement(Parts.from_table(tensors, kv, n_layers), gpu, context)


def test_placement_cpu_only_says_so():
    t, kv = _big_moe()
    p = _placement(t, kv, None, 8192)
    assert p.gpu is None and p.gpu_bytes == 0 and "no GPU" in p.note
    assert all(g.device == "cpu" for g in p.groups)
    assert sum(g.bytes for g in p.groups) == sum(b for _, b in t) + sum(kv.values())


def test_placement_8gib_takes_everything_but_the_routed_experts():
    t, kv = _big_moe()
    gpu = GpuInfo("fake", "8.9", 8 * 2**30)
    p = _placement(t, kv, gpu, 8192)
    dev = {g.name: g for g in p.groups}
    assert dev["routed_experts"].device == "cpu" and dev["routed_experts"].gpu_bytes == 0
    for name in ("attention", "kv_cache", "norms", "router", "shared_experts", "output", "embeddings"):
        assert dev[name].device == "gpu", name
    assert p.gpu_bytes <= vram_budget(gpu.vram_bytes) == p.vram_budget_bytes


def test_placement_1gib_fills_whole_layers_in_order():
    t, kv = _big_moe()
    gpu = GpuInfo("fake", "6.1", 2**30)
    p = _placement(t, kv, gpu, 8192)
    dev = {g.name: g for g in p.groups}
    assert p.gpu_bytes <= vram_budget(gpu.vram_bytes)
    assert dev["attention"].device == "split" and dev["kv_cache"].device == "split"
    # a layer goes whole, with its KV cache and its shared expert: the same share of each is on the GPU
    for name in ("kv_cache", "norms", "router", "shared_experts"):
        assert dev[name].gpu_bytes / dev[name].bytes == pytest.approx(
            dev["attention"].gpu_bytes / dev["attention"].bytes), name
    assert dev["output"].device == "cpu" and dev["routed_experts"].gpu_bytes == 0
    # layers fill the budget in order: what is left is smaller than the next layer (about 61 MiB)
    assert vram_budget(gpu.vram_bytes) - p.gpu_bytes < 40 * 2**20 + 16 * 2**20 + 5 * 2**20 + 3 * 8192


def test_placement_of_the_tiny_model(tiny):
    from guild.engine.placement import placement_for
    from guild.models import load_model

    p = placement_for(load_model(str(tiny)), GpuInfo("fake", "9.0", 2**30), 64)
    dev = {x.name: x for x in p.groups}
    assert dev["routed_experts"].device == "cpu" and dev["attention"].device == "gpu"
    assert dev["kv_cache"].bytes == 2 * 2 * 2 * 16 * 64 * 4  # layers x (K+V) x kv heads x head_dim x ctx x f32


# -- probe (pass 1) -----------------------------------------------------------------------------------------
CPUINFO = "".join(
    f"processor\t: {i}\nmodel name\t: Intel(R) Xeon(R) Gold 6130 CPU @ 2.10GHz\nphysical id\t: {i % 2}\n"
    f"core id\t\t: {(i // 2) % 16}\nflags\t\t: fpu sse avx avx2 fma f16c avx512f avx512bw avx512vl\n\n"
    for i in range(64)
)


def test_cpuinfo_parsing():
    model, isa, cores, logical = _cpuinfo(CPUINFO)
    assert model.startswith("Intel(R) Xeon(R) Gold 6130") and (cores, logical) == (32, 64)
    assert isa == ("avx", "avx2", "avx512bw", "avx512f", "avx512vl", "f16c", "fma")


def test_no_cupy_means_no_gpu(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)  # import fails
    assert gpu_info() is None
    assert hardware_identity().gpu is None
