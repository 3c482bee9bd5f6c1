"""guild.tools.synth: files at published shapes (shrunk by --scale here) that guild loads and runs, per-tensor
types as llama.cpp picks them, Zipf-skewed routing, and one-line errors for bad flags."""

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from guild.errors import BadFlagError, GuildError
from guild.formats.gguf import GGUFFile, f32
from guild.kernels.ref_quant import dequantize
from guild.models import REGISTRY
from guild.models.validate import validate_file
from guild.tools import synth as S

SMALL = dict(scale=0.0625, context=512)


def write(tmp_path, preset, **kw):
    args = {**SMALL, **kw}
    name = f"{preset}-{'-'.join(f'{k}{v}' for k, v in sorted(kw.items()))}.gguf"
    return S.synth(preset, tmp_path / name, **args)


def test_presets_carry_the_published_dimensions():
    p = S.shape("qwen3-30b-a3b", layers=48)
    assert (p.arch, p.n_layers, p.dim, p.n_heads, p.n_kv_heads, p.head_dim) == ("qwen3moe", 48, 2048, 32, 4, 128)
    assert (p.n_experts, p.top_k, p.expert_ffn) == (128, 8, 768)
    p = S.shape("qwen3-235b-a22b")
    assert (p.dim, p.n_heads, p.n_kv_heads, p.head_dim, p.n_experts, p.top_k, p.expert_ffn) == \
        (4096, 64, 4, 128, 128, 8, 1536)
    p = S.shape("qwen3.5-35b-a3b")
    assert (p.arch, p.n_layers, p.n_experts, p.top_k, p.full_attention_interval) == ("qwen35moe", 4, 256, 8, 4)
    assert p.shared_ffn > 0 and p.ssm_v_heads % p.ssm_k_heads == 0
    p = S.shape("llama-8b", layers=32)
    assert (p.arch, p.n_layers, p.dim, p.n_heads, p.n_kv_heads, p.ffn, p.n_experts) == \
        ("llama", 32, 4096, 32, 8, 14336, 0)
    s = S.shape("qwen3-30b-a3b", scale=0.0625)  # widths to whole 256s, the GQA ratio and top-k kept
    assert (s.dim, s.n_heads, s.n_kv_heads, s.head_dim, s.expert_ffn, s.n_experts, s.top_k) == \
        (256, 8, 1, 128, 256, 32, 8)


@pytest.mark.parametrize("preset", list(S.PRESETS))
def test_loads_and_generates(tmp_path, preset):
    from guild.engine.session import GuildSession
    from guild.load import load

    r = write(tmp_path, preset, layers=None if preset.startswith("qwen3.5") else 1)
    p = S.shape(preset, r["layers"], **SMALL)
    g = GGUFFile(r["path"])
    a = p.arch
    assert r["bytes"] == g.size and r["tensors"] == len(g.tensors) and r["arch"] == a == g.architecture
    want = {"block_count": p.n_layers, "embedding_length": p.dim, "attention.head_count": p.n_heads,
            "attention.head_count_kv": p.n_kv_heads, "context_length": 512}
    if p.n_experts:
        want.update({"expert_count": p.n_experts, "expert_used_count": 8, "expert_feed_forward_length": p.expert_ffn})
    if a == "qwen35moe":
        want.update({"ssm.group_count": p.ssm_k_heads, "ssm.time_step_rank": p.ssm_v_heads, "ssm.state_size": 128,
                     "full_attention_interval": 4, "expert_shared_feed_forward_length": p.shared_ffn,
                     "attention.key_length": 256})
    assert {k: g.get(f"{a}.{k}") for k in want} == want
    assert len(g.get("tokenizer.ggml.tokens")) == 49152 and g.tensor("output.weight").shape == (49152, p.dim)
    if preset == "qwen3-235b-a22b":
        return  # runs as qwen3-30b-a3b does

    lm = load(r["path"], progress=False, threads=2)
    ids = lm.tokenizer.encode("The quick brown fox", add_special=True)
    toks, _ = GuildSession(lm.model, n_ctx=64, eos_ids=()).generate(ids, 4)
    assert len(toks) == 4 and all(0 <= t < 49152 for t in toks)


def _types(path) -> dict:
    return {n: t.qtype for n, t in GGUFFile(path).tensors.items()}


