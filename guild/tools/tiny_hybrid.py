"""Tiny random hybrid Gated-DeltaNet MoE models for tests: qwen3next (Qwen3-Next) and qwen35moe (Qwen3.5-MoE),
with the tensor names and metadata keys llama.cpp's converter writes; weights seeded per tensor name as in
guild.tools.tiny."""

from __future__ import annotations

from os import PathLike
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.constants import GGML_QUANT_VERSION

from .tiny import _matrix, _norm, _rng, _write, copy_eh_proj, copy_emb_gain, copy_output, file_type, tiny_tokenizer_keys

HYBRID_ARCHS = ("qwen3next", "qwen35moe")


def hybrid_keys(w: GGUFWriter, arch: str, *, name: str, n_layers: int, nextn: bool, context: int, dim: int,
                ffn: int, n_heads: int, n_kv_heads: int, head_dim: int, n_experts: int, top_k: int,
                expert_ffn: int, shared_ffn: int, conv_kernel: int, ssm_k_heads: int, ssm_v_heads: int,
                ssm_head_dim: int, full_attention_interval: int, rope_dim: int, file_type: int) -> None:
    """The model keys of a hybrid file (block_count counts the MTP block when `nextn`)."""
    w.add_type("model")
    w.add_name(name)
    w.add_block_count(n_layers + int(nextn))
    if nextn:
        w.add_nextn_predict_layers(1)
    w.add_context_length(context)
    w.add_embedding_length(dim)
    w.add_feed_forward_length(ffn)
    w.add_head_count(n_heads)
    w.add_head_count_kv(n_kv_heads)
    w.add_rope_freq_base(10000000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_expert_count(n_experts)
    w.add_expert_used_count(top_k)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_expert_feed_forward_length(expert_ffn)
    w.add_expert_shared_feed_forward_length(shared_ffn)
    w.add_ssm_conv_kernel(conv_kernel)
    w.add_ssm_state_size(ssm_head_dim)
    w.add_ssm_group_count(ssm_k_heads)
    w.add_ssm_time_step_rank(ssm_v_heads)
    w.add_ssm_inner_size(ssm_head_dim * ssm_v_heads)
    w.add_full_attention_interval(full_attention_interval)
    w.add_rope_dimension_count(rope_dim)
    if arch == "qwen35moe":  # interleaved MRoPE sections (text positions make it plain NEOX rope)
        half = rope_dim // 2
        w.add_rope_dimension_sections([half - 2 * (half // 3), half // 3, half // 3, 0])
    w.add_file_type(int(file_type))
    w.add_quantization_version(GGML_QUANT_VERSION)


def hybrid_layer(matrix, norm, vec, seed: int, p: str, *, arch: str, attention: bool, mtp: bool, dim: int,
                 n_heads: int, n_kv_heads: int, head_dim: int, ssm_k_heads: int, ssm_v_heads: int,
                 ssm_head_dim: int, conv_kernel: int, n_experts: int, expert_ffn: int, shared_ffn: int,
                 legacy_ssm_in: bool = False, copy_bias: float = 0.0) -> None:
    """One hybrid block's tensors named p + ... through the writer's callbacks (see write_tiny_hybrid): gated
    attention when `attention` or `mtp` (which adds the nextn tensors; a copy model's eh_proj with `copy_bias`),
    else Gated DeltaNet; then the MoE with its shared expert. matrix(name, shape, gain=1.0, typ=...),
    norm(name, n), vec(name, values)."""
    nk, nv, dk = ssm_k_heads, ssm_v_heads, ssm_head_dim
    r = nv // nk
    conv_dim = 2 * nk * dk + nv * dk
    f32 = GGMLQuantizationType.F32
    norm(p + "attn_norm.weight", dim)
    if mtp:  # the MTP block's own tensors
        if copy_bias:
            vec(p + "nextn.eh_proj.weight", copy_eh_proj(seed, p + "nextn.eh_proj.weight", dim, copy_bias))
        else:
            matrix(p + "nextn.eh_proj.weight", (dim, 2 * dim))
        for n in ("enorm", "hnorm", "shared_head_norm"):
            norm(p + f"nextn.{n}.weight", dim)
    if attention or mtp:
        matrix(p + "attn_q.weight", (n_heads * head_dim * 2, dim))
        matrix(p + "attn_k.weight", (n_kv_heads * head_dim, dim))
        matrix(p + "attn_v.weight", (n_kv_heads * head_dim, dim))
        matrix(p + "attn_output.weight", (dim, n_heads * head_dim), gain=0.5)
        norm(p + "attn_q_norm.weight", head_dim)
        norm(p + "attn_k_norm.weight", head_dim)
    else:
        if legacy_ssm_in:  # rows [q dk, k dk, v r*dk, z r*dk] per key head
            matrix(p + "ssm_in.weight", (nk * (2 * dk + 2 * r * dk), dim))
        else:
            matrix(p + "attn_qkv.weight", (conv_dim, dim))
            matrix(p + "attn_gate.weight", (nv * dk, dim))
        if arch == "qwen3next":
            matrix(p + "ssm_ba.weight", (2 * nv, dim))
        else:
            matrix(p + "ssm_beta.weight", (nv, dim))
            matrix(p + "ssm_alpha.weight", (nv, dim))
        rng = _rng(seed, p + "ssm")
        # the converter squeezes conv1d [C, 1, K] to [C, K]; decays exp(g) mostly in 0.6..0.97 so that
        # the state carries information across many rows
        vec(p + "ssm_conv1d.weight", rng.standard_normal((conv_dim, conv_kernel)) / np.sqrt(conv_kernel))
        vec(p + "ssm_dt.bias", rng.normal(-1.0, 0.5, nv))
        vec(p + "ssm_a", -rng.uniform(0.05, 0.6, nv))
        norm(p + "ssm_norm.weight", dk)
        matrix(p + "ssm_out.weight", (dim, nv * dk), gain=0.5)
    norm(p + "post_attention_norm.weight", dim)
    matrix(p + "ffn_gate_inp.weight", (n_experts, dim), typ=f32)
    matrix(p + "ffn_gate_exps.weight", (n_experts, expert_ffn, dim))
    matrix(p + "ffn_up_exps.weight", (n_experts, expert_ffn, dim))
    matrix(p + "ffn_down_exps.weight", (n_experts, dim, expert_ffn), gain=0.5)
    matrix(p + "ffn_gate_inp_shexp.weight", (1, dim), typ=f32)  # HF Linear(dim, 1), not squeezed
    matrix(p + "ffn_gate_shexp.weight", (shared_ffn, dim))
    matrix(p + "ffn_up_shexp.weight", (shared_ffn, dim))
    matrix(p + "ffn_down_shexp.weight", (dim, shared_ffn), gain=0.5)


def write_tiny_hybrid(
    path: str | PathLike,
    arch: str = "qwen35moe",
    *,
    n_layers: int = 4,
    full_attention_interval: int = 4,
    dim: int = 64,
    n_heads: int = 4,
    n_kv_heads: int = 2,
    head_dim: int = 32,
    rotary_factor: float = 0.25,
    ffn: int = 128,
    n_experts: int = 8,
    top_k: int = 2,
    expert_ffn: int = 32,
    shared_ffn: int = 48,
    ssm_k_heads: int = 2,
    ssm_v_heads: int = 4,
    ssm_head_dim: int = 16,
    conv_kernel: int = 4,
    vocab: int = 320,
    qtype: str = "F32",
    context: int = 256,
    seed: int = 0,
    tied: bool = False,
    legacy_ssm_in: bool = False,
    copy_bias: float = 0.0,
    nextn: bool = False,
    mtp_copy_bias: float = 0.0,
) -> Path:
    """Write a tiny random hybrid model laid out as llama.cpp's converter writes it (conversion/qwen.py).

    Layer i is full attention iff (i + 1) % full_attention_interval == 0, else Gated DeltaNet. DeltaNet layers:
    `attn_qkv` [q | k | v] and `attn_gate` (z) rows, `ssm_conv1d` [C, K], `ssm_a` = -exp(A_log),
    `ssm_dt.bias`, `ssm_norm` (not +1-folded, the others are: our norms are drawn around 1 either way), `ssm_out`;
    qwen3next has `ssm_ba` ([b | a] per key-head group, value heads grouped by key head), qwen35moe
    `ssm_beta` / `ssm_alpha` (value heads tiled: head j belongs to key head j % n_k). `legacy_ssm_in` (qwen3next)
    writes the older single `ssm_in` ([q, k, v, z] per key-head group) instead of attn_qkv + attn_gate.
    `copy_bias` > 0 makes a copy model (guild.tools.tiny.copy_output); `mtp_copy_bias` > 0 gives its nextn block
    a copy head's eh_proj (copy_eh_proj).
    Attention layers: `attn_q` holds query and output gate interleaved per head ([q_h | gate_h] * H), QK-norm,
    partial NEOX rope over rotary_factor * head_dim dims. Every layer: routed experts + a shared expert gated by
    sigmoid(ffn_gate_inp_shexp . x); `post_attention_norm` before the FFN. `nextn` appends one MTP block
    (block n_layers: full attention + MoE + `nextn.{eh_proj,enorm,hnorm,shared_head_norm}`) and
    `nextn_predict_layers` = 1, as Qwen3.5 files that keep their MTP head have.
    """
    if arch not in HYBRID_ARCHS:
        raise ValueError(f"arch={arch!r}: expected one of {', '.join(HYBRID_ARCHS)}")
    if legacy_ssm_in and arch != "qwen3next":
        raise ValueError("legacy_ssm_in is a qwen3next layout")
    if ssm_v_heads % ssm_k_heads or n_heads % n_kv_heads:
        raise ValueError("value heads must be a multiple of key heads (and n_heads of n_kv_heads)")
    if not 0 < top_k <= n_experts:
        raise ValueError(f"top_k={top_k} not in 1..n_experts={n_experts}")
    qt = GGMLQuantizationType[qtype.upper()]
    rope_dim = int(head_dim * rotary_factor)
    nk, nv, dk = ssm_k_heads, ssm_v_heads, ssm_head_dim

    path = Path(path)
    w = GGUFWriter(path, arch)
    hybrid_keys(w, arch, name=f"guild tiny {arch} {n_experts}x{top_k} seed {seed}", n_layers=n_layers,
                nextn=nextn, context=context, dim=dim, ffn=ffn, n_heads=n_heads, n_kv_heads=n_kv_heads,
                head_dim=head_dim, n_experts=n_experts, top_k=top_k, expert_ffn=expert_ffn, shared_ffn=shared_ffn,
                conv_kernel=conv_kernel, ssm_k_heads=nk, ssm_v_heads=nv, ssm_head_dim=dk,
                full_attention_interval=full_attention_interval, rope_dim=rope_dim, file_type=file_type(qt.name))
    tiny_tokenizer_keys(w, vocab)

    def matrix(name: str, shape: tuple[int, ...], gain: float = 1.0, typ=qt) -> None:
        arr = _matrix(seed, name, shape, gain / np.sqrt(shape[-1]), typ)
        w.add_tensor(name, arr, raw_dtype=None if arr.dtype != np.uint8 else typ)

    def norm(name: str, n: int) -> None:
        w.add_tensor(name, _norm(seed, name, n))

    def vec(name: str, values: np.ndarray) -> None:
        w.add_tensor(name, np.ascontiguousarray(values, np.float32))

    matrix("token_embd.weight", (vocab, dim), gain=copy_emb_gain(copy_bias))
    for i in range(n_layers + int(nextn)):
        hybrid_layer(matrix, norm, vec, seed, f"blk.{i}.", arch=arch, mtp=i >= n_layers,
                     attention=(i + 1) % full_attention_interval == 0, dim=dim, n_heads=n_heads,
                     n_kv_heads=n_kv_heads, head_dim=head_dim, ssm_k_heads=nk, ssm_v_heads=nv, ssm_head_dim=dk,
                     conv_kernel=conv_kernel, n_experts=n_experts, expert_ffn=expert_ffn, shared_ffn=shared_ffn,
                     legacy_ssm_in=legacy_ssm_in, copy_bias=mtp_copy_bias)
    norm("output_norm.weight", dim)
    if copy_bias:
        if tied:
            raise ValueError("copy_bias needs an untied output matrix")
        w.add_tensor("output.weight", copy_output(seed, vocab, dim, copy_bias, qt))
    elif not tied:
        matrix("output.weight", (vocab, dim), gain=2.0)

    return _write(w, path)
