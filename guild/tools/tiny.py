"""Tiny random GGUF models for tests: llama (dense or Mixtral-style MoE), qwen3 (QK-norm), qwen3moe, and MTP heads
(the hybrids: guild.tools.tiny_hybrid).

Tensor names and metadata keys are the ones `gguf.constants` defines and llama.cpp's converter writes, so the
loaders exercised by the tests are the loaders real files go through. Weights are seeded per tensor name
(`default_rng([seed, crc32(name)])`): the same seed gives byte-identical files, and an F32 and a Q8_0 model of
the same seed carry the same underlying weights (quantised differently), so quantised logits can be compared
with F32 ones.

Scales: every matrix is drawn N(0, gain/sqrt(fan_in)), so a projection of an RMS-normalised input has O(1)
entries: attention scores of std ~1 (not uniform), SwiGLU activations O(1), the residual stream stays O(1)
over a couple of layers, and logits (gain 2 on token_embd/output) have a std of ~2 over the vocabulary — peaked
but not one-hot. Norm weights are 1 + N(0, 0.1).

Tokenizer: a byte-level GPT-2-style BPE. Token id b (0..255) is byte b written in GPT-2's bytes_to_unicode
alphabet, then `vocab - 259` merges learnt from a fixed English/code snippet, then `<|endoftext|>`,
`<|im_start|>`, `<|im_end|>` (CONTROL) as the last three ids; a ChatML chat template.
"""

from __future__ import annotations

import functools
import re
import zlib
from collections import Counter
from os import PathLike
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter, LlamaFileType, TokenType
from gguf.constants import GGML_QUANT_SIZES, GGML_QUANT_VERSION
from gguf.quants import dequantize, quantize

from ..formats.gguf import GGUFFile
from ..kernels.quant_types import F16_SCALES
from ..models import ModelArgs
from ..text.vocab import bytes_to_unicode

ARCHS = ("llama", "qwen3", "qwen3moe")
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
N_BYTE_TOKENS = 256
MIN_VOCAB = N_BYTE_TOKENS + 1 + len(SPECIAL_TOKENS)  # llama.cpp refuses a gpt2 vocabulary without merges

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# Types gguf.quants cannot quantise: random block bytes, then the f16 scales (kernels/blocks.py F16_SCALES: d,
# and dmin where there is one) overwritten with sane values.
_QUANTIZABLE = frozenset(
    GGMLQuantizationType[n]
    for n in ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "MXFP4", "TQ1_0", "TQ2_0")
)
_RANDOM_BLOCK_SCALES: dict[GGMLQuantizationType, tuple[int, int | None]] = {
    q: (offs[0], offs[1] if len(offs) > 1 else None)
    for q, offs in F16_SCALES.items() if offs and q not in _QUANTIZABLE
}
SUPPORTED_QTYPES = tuple(sorted(q.name for q in _QUANTIZABLE | set(_RANDOM_BLOCK_SCALES)))

_FILE_TYPE = {
    "F32": LlamaFileType.ALL_F32,
    "F16": LlamaFileType.MOSTLY_F16,
    "BF16": LlamaFileType.MOSTLY_BF16,
    "Q3_K": LlamaFileType.MOSTLY_Q3_K_M,
    "Q4_K": LlamaFileType.MOSTLY_Q4_K_M,
    "Q5_K": LlamaFileType.MOSTLY_Q5_K_M,
    "Q2_K": LlamaFileType.MOSTLY_Q2_K,
    "MXFP4": LlamaFileType.MOSTLY_MXFP4_MOE,
}

# Rope base and RMS epsilon as the real families ship them.
_ARCH_DEFAULTS = {
    "llama": {"rope_base": 100000.0, "eps": 1e-5},
    "qwen3": {"rope_base": 1000000.0, "eps": 1e-6},
    "qwen3moe": {"rope_base": 1000000.0, "eps": 1e-6},
}

