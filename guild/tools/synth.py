"""Synthetic GGUFs at published model shapes, for measuring guild at the sizes users run (the weights of those
models cannot be downloaded here): real tensor names, metadata keys and tokenizer, random valid weights.

    python -m guild.tools.synth qwen3-30b-a3b --layers 4 --type Q4_K_M -o q30b.gguf --json

Presets (PRESETS) carry the published dimensions; every preset uses the embedded SmolLM2 tokenizer (49152
tokens), so token_embd/output are [49152, hidden] instead of the real vocabulary. The tensors are those of
guild.tools.tiny (llama, qwen3moe) and guild.tools.tiny_hybrid (qwen35moe), written by the same layer functions.

Options: --layers N writes the first N blocks (default 2, 4 for qwen3.5 so that one full-attention layer is in;
the preset's count is the most). --scale F (tests) multiplies the hidden size, FFN sizes, head counts, DeltaNet
heads and the expert count by F: widths rounded up to a multiple of 256 (the K-quant block), at least one head
(the query/KV ratio kept), at least 4 x top-k experts; head sizes, top-k and the vocabulary are kept.
--context N (default: the preset's published context) sets context_length.

Types (--type): a ggml type (Q8_0, Q4_K, Q6_K, Q2_K, Q3_K, IQ4_XS, MXFP4, F16, ...) puts every matrix in that
type, as llama.cpp's --pure does. A mixture picks per tensor as llama.cpp's quantizer does (llama_tensor_get_type
in src/llama-quant.cpp, for the tensors these layouts have and more than 8 experts):

* Q4_K_M (Q5_K_M): Q4_K (Q5_K) everywhere except output.weight, Q6_K, and, in the blocks i where
  use_more_bits(i, n) holds, attn_v (and DeltaNet's attn_qkv, which llama.cpp counts with attn_v) and every
  ffn_down tensor (dense, experts, shared expert), Q6_K. use_more_bits(i, n) = i < n/8 or i >= 7n/8 or
  (i - n/8) % 3 == 2 (integer division), n the file's block count: blocks 0, 3, 6, 7 of 8; of 48: 0-5, 8, 11,
  ..., 41 and 42-47. (llama.cpp counts attn_v/attn_qkv tensors in block order; each block has one, so the
  count is the block index.)
* Q3_K_M: Q3_K everywhere except output.weight, Q6_K; attn_v (and attn_qkv) Q5_K in blocks 0 and 1, Q4_K after;
  attn_output Q4_K; every ffn_down tensor Q5_K in the blocks i < n/16, Q4_K after.
* MXFP4_MOE: the expert tensors MXFP4, every other matrix Q8_0.

Routers (ffn_gate_inp*), norms and DeltaNet's conv and decay vectors stay F32, as llama.cpp leaves them.

Weights: random valid blocks (kernels/ref_quant.random_raw) whose f16 scales (MXFP4: the shared exponent) are set
so that a matrix's weights have a std of gain/sqrt(fan_in), as guild.tools.tiny draws them: activations stay O(1)
through any depth. Each tensor is generated and written in chunks of rows (at most CHUNK_BYTES, seeded per seed,
tensor name and chunk), so memory stays bounded whatever the model's size (a 48-layer Q4_K_M qwen3-30b-a3b is
~18 GB with this vocabulary), and the same arguments give the same bytes.

--quantizer llama.cpp (needs the llama_cpp module): the model is written in F16 first (same weight std), then
quantised by llama_cpp.llama_model_quantize into --type, a llama.cpp file type (LLAMA_FTYPE_MOSTLY_<TYPE>:
Q4_K_M, Q6_K, IQ4_XS, MXFP4_MOE, ...). The types whose tensors need an importance matrix (IQ1_*, IQ2_*, IQ3_XXS,
Q2_K_S) are refused: there is none for random weights.

Routing (--routing): the router's input is the RMS-normalised hidden state, whose direction in a random model
varies from token to token while its length stays ~sqrt(hidden): a router row's logits are close to independent
normals with a std proportional to the row's norm. `uniform`: every row N(0, 1/hidden), so every expert is
equally likely. `zipf[:s]` (s > 0, default 1): row e is scaled by sigma_e, and a wider logit lands in the top-k
more often. sigma is fitted at write time on simulated normal logits (zipf_scales) so that the expert of
popularity rank r is among a token's top-k with a probability proportional to r^-s, capped at ZIPF_CAP: a
zero-mean logit beats the other experts' k-th largest at most half the time however wide it is (there is no
router bias in these architectures), so the head of the law is flattened at the cap and the rest of the k picks
spread over the other ranks by the same law. Each layer ranks the experts by its own seeded permutation.
The hidden states of a random model also share a component across tokens (attention averages over the
context), which acts as a random per-expert bias: it skews even uniform routing and blurs the law (on a scaled
qwen3-30b-a3b the rank correlation between row width and measured popularity is ~0.5-0.7).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import zlib
from collections import Counter
from dataclasses import dataclass, replace
from functools import cache, lru_cache
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import GGUFValueType, GGUFWriter
from gguf.constants import GGML_QUANT_SIZES

from ..bench.runners import llama_cpp_module, quantize
from ..errors import BadFlagError, GuildError
from ..formats.files import atomic_path, check_writable, temp_beside
from ..formats.gguf import SUPPORTED_QTYPES, GGUFFile
from ..kernels.ref_quant import dequantize, random_raw
from ..upcycle import _progress_bar, embedded_dense_path
from .tiny import _layer, _norm, file_type, llama_keys
from .tiny_hybrid import hybrid_keys, hybrid_layer


@dataclass(frozen=True)
class Preset:
    """A model's published shape. doc: where the numbers come from, and the values chosen where none is
    published."""

    arch: str
    n_layers: int
    dim: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn: int  # feed_forward_length (the dense FFN; MoE files carry it too)
    context: int
    rope_base: float
    eps: float
    n_experts: int = 0
    top_k: int = 0
    expert_ffn: int = 0
    shared_ffn: int = 0
    ssm_k_heads: int = 0
    ssm_v_heads: int = 0
    ssm_head_dim: int = 0
    conv_kernel: int = 0
    full_attention_interval: int = 0
    rotary_factor: float = 1.0
    doc: str = ""


PRESETS = {
    "qwen3-30b-a3b": Preset(
        "qwen3moe", 48, 2048, 32, 4, 128, 6144, 40960, 1e6, 1e-6, n_experts=128, top_k=8, expert_ffn=768,
        doc="Qwen3-30B-A3B (config.json): 48 layers, hidden 2048, 32 query / 4 KV heads of 128, 128 experts "
            "top-8 of FFN 768, intermediate 6144, rope theta 1e6, 40960 positions."),
    "qwen3-235b-a22b": Preset(
        "qwen3moe", 94, 4096, 64, 4, 128, 12288, 40960, 1e6, 1e-6, n_experts=128, top_k=8, expert_ffn=1536,
        doc="Qwen3-235B-A22B (config.json): 94 layers, hidden 4096, 64 query / 4 KV heads of 128, 128 experts "
            "top-8 of FFN 1536, intermediate 12288, rope theta 1e6, 40960 positions."),
    "qwen3.5-35b-a3b": Preset(
        "qwen35moe", 40, 2048, 16, 2, 256, 5120, 262144, 1e7, 1e-6, n_experts=256, top_k=8, expert_ffn=512,
        shared_ffn=512, ssm_k_heads=16, ssm_v_heads=32, ssm_head_dim=128, conv_kernel=4,
        full_attention_interval=4, rotary_factor=0.25,
        doc="Qwen3.5-35B-A3B: 40 layers, three of every four Gated DeltaNet, 256 experts top-8 plus the shared "
            "expert. The rest follows the Qwen3-Next block these models share (published for Qwen3-Next-80B-A3B) "
            "and is chosen here where no Qwen3.5 number was at hand: hidden 2048, 16 query / 2 KV heads of 256 "
            "(rope on a quarter of each), DeltaNet 16 key / 32 value heads of 128 with a width-4 convolution, "
            "expert and shared-expert FFN 512, feed_forward_length 5120 (unused by the hybrid block), rope "
            "theta 1e7, 262144 positions."),
    "llama-8b": Preset(
        "llama", 32, 4096, 32, 8, 128, 14336, 131072, 500000.0, 1e-5,
        doc="Llama-3.1-8B (config.json): 32 layers, hidden 4096, 32 query / 8 KV heads of 128, FFN 14336, rope "
            "theta 500000 (written without llama3 rope scaling), 131072 positions."),
}

MIXTURES = {"Q3_K_M": Q.Q3_K, "Q4_K_M": Q.Q4_K, "Q5_K_M": Q.Q5_K, "MXFP4_MOE": Q.MXFP4}
# llama.cpp file types whose tensors (some of them) need an importance matrix (tensor_requires_imatrix)
NEEDS_IMATRIX = ("IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M", "IQ3_XXS", "Q2_K_S")
TOKEN_EMBD_GAIN = 2.0  # as guild.tools.tiny: logits with a std of ~2
CHUNK_BYTES = 32 << 20
ZIPF_CAP = 0.4
WIDTH = 256  # --scale rounds widths up to a multiple of this (the K-quant block)


def _use_more_bits(i: int, n: int) -> bool:
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


class TypeRule:
    """The ggml type of each quantised matrix: `name` a ggml type (every matrix) or a MIXTURES name."""

    def __init__(self, name: str, n_layers: int):
        self.name, self.n_layers = name, n_layers
        self.base = MIXTURES.get(name) or Q[name]

    def __call__(self, tensor: str, shape: tuple[int, ...]) -> Q:
        if self.name not in MIXTURES:
            return self.base
        if self.name == "MXFP4_MOE":
            return Q.MXFP4 if len(shape) == 3 else Q.Q8_0
        if tensor == "output.weight":
            return Q.Q6_K
        if not tensor.startswith("blk."):
            return self.base
        i, v = int(tensor.split(".")[1]), ".attn_v." in tensor or ".attn_qkv." in tensor
        if self.name == "Q3_K_M":
            if v:
                return Q.Q5_K if i < 2 else Q.Q4_K
            if ".ffn_down" in tensor:
                return Q.Q5_K if i < self.n_layers // 16 else Q.Q4_K
            return Q.Q4_K if ".attn_output." in tensor else self.base
        if (v or ".ffn_down" in tensor) and _use_more_bits(i, self.n_layers):
            return Q.Q6_K
        return self.base


def type_names() -> list[str]:
    """What --type accepts with the random-block writer."""
    return sorted(q.name for q in SUPPORTED_QTYPES) + list(MIXTURES)


# -- routing --------------------------------------------------------------------------------------------
def parse_routing(text: str) -> float:
    """--routing → the Zipf exponent (0 = uniform)."""
    kind, _, arg = text.partition(":")
    if kind == "uniform" and not arg:
        return 0.0
    if kind == "zipf":
        try:
            s = float(arg) if arg else 1.0
        except ValueError:
            s = float("nan")
        if math.isfinite(s) and 0 < s <= 10:
            return s
        raise BadFlagError(f"--routing {text}: the Zipf exponent must be a number in (0, 10]")
    raise BadFlagError(f"--routing {text}: expected uniform or zipf[:s]")


def zipf_targets(n_experts: int, top_k: int, s: float, cap: float = ZIPF_CAP) -> np.ndarray:
    """P(the expert of rank r is among a token's top-k) ∝ r^-s, capped at `cap`, summing to top_k."""
    w = np.arange(1, n_experts + 1, dtype=np.float64) ** -s
    lo, hi = 0.0, top_k / w[-1]
    for _ in range(100):  # bisection on the scale c of min(cap, c w)
        c = (lo + hi) / 2
        lo, hi = (c, hi) if np.minimum(cap, c * w).sum() < top_k else (lo, c)
    return np.minimum(cap, hi * w)


def _topk_freq(z: np.ndarray, sigma: np.ndarray, k: int) -> np.ndarray:
    top = np.argpartition(z * sigma.astype(np.float32), -k, axis=1)[:, -k:]
    return np.bincount(top.ravel(), minlength=z.shape[1]) / z.shape[0]


@lru_cache(maxsize=8)
def zipf_scales(n_experts: int, top_k: int, s: float, samples: int = 4096, iters: int = 150) -> np.ndarray:
    """Router row scales by popularity rank (median 1) whose normal logits pick rank r with zipf_targets'
    probability: damped fixed-point steps in log space on `samples` simulated tokens (fixed seed)."""
    if n_experts * ZIPF_CAP < top_k:
        raise BadFlagError(f"--routing zipf: {n_experts} experts cannot give a top-{top_k} law capped at "
                           f"{ZIPF_CAP} per expert; use uniform routing")
    q = zipf_targets(n_experts, top_k, s)
    z = np.random.default_rng(0).standard_normal((samples, n_experts), dtype=np.float32)
    log_s = np.zeros(n_experts)
    for _ in range(iters):
        f = _topk_freq(z, np.exp(log_s), top_k)
        log_s += 0.2 * (np.log(q) - np.log(np.maximum(f, 0.25 / samples)))  # larger steps oscillate
        log_s -= np.median(log_s)
    return np.exp(log_s)


# -- the weights ----------------------------------------------------------------------------------------
def _rng(seed: int, name: str, chunk: int) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(name.encode()), chunk])


