"""The GPU path's matrix on tiny models: every strategy (normal, lookup, retrieval, mtp, adaptive) x every
architecture (llama dense, llama MoE, qwen3, qwen3moe, qwen3next, qwen35moe, each with an MTP head) x greedy and
seeded sampling, on the model placed on the counting host backend (HostBackend.fake_device: the GPU path's
placement, layout, device state and transfers around the CPU kernels), must emit the tokens of the CPU engine's
`normal`, with drafts proposed, accepted and rejected in every drafting cell. A chosen subset runs on the CUDA
emulator (tests/cuda_emu: the .cu kernels built as C++) in tests/gpu/test_cuda.py. Also: the final hidden rows
leave the device only when a consumer reads them, and the transfers per window.

The models are copy models (guild.tools.tiny.copy_output, their MTP heads copy heads) and the prompt quotes what
they answer: two passages (the replies to P and to P + passage + P, since a reply may alternate between two
chains), each with every fifth token altered, then P again. Lookup and retrieval copy the passages and are
refused at the altered tokens; the head is right most of the time; the adaptive scheduler sees all three."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from guild.engine.backends import DeviceRows, HostBackend
from guild.engine.gpu import split_onto_device
from guild.engine.placement import GpuSplit
from guild.engine.sampling import SamplingParams
from guild.engine.session import GuildSession
from guild.kvtypes import F32_KV, KVTypes
from guild.models import load_model
from guild.models.mtp import find_mtp_head
from guild.speculative.build import make_drafter
from guild.tools.tiny import write_tiny_model, write_tiny_mtp_head
from guild.tools.tiny_hybrid import write_tiny_hybrid

pytestmark = pytest.mark.gpu  # the GPU path, on the fake device (HostBackend.fake_device)

ARCHS = {
    "llama": dict(arch="llama", qtype="Q8_0"),
    "llama-moe": dict(arch="llama", n_experts=4, top_k=2, qtype="Q8_0"),
    "qwen3": dict(arch="qwen3", qtype="F16"),
    "qwen3moe": dict(arch="qwen3moe", n_experts=4, top_k=2, qtype="Q4_0"),
    "qwen3next": dict(arch="qwen3next", nextn=True, n_layers=4),
    "qwen35moe": dict(arch="qwen35moe", nextn=True, n_layers=4, qtype="Q8_0", shared_ffn=64),
    "llama-moe-fused": dict(arch="llama", n_experts=4, top_k=2, qtype="Q8_0", n_layers=3),
}
FUSE = {"llama-moe-fused": (0, 1)}  # its head fuses these layers' rows with the final hidden (EAGLE-3)
HYBRIDS = ("qwen3next", "qwen35moe")
# (model, MTP head) copy biases: a head right most of the time, not always; the hybrids' recurrent layers pull
# harder off the chain
COPY_BIAS = {"llama-family": (3.3, 1.0), "hybrid": (4.5, 0.8)}
STRATEGIES = ("normal", "lookup", "retrieval", "mtp", "adaptive")
DRAFTING = STRATEGIES[1:]
# seeded: temperature low enough that a sampled reply still quotes the passage, high enough to leave it sometimes
SAMPLING = {"greedy": SamplingParams(), "seeded": SamplingParams(temperature=0.5, top_k=40, seed=7)}
P = [5, 77, 12, 200, 31, 9, 150, 64, 3, 99]
N = 24
N_CTX = 160
PROMPT = P * 3  # the plain prompt of the placement and transfer tests


def write_arch(root, name: str, seed: int = 3) -> str:
    """A tiny copy model of `name` (ARCHS) with a copy MTP head: a sidecar for the llama family, a nextn block for
    the hybrids."""
    kw = dict(ARCHS[name])
    if name in HYBRIDS:
        model, head = COPY_BIAS["hybrid"]
        return str(write_tiny_hybrid(root / f"{name}.gguf", seed=seed, copy_bias=model, mtp_copy_bias=head, **kw))
    model, head = COPY_BIAS["llama-family"]
    path = write_tiny_model(root / f"{name}.gguf", seed=seed, copy_bias=model, **kw)
    write_tiny_mtp_head(path, root / f"{name}.mtp.gguf", copy_bias=head, fuse=FUSE.get(name, ()))
    return str(path)


def altered(passage: list[int]) -> list[int]:
    """The passage with every fifth token changed: where a copying drafter is wrong."""
    return [t ^ 1 if i % 5 == 4 else t for i, t in enumerate(passage)]


@dataclass(frozen=True)
class Workload:
    prompt: list[int]
    corpus: list[int]  # what the retrieval drafter ingests: the passages
    want: list[int]  # the CPU engine's `normal` stream


def workload(cpu, sampling: SamplingParams, n: int = N, kv: KVTypes = F32_KV) -> Workload:
    """The input-grounded prompt for `cpu` under `sampling` and its CPU `normal` stream (KV cache types kv)."""
    a = generate(cpu, "normal", sampling, n, P, kv=kv)[0]
    b = generate(cpu, "normal", sampling, n, P + altered(a) + P, kv=kv)[0]
    corpus = P + altered(a) + P + altered(b)
    prompt = corpus + P
    return Workload(prompt, corpus, generate(cpu, "normal", sampling, n, prompt, kv=kv)[0])


def generate(model, strategy: str, sampling: SamplingParams, n: int = N, prompt=PROMPT, corpus=(), clock=None,
             kv: KVTypes = F32_KV):
    """(tokens, stats) of `strategy` with the KV cache in the types `kv`; `clock` (fixed_clock) times the adaptive
    drafter's proposals."""
    head = find_mtp_head(model) if strategy in ("mtp", "adaptive") else None
    d = None if strategy == "normal" else make_drafter(strategy, mtp_head=head, n_ctx=N_CTX)
    if corpus and strategy in ("retrieval", "adaptive"):
        d.ingest(corpus)
    if clock is not None and strategy == "adaptive":
        d.clock = clock
    return GuildSession(model, n_ctx=N_CTX, kv=kv).generate(prompt, n, sampling=sampling, drafter=d, max_draft=4)


