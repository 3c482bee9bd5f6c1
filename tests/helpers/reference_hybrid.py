"""A float64 reference forward of the hybrid Gated-DeltaNet MoE architectures (qwen3next, qwen35moe), built from
guild.kernels.ref on weights dequantised by gguf.quants.

Independent of guild.models: it reads the tensor names, the layouts (qkvz / ba groupings, grouped vs tiled
value heads) and the hyper-parameters itself. Slow, for tests only.
"""

from __future__ import annotations

import numpy as np

from guild.formats.gguf import GGUFFile
from guild.kernels import ref
from guild.kernels.cpu.quant import numerics_for
from guild.kernels.quant_types import act_block
from guild.kernels.rope import rope_tables

from .reference import _act, _mm, _w  # dequantised float64 weights and products, shared with the llama reference


def reference_hybrid_forward(path: str, tokens) -> np.ndarray:
    """Logits [T, vocab] (float64) for tokens at positions 0..T-1, from a zero state."""
    g = GGUFFile(path)
    a = g.architecture
    md = g.metadata
    n_layers = md[f"{a}.block_count"] - md.get(f"{a}.nextn_predict_layers", 0)
    dim = md[f"{a}.embedding_length"]
    H = md[f"{a}.attention.head_count"]
    Hkv = md[f"{a}.attention.head_count_kv"]
    hd = md.get(f"{a}.attention.key_length", dim // H)
    eps = md[f"{a}.attention.layer_norm_rms_epsilon"]
    n_rot = md[f"{a}.rope.dimension_count"]
    every = md.get(f"{a}.full_attention_interval", 4)
    k_used = md[f"{a}.expert_used_count"]
    nk, nv = md[f"{a}.ssm.group_count"], md[f"{a}.ssm.time_step_rank"]
    dk = md[f"{a}.ssm.state_size"]
    K = md[f"{a}.ssm.conv_kernel"]
    r = nv // nk
    kmap = np.arange(nv) % nk if a == "qwen35moe" else np.arange(nv) // r
    tokens = np.asarray(tokens)
    T = tokens.size
    cos, sin = rope_tables(T, n_rot, md[f"{a}.rope.freq_base"])
    x = _w(g, "token_embd.weight")[tokens]
    for i in range(n_layers):
        p = f"blk.{i}."
        h = ref.rmsnorm(x, _w(g, p + "attn_norm.weight"), eps).astype(np.float64)
        if (i + 1) % every:  # Gated DeltaNet
            if p + "ssm_in.weight" in g.tensors:
                qkvz = (_mm(g, p + "ssm_in.weight", h)).reshape(T, nk, 2 * dk + 2 * r * dk)
                q, k = qkvz[..., :dk].reshape(T, -1), qkvz[..., dk : 2 * dk].reshape(T, -1)
                v = qkvz[..., 2 * dk : (2 + r) * dk].reshape(T, -1)
                z = qkvz[..., (2 + r) * dk :].reshape(T, nv, dk)
                mixed = np.concatenate([q, k, v], axis=1)
            else:
                mixed = _mm(g, p + "attn_qkv.weight", h)
                z = (_mm(g, p + "attn_gate.weight", h)).reshape(T, nv, dk)
            if a == "qwen3next":
                ba = (_mm(g, p + "ssm_ba.weight", h)).reshape(T, nk, 2 * r)
                b, alpha = ba[..., :r].reshape(T, nv), ba[..., r:].reshape(T, nv)
            else:
                b, alpha = _mm(g, p + "ssm_beta.weight", h), _mm(g, p + "ssm_alpha.weight", h)
            conv_w = _w(g, p + "ssm_conv1d.weight").reshape(-1, K)  # [C, K]
            c = ref.conv1d_silu(mixed, np.zeros((K - 1, mixed.shape[1])), conv_w.T)
            q = ref.l2norm_heads(c[:, : nk * dk].reshape(T, nk, dk), 1e-6)
            k = ref.l2norm_heads(c[:, nk * dk : 2 * nk * dk].reshape(T, nk, dk), 1e-6)
            v = c[:, 2 * nk * dk :].reshape(T, nv, dk)
            gd, beta = ref.gdn_gates(alpha, b, _w(g, p + "ssm_dt.bias"), _w(g, p + "ssm_a"))
            core, _ = ref.gdn_recurrence(q, k, v, gd, beta, kmap, 1.0 / np.sqrt(dk), np.zeros((nv, dk, dk)))
            y = ref.gated_rmsnorm(core, z, _w(g, p + "ssm_norm.weight"), eps).astype(np.float64)
            mix = _mm(g, p + "ssm_out.weight", y.reshape(T, nv * dk))
        else:  # gated full attention
            qg = (_mm(g, p + "attn_q.weight", h)).reshape(T, H, 2 * hd)
            q, gate = qg[..., :hd], qg[..., hd:].reshape(T, H * hd)
            k = (_mm(g, p + "attn_k.weight", h)).reshape(T, Hkv, hd)
            v = (_mm(g, p + "attn_v.weight", h)).reshape(T, Hkv, hd)
            q = ref.rmsnorm(q, _w(g, p + "attn_q_norm.weight"), eps)
            k = ref.rmsnorm(k, _w(g, p + "attn_k_norm.weight"), eps)
            q = ref.rope(q, np.arange(T), cos, sin, n_rot, True)
            k = ref.rope(k, np.arange(T), cos, sin, n_rot, True)
            att = ref.attention(q, k, v, 0, 1.0 / np.sqrt(hd)).reshape(T, H * hd)
            mix = _mm(g, p + "attn_output.weight", ref.sigmoid_mul(att, gate))
        x = x + mix
        h = ref.rmsnorm(x, _w(g, p + "post_attention_norm.weight"), eps).astype(np.float64)
        q8 = numerics_for(g.tensors[p + "ffn_down_exps.weight"].qtype) == "i8"
        acts = (act_block(g.tensors[p + "ffn_gate_exps.weight"].qtype),
                act_block(g.tensors[p + "ffn_down_exps.weight"].qtype)) if q8 else None
        moe = ref.moe_ffn(h, _w(g, p + "ffn_gate_inp.weight"), _w(g, p + "ffn_gate_exps.weight"),
                          _w(g, p + "ffn_up_exps.weight"), _w(g, p + "ffn_down_exps.weight"), k_used, True, acts=acts)
        act = ref.silu_mul(_mm(g, p + "ffn_gate_shexp.weight", h), _mm(g, p + "ffn_up_shexp.weight", h))
        shared = _mm(g, p + "ffn_down_shexp.weight", act)
        gate = _act(g, p + "ffn_gate_inp_shexp.weight", h) @ _w(g, p + "ffn_gate_inp_shexp.weight").reshape(1, dim).T
        x = x + moe + ref.sigmoid_mul(shared, gate)
    h = ref.rmsnorm(x, _w(g, "output_norm.weight"), eps).astype(np.float64)
    return _mm(g, "output.weight" if "output.weight" in g.tensors else "token_embd.weight", h)