_BPE_CORPUS = """\
The quick brown fox jumps over the lazy dog. A model reads the prompt, predicts the next token, and then
the next one again; the cache keeps the keys and values of every position it has seen so far. When the
draft is right, the verifier accepts it and the decoder moves several tokens at once. When it is wrong,
the state rolls back to the last accepted token and nothing of the rejected rows survives.
def generate(self, prompt, max_tokens=128):
    tokens = self.tokenizer.encode(prompt)
    for step in range(max_tokens):
        logits = self.forward(tokens[-1], position=len(tokens))
        token = int(logits.argmax())
        if token == self.eos_id:
            break
        tokens.append(token)
    return self.tokenizer.decode(tokens)
Experts are small feed-forward networks; a router scores them for each token and the top two are mixed
with weights that sum to one. Summaries, questions and answers, structured JSON output such as
{"name": "guild", "version": 1, "items": [1, 2, 3], "ok": true} and short chats all share this vocabulary.
In the morning the weather was cold, but by the afternoon the sun had warmed the stones of the old
harbour, where fishermen were mending their nets and talking about the price of fuel and the tides.
"""
_PRETOKENIZE = re.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+""")


@functools.lru_cache(maxsize=8)
def tiny_vocab(vocab: int) -> tuple[tuple[str, ...], tuple[int, ...], tuple[str, ...]]:
    """(tokens, token_types, merges) of a byte-level BPE with exactly `vocab` tokens (specials last).

    260 <= vocab <= 680: at least one merge (llama.cpp requires the key); the built-in corpus yields 421.
    """
    if vocab < MIN_VOCAB:
        raise ValueError(
            f"vocab={vocab}: needs at least {MIN_VOCAB} tokens (256 bytes, 1 merge, {len(SPECIAL_TOKENS)} specials)"
        )
    b2u = bytes_to_unicode()
    tokens = [b2u[b] for b in range(256)]
    known = set(tokens)
    words = Counter(tuple(b2u[b] for b in w.encode("utf-8")) for w in _PRETOKENIZE.findall(_BPE_CORPUS))
    merges: list[str] = []
    banned: set[tuple[str, str]] = set()
    n_merges = vocab - N_BYTE_TOKENS - len(SPECIAL_TOKENS)
    while len(merges) < n_merges:
        pairs: Counter = Counter()
        for w, c in words.items():
            for a, b in zip(w, w[1:], strict=False):
                if (a, b) not in banned:
                    pairs[(a, b)] += c
        if not pairs:
            raise ValueError(f"vocab={vocab}: the built-in BPE corpus yields only {len(merges)} merges")
        best = min(pairs, key=lambda p: (-pairs[p], p))  # most frequent, ties by string order: deterministic
        merged = best[0] + best[1]
        if merged in known:  # the same string reached by another merge path: not a new token
            banned.add(best)
            continue
        known.add(merged)
        tokens.append(merged)
        merges.append(f"{best[0]} {best[1]}")
        new_words: Counter = Counter()
        for w, c in words.items():
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and (w[i], w[i + 1]) == best:
                    out.append(merged)
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            new_words[tuple(out)] += c
        words = new_words
    tokens += list(SPECIAL_TOKENS)
    types = [int(TokenType.NORMAL)] * (vocab - len(SPECIAL_TOKENS)) + [int(TokenType.CONTROL)] * len(SPECIAL_TOKENS)
    return tuple(tokens), tuple(types), tuple(merges)


def _rng(seed: int, name: str) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(name.encode())])


def _random_blocks(rng: np.random.Generator, shape: tuple[int, ...], std: float, qtype) -> np.ndarray:
    """Random block bytes for a type gguf.quants cannot quantise, with f16 scales giving ~`std` weights."""
    block, type_size = GGML_QUANT_SIZES[qtype]
    d_off, m_off = _RANDOM_BLOCK_SCALES[qtype]
    n_blocks = int(np.prod(shape)) // block
    raw = rng.integers(0, 256, size=(n_blocks, type_size), dtype=np.uint8)

    def set_f16(off: int, v) -> None:
        raw[:, off : off + 2] = np.asarray(v, np.float16).reshape(-1, 1).view(np.uint8).reshape(-1, 2)

    # Measure the parts linear in d and in dmin on a sample, then pick dmin/d to centre the weights on zero
    # and one global factor for the std; each block's d varies by ±25% around it.
    sample = raw[: min(n_blocks, 64)].copy()

    def measure(d: float, m: float) -> np.ndarray:
        s = sample.copy()
        s[:, d_off : d_off + 2] = np.frombuffer(np.float16(d).tobytes(), np.uint8)
        if m_off is not None:
            s[:, m_off : m_off + 2] = np.frombuffer(np.float16(m).tobytes(), np.uint8)
        return dequantize(s, qtype).astype(np.float64)

    ratio = 0.0
    if m_off is not None:
        a, b = measure(1.0, 0.0), measure(0.0, 1.0)
        ratio = float(-a.mean() / b.mean()) if b.mean() != 0 else 0.0
    spread = float(measure(1.0, ratio).std()) or 1.0
    d = (std / spread) * rng.uniform(0.75, 1.25, size=n_blocks)
    set_f16(d_off, d)
    if m_off is not None:
        set_f16(m_off, d * ratio)
    return raw.reshape(*shape[:-1], shape[-1] // block * type_size)


def _matrix(seed: int, name: str, shape: tuple[int, ...], std: float, qtype) -> np.ndarray:
    """A weight matrix of numpy `shape` (…, n_out, n_in) in `qtype`: float array, or raw uint8 blocks."""
    block, _ = GGML_QUANT_SIZES[qtype]
    if shape[-1] % block:
        raise ValueError(f"{name}: row length {shape[-1]} is not a multiple of the {qtype.name} block size {block}")
    rng = _rng(seed, name)
    if qtype in _RANDOM_BLOCK_SCALES:
        return _random_blocks(rng, shape, std, qtype)
    w = (rng.standard_normal(shape, dtype=np.float32) * np.float32(std)).astype(np.float32)
    return quantize(w, qtype)


def _norm(seed: int, name: str, n: int) -> np.ndarray:
    return (1.0 + 0.1 * _rng(seed, name).standard_normal(n)).astype(np.float32)


def copy_emb_gain(copy_bias: float) -> float:
    """token_embd's gain in a copy model: its residual stream is dominated by the token itself."""
    return 2.0 * max(1.0, copy_bias)