def test_q4_k_m_follows_llama_cpp(tmp_path):
    r = write(tmp_path, "llama-8b", layers=8)
    t = _types(r["path"])
    more_bits = {0, 3, 6, 7}  # use_more_bits(i, 8)
    for i in range(8):
        want = Q.Q6_K if i in more_bits else Q.Q4_K
        assert (t[f"blk.{i}.attn_v.weight"], t[f"blk.{i}.ffn_down.weight"]) == (want, want), i
        assert t[f"blk.{i}.attn_q.weight"] == t[f"blk.{i}.ffn_up.weight"] == Q.Q4_K
        assert t[f"blk.{i}.attn_norm.weight"] == Q.F32
    assert (t["output.weight"], t["token_embd.weight"]) == (Q.Q6_K, Q.Q4_K)

    # the hybrid: attn_qkv counts with attn_v; the shared expert's ffn_down with the experts'
    t = _types(write(tmp_path, "qwen3.5-35b-a3b")["path"])  # 4 blocks: use_more_bits holds for 2 and 3
    assert [t[f"blk.{i}.{'attn_v' if i == 3 else 'attn_qkv'}.weight"] for i in range(4)] == [Q.Q4_K] * 2 + [Q.Q6_K] * 2
    assert [t[f"blk.{i}.ffn_down_shexp.weight"] for i in range(4)] == [Q.Q4_K] * 2 + [Q.Q6_K] * 2
    assert [t[f"blk.{i}.ffn_down_exps.weight"] for i in range(4)] == [Q.Q4_K] * 2 + [Q.Q6_K] * 2
    assert t["blk.0.ssm_conv1d.weight"] == t["blk.0.ffn_gate_inp.weight"] == t["blk.0.ffn_gate_inp_shexp.weight"] \
        == Q.F32
    assert t["blk.0.ssm_out.weight"] == t["blk.0.ssm_beta.weight"] == t["blk.0.attn_gate.weight"] == Q.Q4_K


def test_q3_k_m_follows_llama_cpp(tmp_path):
    t = _types(write(tmp_path, "llama-8b", layers=32, type_name="Q3_K_M")["path"])
    for i in range(32):
        assert t[f"blk.{i}.attn_v.weight"] == (Q.Q5_K if i < 2 else Q.Q4_K), i
        assert t[f"blk.{i}.ffn_down.weight"] == (Q.Q5_K if i < 2 else Q.Q4_K), i  # i < 32 / 16
        assert t[f"blk.{i}.attn_output.weight"] == Q.Q4_K
        assert t[f"blk.{i}.attn_q.weight"] == t[f"blk.{i}.attn_k.weight"] == t[f"blk.{i}.ffn_up.weight"] == Q.Q3_K
    assert (t["output.weight"], t["token_embd.weight"]) == (Q.Q6_K, Q.Q3_K)


@pytest.mark.parametrize("typ", ["Q4_K", "Q6_K", "Q8_0", "Q2_K", "Q3_K", "IQ4_XS", "MXFP4", "MXFP4_MOE"])
def test_types_give_valid_blocks_of_the_type(tmp_path, typ):
    r = write(tmp_path, "qwen3-30b-a3b", layers=1, type_name=typ)
    g = GGUFFile(r["path"])
    validate_file(g, REGISTRY[g.architecture], {})  # shapes, and every block scale finite
    t = {n: x.qtype for n, x in g.tensors.items()}
    if typ == "MXFP4_MOE":
        assert t["blk.0.ffn_gate_exps.weight"] == t["blk.0.ffn_down_exps.weight"] == Q.MXFP4
        assert t["blk.0.attn_q.weight"] == t["output.weight"] == t["token_embd.weight"] == Q.Q8_0
    else:
        assert {q for n, q in t.items() if g.tensors[n].data.ndim > 1 and "gate_inp" not in n} == {Q[typ]}
    x = g.tensor("blk.0.attn_q.weight")  # weights of std 1/sqrt(fan_in), whatever the type
    w = dequantize(x.qtype, np.asarray(x.data), x.shape)
    assert np.isfinite(w).all() and 0.6 < w.std() * np.sqrt(x.shape[1]) < 1.6


