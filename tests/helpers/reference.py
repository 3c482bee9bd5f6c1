"""A float64 reference forward built from guild.kernels.ref on dequantised weights (gguf.quants).

Independent of guild.models: it reads tensor names and hyper-parameters itself. Slow, for tests only.
Numerics: under "i8" (the default, kernels/cpu/quant.py) the inputs of products with weights of an int8-path
type are quantised as the kernels quantise them (ref.quantize_act_q8); under "f32" they are used as they are.
"""

from __future__ import annotations

import numpy as np
from gguf.quants import dequantize

from guild.formats.gguf import GGUFFile
from guild.kernels import ref
from guild.kernels.cpu.quant import numerics_for
from guild.kernels.quant_types import act_block
from guild.kernels.rope import rope_tables


def _w(g: GGUFFile, name: str) -> np.ndarray:
    t = g.tensors[name]
    return dequantize(np.asarray(t.data), t.qtype).reshape(t.shape).astype(np.float64)


def _act(g: GGUFFile, name: str, h: np.ndarray) -> np.ndarray:
    """h as the kernels see it when multiplying by tensor `name`."""
    if numerics_for(g.tensors[name].qtype) == "i8":
        return ref.quantize_act_q8(np.asarray(h, np.float32), act_block(g.tensors[name].qtype))
    return np.asarray(h, np.float64)


def _mm(g: GGUFFile, name: str, h: np.ndarray) -> np.ndarray:
    return _act(g, name, h) @ _w(g, name).T


def _layer(g: GGUFFile, p: str, x: np.ndarray, c: dict, cos, sin) -> np.ndarray:
    """One decoder layer (tensors named p + ...) over rows x [T, dim] at positions 0..T-1, causal."""
    T, H, Hkv, hd, eps = x.shape[0], c["H"], c["Hkv"], c["hd"], c["eps"]
    pos = np.arange(T)
    h = ref.rmsnorm(x, _w(g, p + "attn_norm.weight"), eps).astype(np.float64)
    q = _mm(g, p + "attn_q.weight", h).reshape(T, H, hd)
    k = _mm(g, p + "attn_k.weight", h).reshape(T, Hkv, hd)
    v = _mm(g, p + "attn_v.weight", h).reshape(T, Hkv, hd)
    if p + "attn_q_norm.weight" in g.tensors:
        q = ref.rmsnorm(q, _w(g, p + "attn_q_norm.weight"), eps)
        k = ref.rmsnorm(k, _w(g, p + "attn_k_norm.weight"), eps)
    q = ref.rope(q, pos, cos, sin, c["n_rot"], c["neox"])
    k = ref.rope(k, pos, cos, sin, c["n_rot"], c["neox"])
    att = ref.attention(q, k, v, 0, 1.0 / np.sqrt(hd)).astype(np.float64)
    x = x + _mm(g, p + "attn_output.weight", att.reshape(T, H * hd))
    h = ref.rmsnorm(x, _w(g, p + "ffn_norm.weight"), eps)
    if p + "ffn_gate_inp.weight" in g.tensors:
        q8 = numerics_for(g.tensors[p + "ffn_down_exps.weight"].qtype) == "i8"
        acts = (act_block(g.tensors[p + "ffn_gate_exps.weight"].qtype),
                act_block(g.tensors[p + "ffn_down_exps.weight"].qtype)) if q8 else None
        ffn = ref.moe_ffn(
            h, _w(g, p + "ffn_gate_inp.weight"), _w(g, p + "ffn_gate_exps.weight"),
            _w(g, p + "ffn_up_exps.weight"), _w(g, p + "ffn_down_exps.weight"), c["k_used"], True, acts=acts,
        )
    else:
        a_ = ref.silu_mul(_mm(g, p + "ffn_gate.weight", h), _mm(g, p + "ffn_up.weight", h))
        ffn = _mm(g, p + "ffn_down.weight", a_)
    return x + ffn


