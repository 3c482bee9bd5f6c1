"""guild.tools.tiny.write_tiny_model: names, shapes, types, metadata, tokenizer, determinism."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType
from gguf.quants import dequantize

from guild.formats.gguf import GGUFFile
from guild.tools.tiny import SPECIAL_TOKENS, bytes_to_unicode, tiny_vocab, write_tiny_model

Q = GGMLQuantizationType
SMALL = dict(dim=64, ffn=128, n_heads=4, n_kv_heads=2)
KQ = dict(dim=256, ffn=512, n_heads=4, n_kv_heads=2)  # K-quant / 256-block IQ rows need K % 256 == 0

CASES = [
    ("llama", "F32", SMALL),
    ("llama", "F16", SMALL),
    ("llama", "BF16", SMALL),
    ("llama", "Q8_0", dict(SMALL, tied=True)),
    ("llama", "Q4_0", SMALL),
    ("llama", "Q4_1", SMALL),
    ("llama", "Q5_0", SMALL),
    ("llama", "IQ4_NL", SMALL),
    ("llama", "Q4_1", dict(SMALL, n_experts=4, top_k=2)),
    ("llama", "Q4_K", KQ),
    ("llama", "Q5_K", KQ),
    ("llama", "Q6_K", dict(KQ, n_experts=4, expert_ffn=256)),
    ("llama", "IQ4_XS", KQ),
    ("qwen3", "F32", dict(SMALL, head_dim=32)),
    ("qwen3", "Q8_0", SMALL),
    ("qwen3moe", "F32", dict(SMALL, n_experts=8, top_k=2, expert_ffn=32)),
    ("qwen3moe", "Q4_K", dict(KQ, n_experts=4, top_k=2, expert_ffn=256)),
]


def _expected(arch: str, kw: dict) -> dict[str, tuple[tuple[int, ...], bool]]:
    """name → (numpy shape, is_float32_vector_or_router)."""
    dim, ffn, nh, nkv = kw["dim"], kw["ffn"], kw["n_heads"], kw["n_kv_heads"]
    hd = kw.get("head_dim") or dim // nh
    E, eff, vocab = kw.get("n_experts", 0), kw.get("expert_ffn") or ffn, kw.get("vocab", 320)
    exp = {"token_embd.weight": ((vocab, dim), False), "output_norm.weight": ((dim,), True)}
    if not kw.get("tied"):
        exp["output.weight"] = ((vocab, dim), False)
    for i in range(kw.get("n_layers", 2)):
        p = f"blk.{i}."
        exp |= {
            p + "attn_norm.weight": ((dim,), True),
            p + "attn_q.weight": ((nh * hd, dim), False),
            p + "attn_k.weight": ((nkv * hd, dim), False),
            p + "attn_v.weight": ((nkv * hd, dim), False),
            p + "attn_output.weight": ((dim, nh * hd), False),
            p + "ffn_norm.weight": ((dim,), True),
        }
        if arch.startswith("qwen3"):
            exp[p + "attn_q_norm.weight"] = ((hd,), True)
            exp[p + "attn_k_norm.weight"] = ((hd,), True)
        if E:
            exp |= {
                p + "ffn_gate_inp.weight": ((E, dim), True),
                p + "ffn_gate_exps.weight": ((E, eff, dim), False),
                p + "ffn_up_exps.weight": ((E, eff, dim), False),
                p + "ffn_down_exps.weight": ((E, dim, eff), False),
            }
        else:
            exp |= {
                p + "ffn_gate.weight": ((ffn, dim), False),
                p + "ffn_up.weight": ((ffn, dim), False),
                p + "ffn_down.weight": ((dim, ffn), False),
            }
    return exp


@pytest.mark.parametrize("arch,qtype,kw", CASES, ids=[f"{a}-{q}-{i}" for i, (a, q, _) in enumerate(CASES)])
def test_tiny_model_layout(tmp_path, arch, qtype, kw):
    path = write_tiny_model(tmp_path / "m.gguf", arch, qtype=qtype, **kw)
    g = GGUFFile(path)
    exp = _expected(arch, kw)
    assert set(g.tensors) == set(exp)
    for name, (shape, is_f32) in exp.items():
        t = g.tensors[name]
        assert t.shape == shape, name
        assert t.qtype == (Q.F32 if is_f32 else Q[qtype]), name
        g.tensor(name)  # guild's own checks (supported type, row length multiple of the block)

    m = g.metadata
    dim, nh = kw["dim"], kw["n_heads"]
    E = kw.get("n_experts", 0)
    assert m["general.architecture"] == arch
    assert m[f"{arch}.block_count"] == 2
    assert m[f"{arch}.context_length"] == 256
    assert m[f"{arch}.embedding_length"] == dim
    assert m[f"{arch}.attention.head_count"] == nh
    assert m[f"{arch}.attention.head_count_kv"] == kw["n_kv_heads"]
    assert m[f"{arch}.rope.freq_base"] > 0
    assert 0 < m[f"{arch}.attention.layer_norm_rms_epsilon"] < 1e-4
    if kw.get("head_dim"):
        assert m[f"{arch}.attention.key_length"] == m[f"{arch}.attention.value_length"] == kw["head_dim"]
    else:
        assert f"{arch}.attention.key_length" not in m
    if E:
        assert m[f"{arch}.expert_count"] == E
        assert m[f"{arch}.expert_used_count"] == kw.get("top_k", 2)
    else:
        assert f"{arch}.expert_count" not in m
    if arch == "qwen3moe":
        assert m["qwen3moe.expert_feed_forward_length"] == kw["expert_ffn"]
        assert m["qwen3moe.feed_forward_length"] == kw["ffn"]
        assert m["qwen3moe.expert_weights_norm"] is True
    elif arch == "llama":
        assert m["llama.feed_forward_length"] == (kw.get("expert_ffn") or kw["ffn"])
        assert m["llama.rope.dimension_count"] == dim // nh
        assert m["llama.vocab_size"] == 320
    assert m["tokenizer.ggml.model"] == "gpt2" and m["tokenizer.ggml.pre"] == "gpt-2"
    assert len(m["tokenizer.ggml.tokens"]) == len(m["tokenizer.ggml.token_type"]) == 320
    assert m["tokenizer.ggml.bos_token_id"] == 317 and m["tokenizer.ggml.eos_token_id"] == 319
    assert "<|im_start|>" in m["tokenizer.chat_template"]

    # Weights are finite, roughly at their intended scale, and not all the same.
    t = g.tensors["blk.0.attn_q.weight"]
    w = dequantize(np.asarray(t.data), t.qtype).reshape(t.shape)
    assert np.isfinite(w).all()
    assert 0.5 / np.sqrt(dim) < w.std() < 2.0 / np.sqrt(dim)
    assert abs(w.mean()) < 0.2 * w.std()
    n = g.tensors["blk.1.ffn_norm.weight"].data
    assert 0.7 < float(np.mean(n)) < 1.3


def test_metadata_value_types(tmp_path):
    """Types as llama.cpp's converter writes them (a loader reading e.g. uint32 strictly must not choke)."""
    r = GGUFReader(write_tiny_model(tmp_path / "m.gguf", "qwen3moe", n_experts=4))
    t = {k: [GGUFValueType(int(x)) for x in f.types] for k, f in r.fields.items()}
    V = GGUFValueType
    assert t["qwen3moe.block_count"] == [V.UINT32]
    assert t["qwen3moe.expert_count"] == [V.UINT32]
    assert t["qwen3moe.rope.freq_base"] == [V.FLOAT32]
    assert t["qwen3moe.attention.layer_norm_rms_epsilon"] == [V.FLOAT32]
    assert t["qwen3moe.expert_weights_norm"] == [V.BOOL]
    assert t["tokenizer.ggml.tokens"] == [V.ARRAY, V.STRING]
    assert t["tokenizer.ggml.token_type"] == [V.ARRAY, V.INT32]
    assert t["tokenizer.ggml.merges"] == [V.ARRAY, V.STRING]
    assert t["tokenizer.ggml.bos_token_id"] == [V.UINT32]
    assert t["tokenizer.ggml.add_bos_token"] == [V.BOOL]