def test_zipf_routing_skews_expert_popularity(tmp_path, monkeypatch):
    from guild.engine import backends
    from guild.engine.session import GuildSession
    from guild.load import load

    rows = []
    routed = backends.Layout.routed_experts

    def spy(self, be, h, *a, **k):
        rows.append(np.array(h, copy=True))
        return routed(self, be, h, *a, **k)

    monkeypatch.setattr(backends.Layout, "routed_experts", spy)
    text = open(S.__file__.replace("synth.py", "tiny.py")).read()[:1500]
    bottom, corr = {}, {}
    for routing in ("uniform", "zipf"):
        r = write(tmp_path, "qwen3-30b-a3b", layers=1, routing=routing)
        lm = load(r["path"], progress=False, threads=2)
        rows.clear()
        GuildSession(lm.model, n_ctx=256, eos_ids=()).generate(lm.tokenizer.encode(text)[:200], 1)
        w = f32(lm.gguf.tensor("blk.0.ffn_gate_inp.weight"))
        top = np.argpartition(-(rows[0] @ w.T), 8, axis=1)[:, :8]
        counts = np.bincount(top.ravel(), minlength=w.shape[0])
        bottom[routing] = np.sort(counts)[: len(counts) // 2].sum() / counts.sum()
        norms = np.linalg.norm(w, axis=1)  # zipf: a wider router row is a more popular expert
        corr[routing] = np.corrcoef(np.argsort(np.argsort(norms)), np.argsort(np.argsort(counts)))[0, 1]
    assert corr["zipf"] > 0.4 and corr["zipf"] > corr["uniform"] + 0.3
    assert bottom["zipf"] < bottom["uniform"]
    q = S.zipf_targets(32, 8, 1.0)  # the law: capped head, then ∝ 1/rank, k picks per token
    assert q[0] == S.ZIPF_CAP and np.isclose(q.sum(), 8) and np.all(np.diff(q) <= 0)


def test_bad_flags_are_one_line_errors_and_json(tmp_path, capsys):
    out = tmp_path / "x.gguf"
    for kw, msg in [(dict(preset="qwen4"), "preset 'qwen4'"), (dict(layers=49), "--layers 49"),
                    (dict(type_name="Q9_K"), "--type Q9_K"), (dict(routing="zipf:x"), "--routing zipf:x"),
                    (dict(routing="pareto"), "--routing pareto"), (dict(scale=2.0), "--scale 2.0"),
                    (dict(quantizer="gptq"), "--quantizer gptq"), (dict(seed=-1), "--seed -1"),
                    (dict(preset="llama-8b", routing="zipf"), "has no experts")]:
        kw = {"preset": "qwen3-30b-a3b", **kw}
        with pytest.raises(BadFlagError, match=msg.replace(".", r"\.").replace("(", r"\(")):
            S.synth(kw.pop("preset"), out, **kw)
    assert not out.exists()
    r = subprocess.run([sys.executable, "-m", "guild.tools.synth", "qwen3-30b-a3b", "--type", "Q9_K", "-o",
                        str(out)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and r.stderr.startswith("error: --type Q9_K") and len(r.stderr.splitlines()) == 1
    assert S.main(["llama-8b", "--layers", "1", "--scale", "0.0625", "--context", "256", "--type", "Q8_0", "-o",
                   str(out), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert (d["path"], d["preset"], d["type"], d["bytes"]) == (str(out), "llama-8b", "Q8_0", out.stat().st_size)
    assert d["tensors"] == len(GGUFFile(out).tensors) and d["types"] == {"F32": 3, "Q8_0": 9}


class _FakeLlamaCpp:
    """llama_cpp's quantize API: records the source's types and 'quantizes' by copying."""

    LLAMA_FTYPE_MOSTLY_Q4_K_M = 15
    LLAMA_FTYPE_MOSTLY_IQ2_XS = 20

    def __init__(self):
        self.seen = None

    class _Params:
        ftype = nthread = allow_requantize = None

    def llama_model_quantize_default_params(self):
        return self._Params()

    def llama_model_quantize(self, src, dst, params):
        self.seen = (params.ftype, {t.qtype for t in GGUFFile(src.decode()).tensors.values()})
        shutil.copyfile(src.decode(), dst.decode())
        return 0


def test_llama_cpp_quantizer(tmp_path, monkeypatch):
    fake = _FakeLlamaCpp()
    monkeypatch.setattr(S, "llama_cpp_module", lambda: fake)
    out = tmp_path / "q.gguf"
    r = S.synth("qwen3-30b-a3b", out, layers=1, quantizer="llama.cpp", **SMALL)
    assert fake.seen == (15, {Q.F16, Q.F32}) and r["path"] == str(out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["q.gguf"]  # the F16 source is gone
    with pytest.raises(BadFlagError, match="importance matrix"):
        S.synth("qwen3-30b-a3b", out, layers=1, quantizer="llama.cpp", type_name="IQ2_XS", **SMALL)
    with pytest.raises(BadFlagError, match="not a llama.cpp file type"):
        S.synth("qwen3-30b-a3b", out, layers=1, quantizer="llama.cpp", type_name="Q4_K", **SMALL)
    monkeypatch.setattr(S, "llama_cpp_module", lambda: None)
    with pytest.raises(GuildError, match="llama_cpp module is not importable"):
        S.synth("qwen3-30b-a3b", out, layers=1, quantizer="llama.cpp", **SMALL)
