"""GGUF vocabularies → HuggingFace `tokenizers` models: the pre-tokenizer regexes llama.cpp uses per
`tokenizer.ggml.pre` (llama-vocab.cpp, `LLAMA_VOCAB_PRE_TYPE_*`), the byte-level BPE (gpt2) and
SentencePiece-style (llama) builders, and the typed metadata readers they share with guild.text.tokenizer."""

from __future__ import annotations

import logging
import re
from typing import Any

from tokenizers import AddedToken, Regex, decoders, normalizers, pre_tokenizers
from tokenizers import Tokenizer as _HFTokenizer
from tokenizers.models import BPE

from ..errors import MetadataError

log = logging.getLogger("guild.text.tokenizer")

# GGUF token types (gguf.TokenType / llama_token_type).
TT_NORMAL, TT_UNKNOWN, TT_CONTROL, TT_USER_DEFINED, TT_UNUSED, TT_BYTE = 1, 2, 3, 4, 5, 6

_SPM_SPACE = "\u2581"  # ▁


# ------------------------------------------------------------------------------------------------
# Pre-tokenizer regexes (llama.cpp llama-vocab.cpp; where llama.cpp rewrote a tokenizer.json regex
# for std::regex, the original tokenizer.json form is used here since `tokenizers` runs Oniguruma).
# ------------------------------------------------------------------------------------------------
_RE_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_CONTRACTIONS_I = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)"
_RE_LLAMA3 = (
    _CONTRACTIONS_I + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_RE_QWEN2 = _CONTRACTIONS_I + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_RE_QWEN35 = (
    _CONTRACTIONS_I + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_UPPER = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]"
_LOWER = r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]"
_RE_TEKKEN = (
    rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_RE_GPT4O = (
    rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+{_CONTRACTIONS_I}?"
    rf"|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*{_CONTRACTIONS_I}?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_RE_SEED_CODER = _CONTRACTIONS_I + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+"
# tokenizer.json uses possessive quantifiers; llama.cpp (and we) use the greedy equivalents.
_RE_BAILING = r"'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+"
_RE_BLOOM = r" ?[^(\s|.,!?…。，、।۔،)]+"
_RE_PUNCT = r"[\p{P}\$\+<=>\^~\|]+"
_RE_DEEPSEEK3 = (
    r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
    r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# kind → (split regexes applied in order, each "isolated"; whether ByteLevel then applies its GPT-2 regex)
_PRE_KINDS: dict[str, tuple[tuple[str, ...], bool]] = {
    "gpt2": ((), True),
    "smollm": ((r"\p{N}",), True),  # STARCODER / SMOLLM / REFACT / COMMAND_R ...: digits isolated, then GPT-2
    "llama3": ((_RE_LLAMA3,), False),
    "qwen2": ((_RE_QWEN2,), False),
    "qwen35": ((_RE_QWEN35,), False),
    "tekken": ((_RE_TEKKEN,), False),
    "gpt4o": ((_RE_GPT4O,), False),
    "seed-coder": ((_RE_SEED_CODER,), False),
    "bailingmoe": ((_RE_BAILING,), False),
    "bloom": ((_RE_BLOOM,), False),
    "viking": ((_RE_BLOOM, r"\p{N}"), False),
    "falcon": ((_RE_PUNCT, _RE_GPT2, r"[0-9][0-9][0-9]"), False),
    "deepseek-coder": ((r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", r"[一-龥ࠀ-一가-퟿]+", r"\p{N}"), False),
    "deepseek3": ((r"\p{N}{1,3}", r"[一-龥぀-ゟ゠-ヿ]+", _RE_DEEPSEEK3), False),
    # LLAMA_VOCAB_PRE_TYPE_DEFAULT: missing or "default" pre
    "default": ((_RE_PUNCT, _RE_GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"), False),
}

# tokenizer.ggml.pre value → (kind, ignore_merges, add_bos default); per llama.cpp's llama_vocab::load.
_PRE_NAMES: dict[str, tuple[str, bool, bool]] = {}


def _names(kind: str, names: str, ignore_merges: bool = False, add_bos: bool = False) -> None:
    for n in names.split():
        _PRE_NAMES[n] = (kind, ignore_merges, add_bos)


_names("default", "default")
_names("llama3", "llama3 llama-v3 llama-bpe falcon3 falcon-h1 pixtral midm-2.0 lfm2 jina-v5-nano", True, True)
_names("llama3", "dbrx smaug-bpe")
_names("llama3", "glm4 chatglm-bpe")  # CHATGLM4 uses the llama3 regex
_names(
    "gpt2",
    "gpt2 gpt-2 phi-2 mpt olmo jais trillion granite-docling exaone4 jina-es jina-de gigachat jina-v2-es "
    "jina-v2-de a.x-4.0 mellum modern-bert jina-v1-en jina-v2-code roberta-bpe",
)
_names("smollm", "smollm starcoder refact command-r codeshell exaone minerva-7b mellum2")
_names(
    "qwen2",
    "qwen2 qwen2.5 qwen-2.5 deepseek-r1-qwen kormo f2llmv2 megrez stablelm2 hunyuan solar-open grok-2",
)
_names("qwen35", "qwen35")
_names("tekken", "tekken", True, True)
_names("gpt4o", "gpt-4o llama4 kanana2 talkie minimax-m2")
_names("seed-coder", "seed-coder")
_names("bailingmoe", "bailingmoe bailingmoe2 llada-moe")
_names("bloom", "bloom poro-chat gpt3-finnish")
_names("viking", "viking")
_names("falcon", "falcon")
_names("deepseek-coder", "deepseek-coder")
_names("deepseek3", "deepseek-v3 hunyuan-dense joyai-llm")


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte → printable-character map used by byte-level BPE vocabularies."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    cs = list(bs)
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs, strict=True)}


_BYTE_ENCODER = bytes_to_unicode()
_BYTE_DECODER = {c: b for b, c in _BYTE_ENCODER.items()}
_BYTE_KEYS = frozenset(_BYTE_DECODER)
_BYTE_TABLE = {ord(c): b for c, b in _BYTE_DECODER.items()}  # str.translate: stand-in -> chr(byte)
_SURROGATE = re.compile("[\ud800-\udfff]")
_HEX_BYTE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


# ------------------------------------------------------------------------------------------------
# metadata helpers
# ------------------------------------------------------------------------------------------------
_MISSING = object()


def _meta(meta: dict, key: str, typ: type | tuple[type, ...], default: Any = _MISSING) -> Any:
    if key not in meta or meta[key] is None:
        if default is _MISSING:
            raise MetadataError(f"{key}: missing from GGUF metadata (required by the tokenizer)")
        return default
    v = meta[key]
    ok = isinstance(v, typ) and not (typ in (int, float, (int, float)) and isinstance(v, bool))
    if not ok:
        want = typ.__name__ if isinstance(typ, type) else "/".join(t.__name__ for t in typ)
        raise MetadataError(f"{key}: expected {want}, got {type(v).__name__}")
    return v


def _meta_list(meta: dict, key: str, elem: type | tuple[type, ...], n: int | None, default: Any = _MISSING):
    v = _meta(meta, key, list, default)
    if v is default and default is not _MISSING:
        return v
    if n is not None and len(v) != n:
        raise MetadataError(f"{key}: has {len(v)} entries, expected {n} (one per token)")
    if v and not all(isinstance(x, elem) and not isinstance(x, bool) for x in v):
        bad = next(x for x in v if not isinstance(x, elem) or isinstance(x, bool))
        want = elem.__name__ if isinstance(elem, type) else "/".join(t.__name__ for t in elem)
        raise MetadataError(f"{key}: entries must be {want}, found {type(bad).__name__}")
    return v


def _token_id(meta: dict, key: str, n: int) -> int | None:
    v = _meta(meta, key, int, None)
    if v is None:
        return None
    if v == -1 or v == 0xFFFFFFFF:  # "no such token" sentinels written by some converters
        return None
    if not 0 <= v < n:
        raise MetadataError(f"{key}: token id {v} is outside the vocabulary (size {n})")
    return v


def _usable(text: str) -> bool:
    """Token text that can be handed to the Rust tokenizer (non-empty, no lone surrogates)."""
    return bool(text) and _SURROGATE.search(text) is None


# ------------------------------------------------------------------------------------------------
# builders
# ------------------------------------------------------------------------------------------------
def _added_tokens(tokens: list[str], types: list[int]) -> list[AddedToken]:
    out = []
    for i, t in enumerate(tokens):
        ty = types[i]
        if ty in (TT_CONTROL, TT_USER_DEFINED, TT_UNKNOWN) and _usable(t):
            out.append(AddedToken(t, special=ty != TT_USER_DEFINED, normalized=False))
    return out


def _vocab_dict(tokens: list[str]) -> dict[str, int]:
    vocab: dict[str, int] = {}
    for i, t in enumerate(tokens):
        if _usable(t):
            vocab[t] = i  # a repeated text maps to its last id, as llama.cpp's token_to_id does
    return vocab


def _build_gpt2(meta: dict, tokens: list[str], types: list[int]):
    raw_merges = _meta_list(meta, "tokenizer.ggml.merges", str, None)
    vocab = _vocab_dict(tokens)
    merges: list[tuple[str, str]] = []
    seen: set[tuple[str, str]] = set()
    skipped = 0
    for m in raw_merges:
        pos = m.find(" ", 1)  # llama.cpp splits at the first space after position 0
        if pos < 0:
            skipped += 1
            continue
        a, b = m[:pos], m[pos + 1 :]
        if (a, b) in seen:
            continue  # llama.cpp keeps the first rank of a repeated merge
        if a in vocab and b in vocab and (a + b) in vocab:
            seen.add((a, b))
            merges.append((a, b))
        else:
            skipped += 1
    if raw_merges and not merges:
        raise MetadataError("tokenizer.ggml.merges: no merge pairs match tokenizer.ggml.tokens")
    if skipped:
        log.warning("tokenizer.ggml.merges: ignored %d merges whose pieces are not in the vocabulary", skipped)

    pre = _meta(meta, "tokenizer.ggml.pre", str, None)
    pre_note = None
    key = "default" if pre is None else pre
    if pre is None:
        pre_note = "tokenizer.ggml.pre is missing; using llama.cpp's 'default' BPE pre-tokenizer"
        log.warning(pre_note)
    if key in _PRE_NAMES:
        kind, ignore_merges, add_bos = _PRE_NAMES[key]
    else:
        kind, ignore_merges, add_bos = "gpt2", False, False
        pre_note = (
            f"tokenizer.ggml.pre {pre!r} is not known to guild; using the plain GPT-2 ByteLevel regex, "
            "so tokenization may differ from llama.cpp"
        )
        log.warning(pre_note)

    model = BPE(vocab, merges, ignore_merges=ignore_merges)
    hf = _HFTokenizer(model)
    splits, bytelevel_regex = _PRE_KINDS[kind]
    bytelevel = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=bytelevel_regex)
    if splits:
        seq = [pre_tokenizers.Split(Regex(r), behavior="isolated", invert=False) for r in splits]
        hf.pre_tokenizer = pre_tokenizers.Sequence([*seq, bytelevel])
    else:
        hf.pre_tokenizer = bytelevel
    hf.decoder = decoders.ByteLevel()
    added = _added_tokens(tokens, types)
    hf.add_special_tokens([a for a in added if a.special])
    hf.add_tokens([a for a in added if not a.special])

    token_bytes = []
    keys, table = _BYTE_KEYS, _BYTE_TABLE
    for i, t in enumerate(tokens):
        if types[i] in (TT_CONTROL, TT_USER_DEFINED, TT_UNKNOWN) or not keys.issuperset(t):
            token_bytes.append(t.encode("utf-8", "surrogateescape"))
        else:  # every character is a byte's stand-in: map each to that byte (str.translate, in C)
            token_bytes.append(t.translate(table).encode("latin-1"))
    return hf, token_bytes, pre, pre_note, add_bos


def _spm_merges(tokens: list[str], types: list[int], scores: list[float]) -> list[tuple[str, str]]:
    """BPE merges equivalent to SentencePiece-BPE scoring: pair (l, r) ranks by the score of l+r.

    Only normal tokens take part (SentencePiece never produces control/unused/byte pieces by merging);
    among equal scores the higher-scoring halves come first, as transformers' GGUF converter orders them.
    """
    normal: dict[str, int] = {}
    for i, t in enumerate(tokens):
        if types[i] == TT_NORMAL and _usable(t):
            normal[t] = i
    cand = []
    for t, i in normal.items():
        if len(t) < 2:
            continue
        s = scores[i]
        for k in range(1, len(t)):
            left, right = t[:k], t[k:]
            li = normal.get(left)
            if li is None:
                continue
            ri = normal.get(right)
            if ri is None:
                continue
            cand.append((-s, -scores[li], -scores[ri], left, right))
    cand.sort(key=lambda c: (c[0], c[1], c[2]))
    return [(c[3], c[4]) for c in cand]


def _build_spm(meta: dict, tokens: list[str], types: list[int]):
    n = len(tokens)
    scores = _meta_list(meta, "tokenizer.ggml.scores", (int, float), n)
    scores = [float(s) for s in scores]
    add_space_prefix = _meta(meta, "tokenizer.ggml.add_space_prefix", bool, True)
    unk = _token_id(meta, "tokenizer.ggml.unknown_token_id", n)

    vocab = _vocab_dict(tokens)
    merges = _spm_merges(tokens, types, scores)
    unk_token = tokens[unk] if unk is not None and _usable(tokens[unk]) else None
    model = BPE(vocab, merges, unk_token=unk_token, fuse_unk=True, byte_fallback=True)
    hf = _HFTokenizer(model)
    norm = [normalizers.Replace(" ", _SPM_SPACE)]
    if add_space_prefix:
        norm.insert(0, normalizers.Prepend(_SPM_SPACE))
    hf.normalizer = normalizers.Sequence(norm)
    dec = [decoders.Replace(_SPM_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if add_space_prefix:
        dec.append(decoders.Strip(" ", 1, 0))
    hf.decoder = decoders.Sequence(dec)
    added = _added_tokens(tokens, types)
    hf.add_special_tokens([a for a in added if a.special])
    hf.add_tokens([a for a in added if not a.special])

    token_bytes = []
    for i, t in enumerate(tokens):
        ty = types[i]
        m = _HEX_BYTE.fullmatch(t) if ty == TT_BYTE else None
        if m:
            token_bytes.append(bytes([int(m.group(1), 16)]))
        elif ty == TT_NORMAL or ty == TT_UNUSED:
            token_bytes.append(t.replace(_SPM_SPACE, " ").encode("utf-8", "surrogateescape"))
        else:
            token_bytes.append(t.encode("utf-8", "surrogateescape"))
    return hf, token_bytes, add_space_prefix


