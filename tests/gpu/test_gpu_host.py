"""The GPU path's host side on the CPU: `--device` resolution, placement, and the engine's orchestration run
against a NumPy "fake device" (HostBackend.fake_device: the CPU kernels, transfers copied and counted). The
same forward that drives the CUDA kernels must give bitwise the CPU model's logits, move rows exactly once per
direction per MoE layer, and keep the Window contract with a pointer-only KV cache."""

import contextlib
import inspect
import sys
import types
import typing

import numpy as np
import pytest

from guild.engine.backends import HostBackend
from guild.engine.device import Device, DeviceUnavailableError, probe_cuda, resolve_device
from guild.engine.gpu import build, split_onto_device
from guild.engine.placement import (
    VRAM_RESERVE,
    VRAM_SHARE,
    GpuSplit,
    Parts,
    default_placement,
    placement_for,
    placement_from_plan,
    vram_budget,
)
from guild.engine.session import GuildSession
from guild.engine.state import DeviceKVCache
from guild.errors import BadFlagError, ContextOverflowError, GpuPathError
from guild.models import load_model
from guild.plans.plan import GpuInfo
from guild.speculative.build import make_drafter
from guild.tools.tiny import write_tiny_model

pytestmark = pytest.mark.gpu  # the GPU path, on the fake device (HostBackend.fake_device)

TINY = [
    dict(arch="llama", qtype="Q4_1"),
    dict(arch="llama", qtype="Q8_0", n_experts=4, top_k=2),
    dict(arch="qwen3", qtype="F16", tied=True),
    dict(arch="qwen3moe", qtype="Q4_0", n_experts=4, top_k=2),
]
PLACEMENTS = [GpuSplit(2, True, True), GpuSplit(1, False, True), GpuSplit(1, True, False),
              GpuSplit(0, False, False)]
SEQ = np.array([5, 77, 12, 200, 31, 9, 150, 64, 3, 99, 18, 250, 42, 7, 120, 33], np.int64)


@pytest.fixture(autouse=True)
def _no_fake_gpu(monkeypatch):
    """These tests decide the device themselves: a GUILD_FAKE_GPU in the environment must not leak in."""
    monkeypatch.delenv("GUILD_FAKE_GPU", raising=False)