def _sha(p) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


@pytest.mark.parametrize("arch,qtype,kw", [("llama", "Q4_1", {}), ("qwen3moe", "Q4_K", dict(KQ, n_experts=4))])
def test_deterministic(tmp_path, arch, qtype, kw):
    a = write_tiny_model(tmp_path / "a.gguf", arch, qtype=qtype, seed=3, **kw)
    b = write_tiny_model(tmp_path / "b.gguf", arch, qtype=qtype, seed=3, **kw)
    c = write_tiny_model(tmp_path / "c.gguf", arch, qtype=qtype, seed=4, **kw)
    assert _sha(a) == _sha(b)
    assert _sha(a) != _sha(c)


def test_same_seed_same_weights_across_qtypes(tmp_path):
    """Weights are seeded per tensor name: a Q8_0 model is the F32 model of the same seed, quantised."""
    f = GGUFFile(write_tiny_model(tmp_path / "f.gguf", qtype="F32"))
    q = GGUFFile(write_tiny_model(tmp_path / "q.gguf", qtype="Q8_0"))
    for name in ("token_embd.weight", "blk.1.ffn_down.weight"):
        a = np.asarray(f.tensors[name].data)
        tq = q.tensors[name]
        b = dequantize(np.asarray(tq.data), tq.qtype).reshape(tq.shape)
        assert np.abs(a - b).max() < 0.02 * np.abs(a).max()
    assert np.array_equal(f.tensors["blk.0.attn_norm.weight"].data, q.tensors["blk.0.attn_norm.weight"].data)


def test_tokenizer_vocabulary():
    tokens, types, merges = tiny_vocab(320)
    b2u = bytes_to_unicode()
    assert len(tokens) == len(types) == 320 and len(set(tokens)) == 320
    assert tokens[:256] == tuple(b2u[b] for b in range(256))  # token id b is byte b
    assert tokens[-3:] == SPECIAL_TOKENS
    assert types[-3:] == (3, 3, 3) and set(types[:-3]) == {1}
    assert len(merges) == 320 - 259
    known = set(tokens[:256])
    for i, m in enumerate(merges):
        a, b = m.split(" ")
        assert a in known and b in known
        assert tokens[256 + i] == a + b
        known.add(a + b)
    assert tiny_vocab(512)[2][:61] == merges  # a larger vocabulary extends the same merge list


def test_chat_template_renders(tmp_path):
    jinja2 = pytest.importorskip("jinja2")
    m = GGUFFile(write_tiny_model(tmp_path / "m.gguf")).metadata
    out = jinja2.Template(m["tokenizer.chat_template"]).render(
        messages=[{"role": "user", "content": "hi"}], add_generation_prompt=True
    )
    assert out == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.parametrize(
    "kw",
    [
        dict(arch="mamba"),
        dict(arch="qwen3moe"),
        dict(arch="qwen3", n_experts=4),
        dict(vocab=200),
        dict(vocab=5000),
        dict(qtype="Q4_K"),  # dim 64 is not a multiple of 256
        dict(qtype="NOPE"),
        dict(n_experts=4, top_k=5),
        dict(n_heads=4, n_kv_heads=3),
    ],
)
def test_bad_arguments(tmp_path, kw):
    with pytest.raises(ValueError):
        write_tiny_model(tmp_path / "m.gguf", **kw)
