"""Every stored KV type (--cache-type-k / --cache-type-v: f16, q8_0) keeps the exactness contract on the host
backend: on tiny copy models (a llama MoE and the hybrid qwen35moe, each with a copy MTP head), every strategy
emits the `normal` stream of the same KV type, greedy and seeded, with drafts proposed, accepted and rejected
(tests/gpu/test_gpu_matrix.py's workload and cell checks). The GPU path (here the fake device) refuses the types
it does not store, in one line, never running them as float32."""

import pytest

from guild.engine.backends import HostBackend
from guild.engine.gpu import split_onto_device
from guild.engine.kvtypes import KVTypes
from guild.engine.placement import GpuSplit
from guild.errors import GpuPathError
from guild.models import load_model
from guild.tools.tiny import write_tiny_model, write_tiny_mtp_head
from guild.tools.tiny_hybrid import write_tiny_hybrid
from tests.gpu.test_gpu_matrix import COPY_BIAS, SAMPLING, N, P, altered, check_cell, generate

KVS = {"f16": KVTypes("f16", "f16"), "q8_0": KVTypes("q8_0", "q8_0")}  # mixed pairs: tests/models/test_model.py
STRATEGIES = ("lookup", "retrieval", "mtp", "adaptive")


def _write(root, name: str) -> str:
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
    return request.param, load_model(_write(tmp_path_factory.mktemp(request.param), request.param))


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


@pytest.mark.parametrize("kv,flag", [(KVTypes("q8_0", "f32"), "--cache-type-k q8_0"),
                                     (KVTypes("f32", "f16"), "--cache-type-v f16")])
def test_the_gpu_path_refuses_other_kv_types(model, kv, flag):
    _, m = model
    eng = split_onto_device(m, HostBackend.fake_device(), GpuSplit(m.args.n_layers))
    with pytest.raises(GpuPathError, match=f"^{flag} is not supported on the GPU yet$"):
        eng.new_state(64, kv)
    eng.new_state(64, KVTypes())  # float32 still runs there