@pytest.fixture(scope="module", params=TINY, ids=lambda c: "-".join(str(v) for v in c.values()))
def tiny(request, tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny") / "m.gguf"
    write_tiny_model(path, seed=3, **request.param)
    return load_model(str(path))


def _plain(model, seq, n_ctx=64):
    st = model.new_state(n_ctx)
    rows = []
    for t in seq:
        rows.append(model.forward([t], st)[0])
        st.commit(1)
    return np.stack(rows)


@pytest.mark.parametrize("pl", PLACEMENTS, ids=lambda p: f"gpu{p.gpu_layers}-e{int(p.embed_gpu)}-o{int(p.output_gpu)}")
def test_fake_device_is_bitwise_the_cpu_model(tiny, pl):
    eng = split_onto_device(tiny, HostBackend.fake_device(), pl)
    a, b = tiny.new_state(64), eng.new_state(64)
    assert isinstance(b, DeviceKVCache)
    assert np.array_equal(tiny.forward(SEQ[:9], a), eng.forward(SEQ[:9], b))
    a.commit(9)
    b.commit(9)
    for T in (1, 3, 8):
        x, y = tiny.forward_batch([(SEQ[9 : 9 + T], a)])[0], eng.forward_batch([(SEQ[9 : 9 + T], b)])[0]
        assert np.array_equal(x.logits, y.logits), f"T={T}"
        a.commit(1)
        b.commit(1)
        assert x.distinct_experts.tolist() == y.distinct_experts.tolist()
    last = eng.forward(SEQ[10:14], b, last_only=True)
    assert np.array_equal(last, tiny.forward(SEQ[10:14], a, last_only=True))


def _watched_device() -> tuple[HostBackend, list[str]]:
    """A fake device whose ops note their name when called outside its activate()."""
    from guild.engine.backends.protocol import backend_ops

    dev, depth, outside = HostBackend.fake_device(), [0], []

    @contextlib.contextmanager
    def activate():
        depth[0] += 1
        try:
            yield
        finally:
            depth[0] -= 1

    def watched(op, f):
        def run(*a, **k):
            if depth[0] == 0:
                outside.append(op)
            return f(*a, **k)
        return run

    for op in backend_ops():
        if op not in ("activate", "counters"):
            setattr(dev, op, watched(op, getattr(dev, op)))
    dev.activate = activate
    return dev, outside


def test_every_device_op_runs_on_its_stream(tiny, tmp_path):
    """A device's kernels and its transfers share one stream only inside `activate()`: an op launched outside
    runs on another stream, unordered with the copies (a real GPU read the router's ids before they were
    written). Every op a forward calls on a device backend, dense, MoE and hybrid, is called inside it."""
    from guild.tools.tiny_hybrid import write_tiny_hybrid

    hybrid = load_model(str(write_tiny_hybrid(tmp_path / "h.gguf", seed=2)))
    for model in (tiny, hybrid):
        dev, outside = _watched_device()
        eng = split_onto_device(model, dev, GpuSplit(model.args.n_layers, True, True))
        st = eng.new_state(64)
        eng.forward(SEQ[:9], st)
        st.commit(9)
        eng.forward_batch([(SEQ[9:12], st)])
        assert outside == [], f"{type(model).__name__}: {sorted(set(outside))} outside activate()"


def test_commit_keep_equals_plain_decoding(tiny):
    """Pointer-only commit(keep): rows >= keep are left in the cache but never read again."""
    eng = split_onto_device(tiny, HostBackend.fake_device(), GpuSplit(2))
    plain = _plain(tiny, SEQ)
    P = 4
    for T in (2, 5, 8):
        for keep in (1, T // 2, T):
            st = eng.new_state(64)
            eng.forward(SEQ[:P], st)
            st.commit(P)
            win = eng.forward(SEQ[P : P + T] if keep == T else np.r_[SEQ[P : P + keep], [1] * (T - keep)], st)
            assert np.array_equal(win[:keep], plain[P : P + keep])
            st.commit(keep)
            assert st.pos == P + keep
            nxt = eng.forward(SEQ[P + keep : P + keep + 2], st)
            assert np.array_equal(nxt, plain[P + keep : P + keep + 2]), f"T={T} keep={keep}"
            st.commit(0)


def test_batched_sessions_equal_solo(tiny):
    eng = split_onto_device(tiny, HostBackend.fake_device(), GpuSplit(2))
    s1, s2 = eng.new_state(64), eng.new_state(64)
    eng.forward(SEQ[:5], s1)
    s1.commit(5)
    eng.forward(SEQ[6:13], s2)
    s2.commit(7)
    w1, w2 = SEQ[5:8], SEQ[13:14]
    both = [r.logits for r in eng.forward_batch([(w1, s1), (w2, s2)])]
    s1.commit(0)
    s2.commit(0)
    assert np.array_equal(both[0], eng.forward(w1, s1))
    s1.commit(0)
    assert np.array_equal(both[1], eng.forward(w2, s2))


def test_one_transfer_each_way_per_moe_layer(tmp_path):
    path = tmp_path / "moe.gguf"
    write_tiny_model(path, arch="llama", n_layers=3, n_experts=4, top_k=2, qtype="Q8_0", seed=1)
    m = load_model(str(path))
    dev = HostBackend.fake_device()
    eng = split_onto_device(m, dev, GpuSplit(3))
    st = eng.new_state(64)
    eng.forward(SEQ[:6], st)
    st.commit(6)
    h2d, d2h = dev.h2d, dev.d2h
    d2h_bytes = dev.d2h_bytes
    T = 4
    eng.forward(SEQ[6 : 6 + T], st)
    # per MoE layer: D2H of (ids, weights, h) and H2D of the expert output; plus the window's indices and logits
    assert dev.h2d - h2d == 3 + 1
    assert dev.d2h - d2h == 3 + 1
    a = m.args
    assert dev.d2h_bytes - d2h_bytes >= 3 * T * a.dim * 4 + T * a.vocab_size * 4


def test_dense_model_moves_only_indices_and_logits(tmp_path):
    path = tmp_path / "dense.gguf"
    write_tiny_model(path, arch="llama", qtype="F32", seed=2)
    dev = HostBackend.fake_device()
    eng = split_onto_device(load_model(str(path)), dev, GpuSplit(2))
    st = eng.new_state(32)
    eng.forward(SEQ[:5], st)
    assert (dev.h2d, dev.d2h) == (1, 1)


def test_session_parity_with_speculation(tmp_path):
    """Greedy generation through the engine (fake device) with lookup drafts = the CPU model's plain stream."""
    path = tmp_path / "moe.gguf"
    write_tiny_model(path, arch="qwen3moe", n_experts=4, top_k=2, qtype="Q4_0", seed=4)
    m = load_model(str(path))
    eng = split_onto_device(m, HostBackend.fake_device(), GpuSplit(1, False, True))
    prompt = [int(t) for t in np.r_[SEQ, SEQ, SEQ]]
    ref, _ = GuildSession(m, n_ctx=128).generate(prompt, 24)
    got, st = GuildSession(eng, n_ctx=128).generate(prompt, 24, drafter=make_drafter("lookup", min_match=2),
                                                     max_draft=4)
    assert got == ref
    s = GuildSession(eng, n_ctx=128)
    s.generate(prompt, 4)
    s.rewind(len(prompt) - 3)  # truncate: pointer only
    again, _ = s.generate(prompt[-3:], 24)
    assert again == ref


def test_adaptive_default_runs_on_the_engine(tmp_path):
    """The default strategy on the GPU engine (fake device): no hidden rows are moved off the device (no MTP
    head here), and the stream equals the CPU model's plain one."""
    path = tmp_path / "moe.gguf"
    write_tiny_model(path, n_experts=4, top_k=2, qtype="Q8_0", seed=4)
    m = load_model(str(path))
    eng = split_onto_device(m, HostBackend.fake_device(), GpuSplit(2))
    prompt = [int(t) for t in np.r_[SEQ, SEQ, SEQ]]
    ref, _ = GuildSession(m, n_ctx=128).generate(prompt, 24)
    got, st = GuildSession(eng, n_ctx=128).generate(prompt, 24, drafter=make_drafter("adaptive"), max_draft=4)
    assert got == ref and st.windows


def test_kv_state_errors(tiny):
    eng = split_onto_device(tiny, HostBackend.fake_device(), GpuSplit(2))
    st = eng.new_state(8)
    assert st.n_ctx == 8 and st.nbytes > 0
    eng.forward(SEQ[:3], st)
    with pytest.raises(RuntimeError):
        st.begin(1)
    with pytest.raises(ValueError):
        st.commit(4)
    st.commit(3)
    with pytest.raises(ContextOverflowError):
        eng.forward(SEQ[:6], st)
    st.truncate(1)
    assert st.pos == 1


# -- placement --------------------------------------------------------------------------------------------
def _free_for(budget: int) -> int:
    """VRAM free that leaves exactly `budget` bytes to the placement."""
    free = int((budget + VRAM_RESERVE) / VRAM_SHARE)
    while vram_budget(free) < budget:
        free += 1
    return free


def test_default_placement_fills_layers_then_output_then_embeddings(tiny):
    s = Parts.of_model(tiny, 64)
    layers = s.layer(0) + s.layer(1)
    assert default_placement(tiny, _free_for(layers + s.output + s.embed), 64) == GpuSplit(2, True, True)
    assert default_placement(tiny, _free_for(layers + s.output), 64).output_gpu
    assert default_placement(tiny, _free_for(s.layer(0)), 64) == GpuSplit(1, False, False)
    assert default_placement(tiny, _free_for(0), 64) == GpuSplit(0, False, False)
    assert s.bytes("kv_cache", 0) == 2 * tiny.args.n_kv_heads * tiny.args.head_dim * 64 * 4


def test_placement_from_section():
    assert GpuSplit.from_section({"gpu_layers": 3, "embed": "cpu"}, 4) == GpuSplit(3, False, True)
    assert GpuSplit.from_section({}, 4) == GpuSplit(4, True, True)
    assert GpuSplit(2, False, True).as_section() == {"gpu_layers": 2, "embed": "cpu", "output": "gpu"}
    with pytest.raises(Exception, match="placement"):
        GpuSplit.from_section({"gpu_layers": 9}, 4)


def test_placement_from_plan(tiny):
    everything = placement_for(tiny, GpuInfo("Big GPU", "8.9", 2**34), 64)
    assert placement_from_plan(everything, tiny, 64) == GpuSplit(2, True, True)
    assert placement_from_plan(placement_for(tiny, None, 64), tiny, 64) == GpuSplit(0, False, False)
    s = Parts.of_model(tiny, 64)
    small = placement_for(tiny, GpuInfo("Small GPU", "6.1", _free_for(int(s.layer(0) * 1.5))), 64)
    p = placement_from_plan(small, tiny, 64)
    assert p == GpuSplit(1, False, False)


@pytest.mark.parametrize("arch", ["llama", "qwen35moe"])
def test_the_engine_places_what_the_plan_says(tmp_path, arch):
    """One algorithm: for every VRAM size, the split the engine reads from a plan is the one it computes for
    that VRAM itself, the model it places holds exactly the plan's GPU bytes, and the plan's groups add up."""
    from guild.tools.tiny_hybrid import write_tiny_hybrid

    path = tmp_path / "m.gguf"
    if arch == "llama":
        write_tiny_model(path, arch="llama", n_experts=4, top_k=2, qtype="Q8_0", seed=6)
    else:
        write_tiny_hybrid(path, arch="qwen35moe", n_layers=4, nextn=True, seed=2)
    m = load_model(str(path))
    s = Parts.of_model(m, 64)
    n = m.args.n_layers
    steps = [0] + [sum(s.layer(i) for i in range(k)) for k in range(1, n + 1)]
    budgets = [b + d for b in steps for d in (0, s.layer(0) // 2)] + [steps[-1] + s.output + s.mtp,
                                                                     steps[-1] + s.output + s.mtp + s.embed]
    seen = set()
    for budget in budgets:
        vram = _free_for(budget)
        pl = placement_for(m, GpuInfo("G", "8.9", vram), 64)
        sp = placement_from_plan(pl, m, 64)
        assert sp == default_placement(m, vram, 64), budget
        on_gpu = sum(s.layer(i) for i in range(sp.gpu_layers)) + (s.output + s.mtp if sp.output_gpu else 0) + (
            s.embed if sp.embed_gpu and not s.tied else 0)
        assert pl.gpu_bytes == on_gpu <= pl.vram_budget_bytes
        assert sum(g.bytes for g in pl.groups) == sum(b for b, _ in s.table.values())
        seen.add(sp)
    assert GpuSplit(0, False, False) in seen and GpuSplit(n, True, True) in seen and len(seen) >= n + 1


# -- device resolution ------------------------------------------------------------------------------------
def test_resolve_device(monkeypatch):
    import guild.engine.device as d

    assert resolve_device("cpu") == Device("cpu")
    with pytest.raises(BadFlagError, match="--device"):
        resolve_device("tpu")
    monkeypatch.setattr(d, "probe_cuda", lambda index=0: (None, "no CUDA device"))
    auto = resolve_device("auto")
    assert auto.kind == "cpu" and "no CUDA device" in auto.describe()
    with pytest.raises(DeviceUnavailableError, match="no usable CUDA GPU: no CUDA device"):
        resolve_device("cuda")
    gpu = Device("cuda", "GeForce GTX 1070", 61, 8 * 2**30, 7 * 2**30)
    monkeypatch.setattr(d, "probe_cuda", lambda index=0: (gpu, ""))
    assert resolve_device("auto") is gpu and "sm_61" in gpu.describe()


def test_probe_without_cupy(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy -> ImportError
    dev, why = probe_cuda()
    assert dev is None and "CuPy is not installed" in why


def test_probe_here_is_consistent():
    dev, why = probe_cuda()
    assert (dev is None) == bool(why)
    if dev is not None:
        assert dev.is_cuda and dev.cc >= 50 and dev.total_bytes > 0


def test_move_to_device_builds_the_engine_or_falls_back(tmp_path, monkeypatch):
    """load.move_to_device end to end with a fake CUDA device: the default placement from the free VRAM, the
    engine swapped in, the device said in words; auto falls back when the architecture has no GPU path."""
    import guild.engine.device as d
    import guild.engine.gpu as eg
    from guild.load import LoadedModel as Loaded
    from guild.load import move_to_device

    path = tmp_path / "m.gguf"
    write_tiny_model(path, arch="llama", n_experts=4, top_k=2, qtype="Q8_0", seed=6)
    m = load_model(str(path))
    gpu = Device("cuda", "Fake GPU", 61, 2**31, 2**31)
    monkeypatch.setattr(d, "probe_cuda", lambda index=0: (gpu, ""))
    monkeypatch.setattr(eg, "CudaBackend", lambda index=0: HostBackend.fake_device())
    lm = Loaded(str(path), m.gguf, m, None, 0.0)
    move_to_device(lm, "auto", 64)
    assert type(lm.model) is type(m) and lm.model.placement == GpuSplit(2, True, True)
    assert "Fake GPU" in lm.device and "experts on CPU" in lm.device
    st = lm.model.new_state(32)
    assert np.array_equal(lm.model.forward(SEQ[:4], st), m.forward(SEQ[:4], m.new_state(32)))

    other = types.SimpleNamespace(args=types.SimpleNamespace(arch="mamba"), gguf=m.gguf)
    lm2 = Loaded(str(path), m.gguf, other, None, 0.0)
    move_to_device(lm2, "auto", 64)
    assert lm2.model is other and lm2.device == "cpu" and lm2.device_reason.startswith("auto:")
    assert "mamba" in lm2.device_reason
    with pytest.raises(GpuPathError, match="mamba"):
        move_to_device(lm2, "cuda", 64)


def test_nothing_fits_is_a_clear_error(tiny):
    tiny_gpu = Device("cuda", "Tiny GPU", 61, 2**20, 2**20)
    with pytest.raises(GpuPathError, match="nothing fits on Tiny GPU"):
        build(tiny, tiny_gpu, 64)


def test_both_backends_implement_the_backend_protocol():
    """Every op of engine.backends.Backend exists on HostBackend and CudaBackend with the Protocol's signature,
    and neither has a public op the Protocol lacks (fake_device, a constructor, is not an op); a TimedBackend
    around one is a Backend too."""

    from guild.engine.backends import Backend, CudaBackend, KernelClock, TimedBackend, backend_ops

    ops = set(backend_ops())
    assert len(ops) >= 30 and "matmul" in ops and "name" not in ops
    for cls in (HostBackend, CudaBackend):
        for n in ops:
            assert inspect.signature(getattr(cls, n)) == inspect.signature(getattr(Backend, n)), f"{cls.__name__}.{n}"
        public = {n for n, v in vars(cls).items() if not n.startswith("_") and callable(v)}
        assert public - ops == set(), cls.__name__
    assert isinstance(HostBackend.fake_device(), Backend)
    timed = TimedBackend(HostBackend.fake_device(), KernelClock())
    assert isinstance(timed, Backend)
    # as Python 3.12's isinstance() looks: every member found statically, never through __getattr__
    missing = object()
    members = typing._get_protocol_attrs(Backend)
    assert [n for n in members if inspect.getattr_static(timed, n, missing) is missing] == []
    timed.inner.h2d += 1
    assert timed.h2d == timed.inner.h2d  # the counters read live