def copy_output(seed: int, vocab: int, dim: int, copy_bias: float, qtype) -> np.ndarray:
    """output.weight (F32) of a copy model whose token_embd was written in `qtype` with copy_emb_gain: the random
    head plus token_embd[perm[v]] (rescaled) on row v. The model then mostly follows the fixed chain next =
    perm^-1(current), which its layers' context-dependent output sometimes breaks: what it generated once tends
    to recur (a copy workload for lookup, retrieval and MTP drafts)."""
    gain = copy_emb_gain(copy_bias)
    emb = dequantize(_matrix(seed, "token_embd.weight", (vocab, dim), gain / np.sqrt(dim), qtype), qtype)
    out = _matrix(seed, "output.weight", (vocab, dim), 2.0 / np.sqrt(dim), GGMLQuantizationType.F32)
    perm = _rng(seed, "copy_bias").permutation(vocab)
    return (out + emb[perm] * np.float32(2.0 / gain)).astype(np.float32)


def copy_eh_proj(seed: int, name: str, dim: int, copy_bias: float) -> np.ndarray:
    """eh_proj (F32) of a copy model's MTP head: the random projection plus copy_bias * [I | 0], so that the head's
    residual carries the embedding of x_{p+1} and the shared output head predicts its chain successor x_{p+2}."""
    w = _matrix(seed, name, (dim, 2 * dim), 1.0 / np.sqrt(2 * dim), GGMLQuantizationType.F32)
    w[:, :dim] += np.float32(copy_bias) * np.eye(dim, dtype=np.float32)
    return w