@cache
def _unit_std(qt: Q) -> float:
    """Std of random_raw's weights at scale 1 (MXFP4: at its own exponents)."""
    raw = random_raw(qt, 16, 1024, np.random.default_rng(0), 1.0)
    return float(dequantize(qt, raw, (16, 1024)).std())


def _rows(qt: Q, n_rows: int, n_cols: int, std: float, rng: np.random.Generator) -> np.ndarray:
    """n_rows random rows of `qt` whose weights have a std of ~`std`, as raw bytes (floats: their dtype)."""
    if qt in (Q.F32, Q.F16, Q.BF16):
        x = rng.standard_normal((n_rows, n_cols), dtype=np.float32) * np.float32(std)
        if qt == Q.BF16:
            return (x.view(np.uint32) >> 16).astype(np.uint16)
        return x.astype(np.float16) if qt == Q.F16 else x
    if qt == Q.MXFP4:  # random_raw fixes the exponents: shift them by the power of two nearest the std wanted
        raw = random_raw(qt, n_rows, n_cols, rng).reshape(n_rows, n_cols // 32, 17)
        shift = int(round(math.log2(std / _unit_std(qt))))
        raw[..., 0] = np.clip(raw[..., 0].astype(np.int32) + shift, 1, 254).astype(np.uint8)
        return raw.reshape(n_rows, -1)
    return random_raw(qt, n_rows, n_cols, rng, std / _unit_std(qt))


class _Chunked:
    """A tensor's bytes made chunk by chunk while they are written: GGUFWriter.write_tensor_data reads only
    .nbytes and calls .tofile, so the whole tensor is never in memory."""

    def __init__(self, nbytes: int, chunks):
        self.nbytes, self._chunks = nbytes, chunks

    def tofile(self, f) -> None:
        for a in self._chunks():
            a.tofile(f)


@dataclass
class _Entry:
    name: str
    shape: tuple[int, ...]  # numpy order
    qtype: Q
    data: object  # np.ndarray (small tensors) or _Chunked

    @property
    def layer(self) -> int:
        return int(self.name.split(".")[1]) if self.name.startswith("blk.") else -1


def _matrix_entry(seed: int, name: str, shape: tuple[int, ...], qt: Q, std: float,
                  row_scale: np.ndarray | None = None) -> _Entry:
    n_cols = shape[-1]
    n_rows = int(np.prod(shape[:-1]))
    block, type_size = GGML_QUANT_SIZES[qt]
    if n_cols % block:
        raise GuildError(f"{name}: row length {n_cols} is not a multiple of the {qt.name} block ({block})")
    row_bytes = n_cols // block * type_size
    step = max(1, CHUNK_BYTES // row_bytes)

    def chunks():
        for c, r0 in enumerate(range(0, n_rows, step)):
            rows = _rows(qt, min(step, n_rows - r0), n_cols, std, _rng(seed, name, c))
            if row_scale is not None:  # F32 router rows
                rows *= row_scale[r0 : r0 + rows.shape[0], None].astype(np.float32)
            yield rows

    return _Entry(name, shape, qt, _Chunked(n_rows * row_bytes, chunks))


def plan_tensors(p: Preset, rule: TypeRule, seed: int, zipf_s: float) -> list[_Entry]:
    """Every tensor of the file in order, each with its type and its data (matrices: made as they are written)."""
    entries: list[_Entry] = []

    def matrix(name: str, shape: tuple[int, ...], gain: float = 1.0, typ=None) -> None:
        std = gain / np.sqrt(shape[-1])
        if typ == Q.F32:  # routers
            scale = None
            if name.endswith("ffn_gate_inp.weight") and zipf_s:
                rank = _rng(seed, name + "#rank", 0).permutation(shape[0])  # rank[r]: this layer's r-th popular
                scale = zipf_scales(shape[0], p.top_k, zipf_s)[np.argsort(rank)]
            entries.append(_matrix_entry(seed, name, shape, Q.F32, std, scale))
        else:
            entries.append(_matrix_entry(seed, name, shape, rule(name, shape), std))

    def norm(name: str, n: int) -> None:
        entries.append(_Entry(name, (n,), Q.F32, _norm(seed, name, n)))

    def vec(name: str, values: np.ndarray) -> None:
        a = np.ascontiguousarray(values, np.float32)
        entries.append(_Entry(name, a.shape, Q.F32, a))

    vocab = tokenizer_vocab()
    matrix("token_embd.weight", (vocab, p.dim), gain=TOKEN_EMBD_GAIN)
    for i in range(p.n_layers):
        if p.arch == "qwen35moe":
            hybrid_layer(matrix, norm, vec, seed, f"blk.{i}.", arch=p.arch, mtp=False,
                         attention=(i + 1) % p.full_attention_interval == 0, dim=p.dim, n_heads=p.n_heads,
                         n_kv_heads=p.n_kv_heads, head_dim=p.head_dim, ssm_k_heads=p.ssm_k_heads,
                         ssm_v_heads=p.ssm_v_heads, ssm_head_dim=p.ssm_head_dim, conv_kernel=p.conv_kernel,
                         n_experts=p.n_experts, expert_ffn=p.expert_ffn, shared_ffn=p.shared_ffn)
        else:
            _layer(matrix, norm, f"blk.{i}.", p.dim, p.n_heads, p.n_kv_heads, p.head_dim, p.arch == "qwen3moe",
                   p.n_experts, p.expert_ffn if p.n_experts else p.ffn)
    norm("output_norm.weight", p.dim)
    matrix("output.weight", (vocab, p.dim), gain=TOKEN_EMBD_GAIN)
    return entries


# -- metadata -------------------------------------------------------------------------------------------
@lru_cache(maxsize=1)
def _tokenizer() -> tuple[tuple[str, object, GGUFValueType, GGUFValueType | None], ...]:
    """The embedded SmolLM2 model's tokenizer.* keys: (key, value, type, element type)."""
    g = GGUFFile(embedded_dense_path())
    out = []
    for k, v in g.metadata.items():
        if k.startswith("tokenizer."):
            t, sub = g.types[k]
            out.append((k, v, GGUFValueType(t), None if sub is None else GGUFValueType(sub)))
    return tuple(out)


def tokenizer_vocab() -> int:
    return next(len(v) for k, v, _, _ in _tokenizer() if k == "tokenizer.ggml.tokens")


def _write_keys(w: GGUFWriter, preset: str, p: Preset, type_name: str) -> None:
    name = f"guild synth {preset} {p.n_layers} layers {type_name}"
    ft = file_type(type_name)
    if p.arch == "qwen35moe":
        hybrid_keys(w, p.arch, name=name, n_layers=p.n_layers, nextn=False, context=p.context, dim=p.dim,
                    ffn=p.ffn, n_heads=p.n_heads, n_kv_heads=p.n_kv_heads, head_dim=p.head_dim,
                    n_experts=p.n_experts, top_k=p.top_k, expert_ffn=p.expert_ffn, shared_ffn=p.shared_ffn,
                    conv_kernel=p.conv_kernel, ssm_k_heads=p.ssm_k_heads, ssm_v_heads=p.ssm_v_heads,
                    ssm_head_dim=p.ssm_head_dim, full_attention_interval=p.full_attention_interval,
                    rope_dim=int(p.head_dim * p.rotary_factor), file_type=ft)
    else:
        llama_keys(w, p.arch, name=name, n_layers=p.n_layers, context=p.context, dim=p.dim, ffn=p.ffn,
                   n_heads=p.n_heads, n_kv_heads=p.n_kv_heads, head_dim=p.head_dim, n_experts=p.n_experts,
                   top_k=p.top_k, expert_ffn=p.expert_ffn, vocab=tokenizer_vocab(), file_type=ft,
                   rope_base=p.rope_base, eps=p.eps)
    for k, v, t, sub in _tokenizer():
        w.add_key_value(k, v, t, sub)


def _stream(path: Path, preset: str, p: Preset, type_name: str, entries: list[_Entry], progress: bool) -> None:
    """Header, metadata and tensor index, then each tensor's data as it is made."""
    w = GGUFWriter(path, p.arch)
    try:
        _write_keys(w, preset, p, type_name)
        for e in entries:
            block, type_size = GGML_QUANT_SIZES[e.qtype]
            byte_shape = (*e.shape[:-1], e.shape[-1] // block * type_size)
            w.add_tensor_info(e.name, byte_shape, np.dtype(np.uint8), e.data.nbytes, raw_dtype=e.qtype)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        with _progress_bar(progress, p.n_layers, f"writing {path.name}") as advance:
            for i, e in enumerate(entries):
                w.write_tensor_data(e.data)
                if e.layer >= 0 and (i + 1 == len(entries) or entries[i + 1].layer != e.layer):
                    advance()
        w.flush()
    finally:
        w.close()


# -- the command ----------------------------------------------------------------------------------------
def shape(preset: str, layers: int | None = None, scale: float = 1.0, context: int | None = None) -> Preset:
    """The preset's shape with --layers, --scale and --context applied (see the module docstring)."""
    if preset not in PRESETS:
        raise BadFlagError(f"preset {preset!r}: expected one of {', '.join(PRESETS)}")
    p = PRESETS[preset]
    default = p.full_attention_interval or 2
    layers = default if layers is None else layers
    if not 1 <= layers <= p.n_layers:
        raise BadFlagError(f"--layers {layers}: {preset} has 1..{p.n_layers}")
    if not (math.isfinite(scale) and 0 < scale <= 1):
        raise BadFlagError(f"--scale {scale}: expected a number in (0, 1]")
    if context is not None and not 16 <= context <= p.context:
        raise BadFlagError(f"--context {context}: expected 16..{p.context}")

    def width(n: int) -> int:
        return n and max(WIDTH, -(-round(n * scale) // WIDTH) * WIDTH)

    def heads(n: int, group: int) -> int:
        return n and max(1, round(n * scale)) * group

    kv = heads(p.n_kv_heads, 1)
    return replace(
        p, n_layers=layers, context=context or p.context, dim=width(p.dim), ffn=width(p.ffn),
        expert_ffn=width(p.expert_ffn), shared_ffn=width(p.shared_ffn),
        n_kv_heads=kv, n_heads=kv * (p.n_heads // p.n_kv_heads),
        ssm_k_heads=heads(p.ssm_k_heads, 1), ssm_v_heads=heads(p.ssm_k_heads, p.ssm_v_heads // max(1, p.ssm_k_heads)),
        n_experts=p.n_experts and min(p.n_experts, max(4 * p.top_k, round(p.n_experts * scale))))


def synth(preset: str, out: str | os.PathLike, *, layers: int | None = None, type_name: str = "Q4_K_M",
          quantizer: str = "random", routing: str = "uniform", seed: int = 0, scale: float = 1.0,
          context: int | None = None, progress: bool = False) -> dict:
    """Write the synthetic model to `out`; returns what was written (path, bytes, tensors, per-type counts).
    Every flag is checked before anything is written."""
    p = shape(preset, layers, scale, context)
    zipf_s = parse_routing(routing)
    if zipf_s and not p.n_experts:
        raise BadFlagError(f"--routing {routing}: {preset} has no experts")
    if seed < 0:
        raise BadFlagError(f"--seed {seed}: expected a non-negative integer")
    if quantizer == "random":
        if type_name not in type_names():
            raise BadFlagError(f"--type {type_name}: expected one of {', '.join(type_names())}")
        llama_cpp = None
    elif quantizer == "llama.cpp":
        llama_cpp = _llama_cpp_for(type_name)
    else:
        raise BadFlagError(f"--quantizer {quantizer}: expected random or llama.cpp")
    out = check_writable(out, "-o/--out", BadFlagError)
    entries = plan_tensors(p, TypeRule(type_name if llama_cpp is None else "F16", p.n_layers), seed, zipf_s)
    if llama_cpp is None:
        with atomic_path(out, "the synthetic model") as tmp:
            _stream(tmp, preset, p, type_name, entries, progress)
    else:
        src = temp_beside(out)  # the F16 model llama.cpp quantizes
        try:
            _stream(src, preset, p, "F16", entries, progress)
            with atomic_path(out, "the synthetic model") as tmp:
                try:
                    quantize(llama_cpp, src, tmp, type_name, os.cpu_count() or 1)
                finally:
                    tmp.with_name(tmp.name + ".part").unlink(missing_ok=True)
        finally:
            src.unlink(missing_ok=True)
    g = GGUFFile(out)
    return {"path": str(out), "bytes": g.size, "tensors": len(g.tensors), "preset": preset, "type": type_name,
            "arch": p.arch, "layers": p.n_layers, "quantizer": quantizer, "routing": routing, "seed": seed,
            "types": dict(sorted(Counter(t.qtype.name for t in g.tensors.values()).items()))}


def _llama_cpp_for(type_name: str):
    """The llama_cpp module, once it is known to quantize into the file type `type_name` without an imatrix."""
    llama_cpp = llama_cpp_module()
    if llama_cpp is None:
        raise BadFlagError("--quantizer llama.cpp: the llama_cpp module is not importable "
                           "(pip install llama-cpp-python)")
    if type_name in NEEDS_IMATRIX:
        raise BadFlagError(f"--type {type_name}: llama.cpp needs an importance matrix for it, and random weights "
                           "have none; pick a K-quant, IQ4_XS, IQ3_S or Q8_0")
    if not hasattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{type_name}"):
        raise BadFlagError(f"--type {type_name}: not a llama.cpp file type (LLAMA_FTYPE_MOSTLY_{type_name})")
    return llama_cpp


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m guild.tools.synth", description=__doc__.split("\n\n")[0])
    ap.add_argument("preset", help=f"one of {', '.join(PRESETS)}")
    ap.add_argument("-o", "--out", required=True, help="the GGUF to write")
    ap.add_argument("--layers", type=int, default=None, help="blocks to write (default 2; qwen3.5: 4)")
    ap.add_argument("--type", default="Q4_K_M", help="a ggml type, or Q3_K_M / Q4_K_M / Q5_K_M / MXFP4_MOE (per "
                    "tensor, as llama.cpp picks); with --quantizer llama.cpp, a llama.cpp file type")
    ap.add_argument("--quantizer", default="random", help="random (valid random blocks) or llama.cpp")
    ap.add_argument("--routing", default="uniform", help="uniform or zipf[:s] (expert popularity ~ rank^-s)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--scale", type=float, default=1.0, help="shrink widths, heads and experts (tests)")
    ap.add_argument("--context", type=int, default=None, help="context_length (default: the preset's)")
    ap.add_argument("--json", action="store_true", help="print what was written as one JSON object")
    a = ap.parse_args(argv)
    r = synth(a.preset, a.out, layers=a.layers, type_name=a.type, quantizer=a.quantizer, routing=a.routing,
              seed=a.seed, scale=a.scale, context=a.context, progress=sys.stderr.isatty())
    if a.json:
        print(json.dumps(r))
    else:
        print(f"{r['path']}: {r['bytes'] / 1e9:.2f} GB, {r['tensors']} tensors ({a.preset}, {r['layers']} layers, "
              f"{a.type})")
    return 0


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except GuildError as e:
        raise SystemExit(f"error: {e}") from None