def check_cell(strategy: str, st, where: str) -> dict:
    """Drafts proposed, accepted and rejected (every drafting strategy can be wrong); the adaptive scheduler chose
    at least two drafters. Returns the counts."""
    drafted = sum(w.k for w in st.windows)
    accepted = sum(w.emitted - 1 for w in st.windows)
    rejected = sum(1 for w in st.windows if w.emitted - 1 < w.k)  # windows where a draft was refused
    chosen = sorted({w.strategy for w in st.windows if w.k})
    counts = dict(drafted=drafted, accepted=accepted, rejected=rejected, chosen=chosen)
    if strategy == "normal":
        assert drafted == 0, (where, counts)
        return counts
    assert drafted > 0 and accepted > 0 and rejected > 0, (where, counts)
    if strategy == "adaptive":
        assert len(chosen) >= 2, (where, counts)
    else:
        assert chosen == [strategy], (where, counts)
    return counts


@pytest.fixture(scope="module", params=list(ARCHS))
def arch(request, tmp_path_factory):
    """(name, CPU model, the placed model on a fake device, {sampling: Workload})."""
    path = write_arch(tmp_path_factory.mktemp(request.param), request.param)
    cpu = load_model(path)
    work = {s: workload(cpu, p) for s, p in SAMPLING.items()}
    eng = split_onto_device(cpu, HostBackend.fake_device(), GpuSplit(cpu.args.n_layers))
    return request.param, cpu, eng, work


@pytest.mark.parametrize("sampling", list(SAMPLING))
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_strategy_on_the_placed_model_emits_the_cpu_normal_stream(arch, strategy, sampling, fixed_clock):
    name, _, eng, work = arch
    w = work[sampling]
    got, st = generate(eng, strategy, SAMPLING[sampling], prompt=w.prompt, corpus=w.corpus, clock=fixed_clock)
    assert got == w.want, f"{name} {strategy} {sampling}"
    check_cell(strategy, st, f"{name} {strategy} {sampling}")
    if strategy == "mtp":  # the head drafted on the device
        assert find_mtp_head(eng).be is eng.dev


def test_split_placement_with_the_head_on_the_host(tmp_path):
    """Layers split across the device and the host, output and MTP head on the host: the hidden rows arrive as
    host arrays, the head runs on the CPU, the stream is the CPU's."""
    path = write_arch(tmp_path, "qwen35moe")
    cpu = load_model(path)
    ref, _ = generate(cpu, "normal", SAMPLING["greedy"])
    eng = split_onto_device(cpu, HostBackend.fake_device(), GpuSplit(2, True, False))
    got, st = generate(eng, "mtp", SAMPLING["greedy"])
    assert got == ref and any(w.k for w in st.windows)
    assert find_mtp_head(eng).be is not eng.dev