def _layer(matrix, norm, p: str, dim: int, n_heads: int, n_kv_heads: int, hd: int, qk_norm: bool, n_experts: int,
           ffn: int) -> None:
    """One llama-family layer's tensors named p + ...: attention (QK-norm for qwen3), then a dense SwiGLU FFN or,
    with n_experts, a Mixtral-style router and stacked experts of size ffn."""
    norm(p + "attn_norm.weight", dim)
    matrix(p + "attn_q.weight", (n_heads * hd, dim))
    matrix(p + "attn_k.weight", (n_kv_heads * hd, dim))
    matrix(p + "attn_v.weight", (n_kv_heads * hd, dim))
    matrix(p + "attn_output.weight", (dim, n_heads * hd), gain=0.5)
    if qk_norm:
        norm(p + "attn_q_norm.weight", hd)
        norm(p + "attn_k_norm.weight", hd)
    norm(p + "ffn_norm.weight", dim)
    if n_experts:
        matrix(p + "ffn_gate_inp.weight", (n_experts, dim), typ=GGMLQuantizationType.F32)
        matrix(p + "ffn_gate_exps.weight", (n_experts, ffn, dim))
        matrix(p + "ffn_up_exps.weight", (n_experts, ffn, dim))
        matrix(p + "ffn_down_exps.weight", (n_experts, dim, ffn), gain=0.5)
    else:
        matrix(p + "ffn_gate.weight", (ffn, dim))
        matrix(p + "ffn_up.weight", (ffn, dim))
        matrix(p + "ffn_down.weight", (dim, ffn), gain=0.5)


def file_type(qtype: str) -> LlamaFileType:
    """general.file_type of a file whose matrices are `qtype` (a ggml type name, or a llama.cpp mixture such as
    Q4_K_M)."""
    return _FILE_TYPE[qtype] if qtype in _FILE_TYPE else LlamaFileType[f"MOSTLY_{qtype}"]


def llama_keys(w: GGUFWriter, arch: str, *, name: str, n_layers: int, context: int, dim: int, ffn: int,
               n_heads: int, n_kv_heads: int, head_dim: int, n_experts: int, top_k: int, expert_ffn: int,
               vocab: int, file_type: int, rope_base: float, eps: float) -> None:
    """The model keys of a llama-family file (llama, qwen3, qwen3moe) as llama.cpp's converter writes them;
    n_experts 0 = dense. A Mixtral-style llama MoE gives its expert size as feed_forward_length."""
    w.add_type("model")
    w.add_name(name)
    w.add_block_count(n_layers)
    w.add_context_length(context)
    w.add_embedding_length(dim)
    w.add_feed_forward_length(expert_ffn if n_experts and arch == "llama" else ffn)
    w.add_head_count(n_heads)
    w.add_head_count_kv(n_kv_heads)
    w.add_rope_freq_base(rope_base)
    w.add_layer_norm_rms_eps(eps)
    if head_dim != dim // n_heads:
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    if n_experts:
        w.add_expert_count(n_experts)
        w.add_expert_used_count(top_k)
    if arch == "qwen3moe":
        w.add_expert_feed_forward_length(expert_ffn)
        # llama.cpp hard-codes renormalised top-k for qwen3moe; the key exists in gguf.constants, so say it.
        w.add_expert_weights_norm(True)
    if arch == "llama":
        w.add_vocab_size(vocab)
        w.add_rope_dimension_count(head_dim)
    w.add_file_type(int(file_type))
    w.add_quantization_version(GGML_QUANT_VERSION)