def _config(g: GGUFFile, T: int):
    a, md = g.architecture, g.metadata
    dim = md[f"{a}.embedding_length"]
    H = md[f"{a}.attention.head_count"]
    hd = md.get(f"{a}.attention.key_length", dim // H)
    n_rot = md.get(f"{a}.rope.dimension_count", hd)
    c = dict(H=H, Hkv=md.get(f"{a}.attention.head_count_kv", H), hd=hd, eps=md[f"{a}.attention.layer_norm_rms_epsilon"],
             n_rot=n_rot, neox=a in ("qwen3", "qwen3moe"), k_used=md.get(f"{a}.expert_used_count", 0))
    return c, *rope_tables(T, n_rot, md.get(f"{a}.rope.freq_base", 10000.0))


def reference_hidden(path: str, tokens, layers: tuple[int, ...] = ()):
    """The model's final hidden rows after its output norm [T, dim] (float64): what an MTP head reads; with
    `layers`, also those layers' output rows (a list, the rows a fusing head reads)."""
    g = GGUFFile(path)
    tokens = np.asarray(tokens)
    c, cos, sin = _config(g, tokens.size)
    x = _w(g, "token_embd.weight")[tokens]
    feats = []
    for i in range(g.metadata[f"{g.architecture}.block_count"]):
        x = _layer(g, f"blk.{i}.", x, c, cos, sin)
        if i in layers:
            feats.append(x)
    h = ref.rmsnorm(x, _w(g, "output_norm.weight"), c["eps"]).astype(np.float64)
    return (h, feats) if layers else h


def reference_fused_hidden(path: str, head_path: str, tokens) -> np.ndarray:
    """The hidden a fusing head reads (EAGLE-3): its fc over [normed final hidden ; RMS-normed rows of its
    feature layers] [T, dim] (float64)."""
    hg = GGUFFile(head_path)
    layers = tuple(int(v) for v in hg.metadata["guild.mtp.feature_layers"])
    h, feats = reference_hidden(path, tokens, layers)
    eps = _config(GGUFFile(path), 1)[0]["eps"]
    parts = [h, *(ref.rmsnorm(f, np.ones(f.shape[1]), eps).astype(np.float64) for f in feats)]
    return _mm(hg, "blk.0.nextn.fc.weight", np.concatenate(parts, axis=1))


def reference_mtp(base_path: str, head_path: str, tokens, hidden) -> np.ndarray:
    """MTP head logits [T, vocab] (float64) for rows at positions 0..T-1 with inputs (hidden_p, tokens_p =
    x_{p+1}) (DeepSeek-V3 §2.2): Block(eh_proj([enorm(emb x) ; hnorm h])) -> shared_head_norm -> LM head."""
    g, hg = GGUFFile(base_path), GGUFFile(head_path)
    tokens = np.asarray(tokens)
    c, cos, sin = _config(g, tokens.size)
    eps, n = c["eps"], "blk.0.nextn."
    e = ref.rmsnorm(_w(g, "token_embd.weight")[tokens], _w(hg, n + "enorm.weight"), eps)
    h = ref.rmsnorm(np.asarray(hidden, np.float64), _w(hg, n + "hnorm.weight"), eps)
    x = _mm(hg, n + "eh_proj.weight", np.concatenate([e, h], axis=1))
    x = _layer(hg, "blk.0.", x, c, cos, sin)
    y = ref.rmsnorm(x, _w(hg, n + "shared_head_norm.weight"), eps).astype(np.float64)
    return _mm(g, "output.weight" if "output.weight" in g.tensors else "token_embd.weight", y)


def reference_forward(path: str, tokens) -> np.ndarray:
    """Logits [T, vocab] (float64) for tokens at positions 0..T-1."""
    g = GGUFFile(path)
    h = reference_hidden(path, tokens)
    return _mm(g, "output.weight" if "output.weight" in g.tensors else "token_embd.weight", h)