@pytest.mark.parametrize("gpu_layers", [1, 2])
def test_fused_head_reads_rows_from_both_sides_of_a_split(tmp_path, gpu_layers):
    """A head fusing layers 0 and 1 while the split puts one or both of them on the host: the fused rows come
    from the device and the host as placed, the head runs on the device, the stream is the CPU's."""
    path = write_arch(tmp_path, "llama-moe-fused")
    cpu = load_model(path)
    ref, _ = generate(cpu, "normal", SAMPLING["greedy"])
    eng = split_onto_device(cpu, HostBackend.fake_device(), GpuSplit(gpu_layers))
    assert not eng.forward_batch([(PROMPT[:5], eng.new_state(16))])[0].features  # no head loaded: nothing kept
    find_mtp_head(eng)
    out = eng.forward_batch([(PROMPT[:5], eng.new_state(16))])[0]
    assert [isinstance(f, DeviceRows) for f in out.features] == [True, gpu_layers == 2]
    got, st = generate(eng, "mtp", SAMPLING["greedy"])
    assert got == ref and any(w.emitted > 1 for w in st.windows)
    assert find_mtp_head(eng).be is eng.dev and find_mtp_head(eng).feature_layers == (0, 1)


def test_hidden_rows_move_only_when_read(tmp_path):
    path = write_arch(tmp_path, "llama-moe")
    cpu = load_model(path)
    dev = HostBackend.fake_device()
    eng = split_onto_device(cpu, dev, GpuSplit(2))
    st = eng.new_state(64)
    before = dev.counters()
    out = eng.forward_batch([(PROMPT[:6], st)])[0]
    assert isinstance(out.hidden, DeviceRows) and out.hidden.shape == (6, cpu.args.dim)
    after = dev.counters()
    part = out.hidden[2:5]  # a view: still nothing moved
    assert dev.counters() == after and len(part) == 3
    rows = np.asarray(part)  # read: one D2H of exactly those rows
    assert dev.d2h == after[2] + 1 and dev.d2h_bytes == after[3] + 3 * cpu.args.dim * 4
    want = cpu.forward_batch([(PROMPT[:6], cpu.new_state(64))])[0].hidden
    assert np.array_equal(rows, want[2:5]) and np.array_equal(np.asarray(out.hidden), want)
    assert after[0] - before[0] == 1 + 2  # indices + one expert output per MoE layer
    seen = dev.counters()
    both = np.concatenate([out.hidden[:2], out.hidden[2:6]])  # a consumer on the device: nothing moves
    assert isinstance(both, DeviceRows) and dev.counters() == seen
    assert np.array_equal(np.asarray(both), want)


@pytest.mark.parametrize("name", ["llama-moe", "qwen35moe"])
def test_transfers_per_window(tmp_path, name):
    """A window of T rows on a fully placed model: one H2D of the indices (tokens, positions, last row, and for
    a hybrid the per-row snapshot buffers), per MoE layer one D2H (ids, weights, rows) and one H2D (expert
    output), one D2H of the logits; the hidden rows stay on the device."""
    cpu = load_model(write_arch(tmp_path, name))
    a = cpu.args
    dev = HostBackend.fake_device()
    eng = split_onto_device(cpu, dev, GpuSplit(a.n_layers))
    st = eng.new_state(64)
    eng.forward(PROMPT[:5], st)
    st.commit(5)
    for T in (1, 4, 8):
        h2d, h2d_b, d2h, d2h_b = dev.counters()
        eng.forward(PROMPT[5 : 5 + T], st)
        st.commit(1)
        assert dev.h2d - h2d == 1 + a.n_layers and dev.d2h - d2h == 1 + a.n_layers, f"T={T}"
        idx = (3 if name == "qwen35moe" else 2) * T + 1  # tokens | positions | last row (| snapshot buffers)
        assert dev.h2d_bytes - h2d_b == idx * 8 + a.n_layers * T * a.dim * 4
        assert dev.d2h_bytes - d2h_b >= a.n_layers * T * a.dim * 4 + T * a.vocab_size * 4