def tiny_tokenizer_keys(w: GGUFWriter, vocab: int) -> None:
    """The tokenizer keys of tiny_vocab(vocab) and the ChatML template."""
    tokens, token_types, merges = tiny_vocab(vocab)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")  # llama.cpp's name for the GPT-2 regex
    w.add_token_list(list(tokens))
    w.add_token_types(list(token_types))
    w.add_token_merges(list(merges))
    eot, im_end = vocab - 3, vocab - 1
    w.add_bos_token_id(eot)
    w.add_eos_token_id(im_end)
    w.add_pad_token_id(eot)
    w.add_add_bos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)


def write_tiny_model(
    path: str | PathLike,
    arch: str = "llama",
    *,
    n_layers: int = 2,
    dim: int = 64,
    n_heads: int = 4,
    n_kv_heads: int = 2,
    ffn: int = 128,
    vocab: int = 320,
    n_experts: int = 0,
    top_k: int = 2,
    expert_ffn: int | None = None,
    qtype: str = "F32",
    context: int = 256,
    seed: int = 0,
    tied: bool = False,
    head_dim: int | None = None,
    copy_bias: float = 0.0,
) -> Path:
    """Write a tiny random GGUF model and return its path.

    `llama` with n_experts > 0 is Mixtral-style (ffn_gate_inp + ffn_*_exps, expert size = feed_forward_length
    = expert_ffn or ffn); `qwen3` is dense with QK-norm; `qwen3moe` needs n_experts > 0 and writes
    `expert_feed_forward_length` (expert_ffn or ffn) besides `feed_forward_length` (ffn). `qtype` applies to
    every 2-D/3-D matrix (token_embd and output included) except the F32 router; norms are always F32.
    `vocab` must be in 260..680 (256 byte tokens + merges + 3 specials). `copy_bias` > 0 makes a copy model
    (copy_output): token_embd scaled by copy_bias, output.weight F32 with the chain bias.
    """
    if arch not in ARCHS:
        raise ValueError(f"arch={arch!r}: expected one of {', '.join(ARCHS)}")
    if arch == "qwen3moe" and n_experts <= 0:
        raise ValueError("arch='qwen3moe' needs n_experts > 0")
    if arch == "qwen3" and n_experts:
        raise ValueError("arch='qwen3' is dense; use arch='qwen3moe' for experts")
    if n_experts and not 0 < top_k <= n_experts:
        raise ValueError(f"top_k={top_k} not in 1..n_experts={n_experts}")
    if n_heads % n_kv_heads:
        raise ValueError(f"n_heads={n_heads} is not a multiple of n_kv_heads={n_kv_heads}")
    if copy_bias and tied:
        raise ValueError("copy_bias needs an untied output matrix")
    try:
        qt = GGMLQuantizationType[qtype.upper()]
    except KeyError:
        raise ValueError(f"qtype={qtype!r}: unknown ggml type") from None
    if qt not in _QUANTIZABLE and qt not in _RANDOM_BLOCK_SCALES:
        raise ValueError(f"qtype={qtype!r}: not one of {', '.join(SUPPORTED_QTYPES)}")
    hd = head_dim or dim // n_heads
    if hd % 2:
        raise ValueError(f"head_dim={hd} must be even (rope)")
    moe = n_experts > 0
    eff = expert_ffn or ffn

    path = Path(path)
    w = GGUFWriter(path, arch)
    llama_keys(w, arch, name=f"guild tiny {arch}{f' {n_experts}x{top_k}' if moe else ''} seed {seed}",
               n_layers=n_layers, context=context, dim=dim, ffn=ffn, n_heads=n_heads, n_kv_heads=n_kv_heads,
               head_dim=hd, n_experts=n_experts if moe else 0, top_k=top_k, expert_ffn=eff, vocab=vocab,
               file_type=file_type(qt.name), **_ARCH_DEFAULTS[arch])
    tiny_tokenizer_keys(w, vocab)

    def matrix(name: str, shape: tuple[int, ...], gain: float = 1.0, typ=qt) -> None:
        std = gain / np.sqrt(shape[-1])
        arr = _matrix(seed, name, shape, std, typ)
        w.add_tensor(name, arr, raw_dtype=None if arr.dtype != np.uint8 else typ)

    def norm(name: str, n: int) -> None:
        w.add_tensor(name, _norm(seed, name, n))

    matrix("token_embd.weight", (vocab, dim), gain=copy_emb_gain(copy_bias))
    for i in range(n_layers):
        _layer(matrix, norm, f"blk.{i}.", dim, n_heads, n_kv_heads, hd, arch in ("qwen3", "qwen3moe"),
               n_experts if moe else 0, eff if moe else ffn)
    norm("output_norm.weight", dim)
    if copy_bias:
        w.add_tensor("output.weight", copy_output(seed, vocab, dim, copy_bias, qt))
    elif not tied:
        matrix("output.weight", (vocab, dim), gain=2.0)

    return _write(w, path)


