"""A float64 reference forward built from guild.kernels.ref on dequantised weights (gguf.quants).

Independent of guild.models: it reads tensor names and hyper-parameters itself. Slow, for tests only.
"""

from __future__ import annotations

import numpy as np
from gguf.quants import dequantize

from guild.gguf import GGUFFile
from guild.kernels import ref


def _w(g: GGUFFile, name: str) -> np.ndarray:
    t = g.tensors[name]
    return dequantize(np.asarray(t.data), t.qtype).reshape(t.shape).astype(np.float64)


def reference_forward(path: str, tokens) -> np.ndarray:
    """Logits [T, vocab] (float64) for tokens at positions 0..T-1."""
    g = GGUFFile(path)
    a = g.architecture
    md = g.metadata
    n_layers = md[f"{a}.block_count"]
    dim = md[f"{a}.embedding_length"]
    H = md[f"{a}.attention.head_count"]
    Hkv = md.get(f"{a}.attention.head_count_kv", H)
    hd = md.get(f"{a}.attention.key_length", dim // H)
    eps = md[f"{a}.attention.layer_norm_rms_epsilon"]
    base = md.get(f"{a}.rope.freq_base", 10000.0)
    n_rot = md.get(f"{a}.rope.dimension_count", hd)
    neox = a in ("qwen3", "qwen3moe")
    E = md.get(f"{a}.expert_count", 0)
    k_used = md.get(f"{a}.expert_used_count", 0)
    tokens = np.asarray(tokens)
    T = tokens.size
    cos, sin = ref.rope_tables(T, n_rot, base)
    pos = np.arange(T)
    x = _w(g, "token_embd.weight")[tokens]
    for i in range(n_layers):
        p = f"blk.{i}."
        h = ref.rmsnorm(x, _w(g, p + "attn_norm.weight"), eps).astype(np.float64)
        q = (h @ _w(g, p + "attn_q.weight").T).reshape(T, H, hd)
        k = (h @ _w(g, p + "attn_k.weight").T).reshape(T, Hkv, hd)
        v = (h @ _w(g, p + "attn_v.weight").T).reshape(T, Hkv, hd)
        if p + "attn_q_norm.weight" in g.tensors:
            q = ref.rmsnorm(q, _w(g, p + "attn_q_norm.weight"), eps)
            k = ref.rmsnorm(k, _w(g, p + "attn_k_norm.weight"), eps)
        q = ref.rope(q, pos, cos, sin, n_rot, neox)
        k = ref.rope(k, pos, cos, sin, n_rot, neox)
        att = ref.attention(q, k, v, 0, 1.0 / np.sqrt(hd)).astype(np.float64)
        x = x + att.reshape(T, H * hd) @ _w(g, p + "attn_output.weight").T
        h = ref.rmsnorm(x, _w(g, p + "ffn_norm.weight"), eps)
        if E:
            ffn = ref.moe_ffn(
                h, _w(g, p + "ffn_gate_inp.weight"), _w(g, p + "ffn_gate_exps.weight"),
                _w(g, p + "ffn_up_exps.weight"), _w(g, p + "ffn_down_exps.weight"), k_used, True,
            )
        else:
            a_ = ref.silu_mul(h @ _w(g, p + "ffn_gate.weight").T, h @ _w(g, p + "ffn_up.weight").T)
            ffn = a_.astype(np.float64) @ _w(g, p + "ffn_down.weight").T
        x = x + ffn
    h = ref.rmsnorm(x, _w(g, "output_norm.weight"), eps).astype(np.float64)
    out = _w(g, "output.weight") if "output.weight" in g.tensors else _w(g, "token_embd.weight")
    return h @ out.T
