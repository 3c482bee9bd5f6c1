"""Every stored KV type (--cache-type-k / --cache-type-v: f16, q8_0) keeps the exactness contract: on tiny copy
models (a llama MoE and the hybrid qwen35moe, each with a copy MTP head), every strategy emits the `normal` stream
of the same KV type, greedy and seeded, with drafts proposed, accepted and rejected (tests/gpu/test_gpu_matrix.py's
workload and cell checks), on the host and on the GPU path (here the fake device, whole and half placed: a host
layer's cache inside the device's), whose caches hold the stored types' bytes. The CUDA kernels' side runs in
tests/gpu/test_cuda.py."""

import pytest

from guild.engine.backends import HostBackend
from guild.engine.gpu import split_onto_device
from guild.engine.placement import GpuSplit
from guild.kvtypes import KVTypes
from guild.models import load_model
from guild.tools.tiny import write_tiny_model, write_tiny_mtp_head
from guild.tools.tiny_hybrid import write_tiny_hybrid
from tests.gpu.test_gpu_matrix import COPY_BIAS, SAMPLING, N, P, altered, check_cell, generate

KVS = {"f16": KVTypes("f16", "f16"), "q8_0": KVTypes("q8_0", "q8_0")}  # mixed pairs: tests/models/test_model.py
STRATEGIES = ("lookup", "retrieval", "mtp", "adaptive")


def write_model(root, name: str) -> str:
    """A tiny copy model with a copy MTP head whose head size takes q8_0 (whole blocks of 32)."""
    if name == "qwen35moe":
        model, head = COPY_BIAS["hybrid"]
        return str(write_tiny_hybrid(root / "h.gguf", seed=3, copy_bias=model, mtp_copy_bias=head, arch="qwen35moe",
                                     nextn=True, n_layers=4, qtype="Q8_0", shared_ffn=64))
    model, head = COPY_BIAS["llama-family"]
    path = write_tiny_model(root / "m.gguf", seed=3, copy_bias=model, arch="llama", n_experts=4, top_k=2,
                            qtype="Q8_0", head_dim=32)  # q8_0 needs whole blocks of 32 along head_dim
    write_tiny_mtp_head(path, root / "m.mtp.gguf", copy_bias=head)
    return str(path)


@pytest.fixture(scope="module", params=["llama-moe", "qwen35moe"])
def model(request, tmp_path_factory):
    return request.param, load_model(write_model(tmp_path_factory.mktemp(request.param), request.param))


@pytest.mark.parametrize("kv", list(KVS))
def test_every_strategy_emits_normal_for_each_kv_type(model, kv, fixed_clock):
    name, m = model
    for sampling, sp in SAMPLING.items():
        a = generate(m, "normal", sp, N, P, kv=KVS[kv])[0]
        b = generate(m, "normal", sp, N, P + altered(a) + P, kv=KVS[kv])[0]
        corpus = P + altered(a) + P + altered(b)
        want = generate(m, "normal", sp, N, corpus + P, kv=KVS[kv])[0]
        for strategy in STRATEGIES:
            got, st = generate(m, strategy, sp, N, corpus + P, corpus, fixed_clock, kv=KVS[kv])
            where = f"{name} {kv} {strategy} {sampling}"
            assert got == want, where
            check_cell(strategy, st, where)


@pytest.mark.gpu  # the fake device
@pytest.mark.parametrize("kv", list(KVS))
def test_the_gpu_path_stores_each_kv_type_and_emits_normal(model, kv, fixed_clock):
    name, m = model
    sp = SAMPLING["seeded"]
    a = generate(m, "normal", sp, N, P, kv=KVS[kv])[0]
    b = generate(m, "normal", sp, N, P + altered(a) + P, kv=KVS[kv])[0]
    corpus = P + altered(a) + P + altered(b)
    want = generate(m, "normal", sp, N, corpus + P, kv=KVS[kv])[0]
    a_ = m.args
    for layers in (a_.n_layers, a_.n_layers // 2):
        eng = split_onto_device(m, HostBackend.fake_device(), GpuSplit(layers))
        st = eng.new_state(64, KVS[kv])
        cache = getattr(st, "kv", st)  # a hybrid's attention layers' cache
        assert cache.kv_types == KVS[kv] and cache.nbytes == 64 * KVS[kv].token_bytes(len(cache.k), a_.n_kv_heads,
                                                                                         a_.head_dim)
        for strategy in ("normal", *STRATEGIES):
            got, st = generate(eng, strategy, sp, N, corpus + P, corpus, fixed_clock, kv=KVS[kv])
            where = f"{name} {kv} {strategy} on {layers} of {a_.n_layers} device layers"
            assert got == want, where
            check_cell(strategy, st, where)


def test_the_placement_budgets_the_stored_kv_types(model):
    """A layer's KV cache on the GPU is what its types store: f16 half of float32's, q8_0 34 bytes per 32 values."""
    _, m = model
    a = m.args
    f32, cache = m.state_bytes(256), 256 * 2 * a.n_kv_heads * a.head_dim * 4
    assert cache in f32
    for kv, ratio in ((KVS["f16"], 1 / 2), (KVS["q8_0"], 34 / 128), (KVTypes("q8_0", "f32"), (34 / 128 + 1) / 2)):
        assert m.state_bytes(256, kv) == [int(cache * ratio) if b == cache else b for b in f32], kv