def write_tiny_mtp_head(base: str | PathLike, path: str | PathLike, *, seed: int = 1, draft_vocab: int = 0,
                        qtype: str = "F32", copy_bias: float = 0.0, fuse: tuple[int, ...] = ()) -> Path:
    """A random MTP head sidecar for a llama-family model written by write_tiny_model, in the layout `guild
    train-mtp` writes (guild/models/mtp.py): nextn tensors and one layer of the base's kind at block 0, the
    base's identity digest; `draft_vocab` > 0 adds `mtp.draft_vocab` (that many ids, a seeded permutation);
    `copy_bias` > 0 writes the eh_proj of a copy model's head (copy_eh_proj); `fuse` (trunk layers) makes a
    head that fuses those layers' rows with the final hidden (nextn.fc, guild.mtp.feature_layers)."""

    g = GGUFFile(base)
    a = ModelArgs.from_gguf(g)
    qt = GGMLQuantizationType[qtype.upper()]
    path = Path(path)
    w = GGUFWriter(path, "guild-mtp")
    w.add_string("guild.mtp.base_architecture", a.arch)
    w.add_string("guild.mtp.base_digest", g.identity_digest())
    w.add_string("guild.mtp.base_name", Path(base).name)
    w.add_string("guild.mtp.ffn", "moe" if a.is_moe else "dense")

    def matrix(name: str, shape: tuple[int, ...], gain: float = 1.0, typ=qt) -> None:
        arr = _matrix(seed, name, shape, gain / np.sqrt(shape[-1]), typ)
        w.add_tensor(name, arr, raw_dtype=None if arr.dtype != np.uint8 else typ)

    def norm(name: str, n: int) -> None:
        w.add_tensor(name, _norm(seed, name, n))

    d, hd, p = a.dim, a.head_dim, "blk.0."
    if copy_bias:
        w.add_tensor(p + "nextn.eh_proj.weight", copy_eh_proj(seed, p + "nextn.eh_proj.weight", d, copy_bias))
    else:
        matrix(p + "nextn.eh_proj.weight", (d, 2 * d))
    for n in ("enorm", "hnorm", "shared_head_norm"):
        norm(p + f"nextn.{n}.weight", d)
    if fuse:
        w.add_array("guild.mtp.feature_layers", [int(v) for v in fuse])
        matrix(p + "nextn.fc.weight", (d, (1 + len(fuse)) * d))
    f = g.tensor("blk.0.ffn_gate_exps.weight").shape[1] if a.is_moe else g.tensor("blk.0.ffn_gate.weight").shape[0]
    _layer(matrix, norm, p, d, a.n_heads, a.n_kv_heads, hd, g.has(p + "attn_q_norm.weight"), a.n_experts, f)
    if draft_vocab:
        ids = _rng(seed, "draft_vocab").permutation(a.vocab_size)[:draft_vocab].astype(np.int32)
        w.add_tensor("mtp.draft_vocab", ids)
    return _write(w, path)


def _write(w, path: Path) -> Path:
    """Write a GGUFWriter's header, metadata and tensors to `path` (parents created)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
    finally:
        w.close()
    return path
