"""guild's tokenizer against two that share none of its code paths, on 1,200 seeded strings per vocabulary:
llama.cpp's (llama-cpp-python, the GGUF read with vocab_only) and HF's (the `tokenizers` BPE configured as the
model's published tokenizer.json is, or transformers' own GGUF reader). Every tokenizer type guild ships:

- byte-level BPE, pre 'smollm' (the embedded SmolLM2 models): digits isolated, then GPT-2's regex. The HF oracle
  is SmolLM2's tokenizer.json pre-tokenizer (Digits(individual_digits) + ByteLevel); transformers' GGUF reader
  does not know 'smollm' (it splits " ½" as GPT-2 does), so it is not used here.
- byte-level BPE, pre 'gpt-2' (the tiny test models, guild.tools.tiny): transformers reads the GGUF itself.

The strings (generated here, seeded): unicode (CJK, emoji with ZWJ and skin tones, combining marks, RTL text and
marks, other scripts), whitespace runs (spaces, tabs, newlines, CR, mixed), digit runs (ASCII and other \\p{N}),
punctuation and contractions, special tokens whole, adjacent and broken, mixtures, and chat-templated
conversations. Ids must be equal to all three, and guild's decode must give the string back."""

from __future__ import annotations

import random

import pytest

from guild.formats.gguf import GGUFFile
from guild.text.tokenizer import Tokenizer
from guild.tools.tiny import write_tiny_model
from tests.helpers.optional import installed

pytestmark = pytest.mark.oracle

SPECIALS = ("<|im_start|>", "<|im_end|>", "<|endoftext|>")  # control tokens of both vocabularies
WORDS = ("the", "The", "model", "token", "don't", "I'm", "we'll", "they've", "you're", "it'd", "HELLO", "def",
         "return", "naïve", "café", "Straße", "über", "façade", "x", "a", "I", "SHE'S", "o'clock")
CJK = [chr(c) for c in range(0x4E00, 0x4E00 + 400)] + list("日本語中文字漢字한국어조선말ひらがなカタカナ")
EMOJI = ["😀", "👍", "👍🏽", "🇫🇷", "👨‍👩‍👧‍👦", "❤️", "🚀", "🙂", "🧑🏿‍💻", "☃", "🏳️‍🌈", "🫠"]
RTL = list("שלום עולם") + list("مرحبا بالعالم") + ["\u200f", "\u200e", "\u202b", "\u202c"]
OTHER = list("Здравствуйте Γειά σου नमस्ते สวัสดี ሰላም Ꭰ") + ["\u00a0", "\u3000", "\u2028", "\ufeff", "\u200b"]
COMBINING = [chr(c) for c in range(0x0300, 0x0370)] + ["\u20dd", "\u0489", "\u093f"]
WS = [" ", "  ", "\t", "\n", "\r\n", "\r", "\n\n", "   \n", " \t ", "\x0b", "\x0c"]
ODD_DIGITS = list("٠١٢٣٤٥٦٧٨٩０１２３４５６７８９½¼²³ⅣⅫ①")
NUMBERS = ["3.14159", "1,000,000", "-42", "+7", "1e-9", "0x1F", "2024-06-01", "12:30", "v1.2.3", "$19.99", "50%"]
PUNCT = list("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~") + [
    "...", "—", "–", "«", "»", "“", "”", "‘", "’", "¿", "¡", "…", "·", "•", "→", "=>", "!=", "::", "->", "'s", "'S",
    "'LL"]
SEPARATORS = ["", " ", " ", "\n", ", ", "  "]


def _word(r: random.Random) -> str:
    if r.random() < 0.7:
        return r.choice(WORDS)
    return "".join(r.choice("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ") for _ in range(r.randint(1, 12)))


def _runs(r: random.Random, pick, n=(1, 8)) -> str:
    return "".join(pick() + r.choice(SEPARATORS) for _ in range(r.randint(*n)))


def _unicode(r):
    def pick():
        k = r.random()
        if k < 0.25:
            return "".join(r.choice(CJK) for _ in range(r.randint(1, 6)))
        if k < 0.45:
            return "".join(r.choice(EMOJI) for _ in range(r.randint(1, 3)))
        if k < 0.6:
            return "".join(r.choice(RTL) for _ in range(r.randint(1, 10)))
        if k < 0.75:  # a base letter (or a space) and 1-3 combining marks
            return r.choice("aeiouAEIOUnc ") + "".join(r.choice(COMBINING) for _ in range(r.randint(1, 3)))
        if k < 0.85:
            return "".join(r.choice(OTHER) for _ in range(r.randint(1, 8)))
        return _word(r)
    return _runs(r, pick)


def _whitespace(r):
    return _runs(r, lambda: "".join(r.choice(WS) for _ in range(r.randint(1, 6))) if r.random() < 0.6 else _word(r))


def _digits(r):
    def pick():
        k = r.random()
        if k < 0.5:
            return "".join(r.choice("0123456789") for _ in range(r.randint(1, 24)))
        if k < 0.65:
            return "".join(r.choice(ODD_DIGITS) for _ in range(r.randint(1, 5)))
        return r.choice(NUMBERS) if k < 0.8 else _word(r)
    return _runs(r, pick, (1, 6))


def _punct(r):
    return _runs(r, lambda: "".join(r.choice(PUNCT) for _ in range(r.randint(1, 5))) if r.random() < 0.6
                 else _word(r))


def _specials(r):
    def pick():
        k = r.random()
        if k < 0.45:
            return r.choice(SPECIALS)
        if k < 0.55:  # a special token cut short: plain text
            s = r.choice(SPECIALS)
            return s[: r.randint(1, len(s) - 1)]
        return _word(r)
    return _runs(r, pick, (1, 6))


def _mixed(r):
    return "".join(r.choice(KINDS[:5])(r) for _ in range(r.randint(2, 4)))


KINDS = (_unicode, _whitespace, _digits, _punct, _specials, _mixed)


def strings(tok: Tokenizer, seed: int = 55, per_kind: int = 180, chats: int = 120) -> list[str]:
    """6 x 180 generated strings and 120 conversations rendered with the model's chat template."""
    r = random.Random(seed)
    out = [f(r) for f in KINDS for _ in range(per_kind)]
    for _ in range(chats):
        roles = (["system"] if r.random() < 0.3 else []) + ["user", "assistant"] * r.randint(1, 3)
        msgs = [{"role": role, "content": r.choice(KINDS[:5])(r)} for role in roles[: r.randint(1, len(roles))]]
        out.append(tok.apply_chat_template(msgs, add_generation_prompt=msgs[-1]["role"] == "user"))
    return out


def _compare(tok: Tokenizer, oracles: dict, texts: list[str]) -> None:
    """Every string's ids equal each oracle's; the first few mismatches are shown."""
    bad: dict[str, list] = {name: [] for name in oracles}
    for s in texts:
        ids = tok.encode(s)
        for name, encode in oracles.items():
            want = encode(s)
            if ids != want:
                bad[name].append((s, ids, want))
        assert tok.decode(ids) == s, repr(s)
    for name, b in bad.items():
        assert not b, f"{len(b)} of {len(texts)} strings differ from {name}; first: " + "; ".join(
            f"{s!r}: guild {a} vs {w}" for s, a, w in b[:3])


def _llama_cpp(path):
    llama_cpp = installed("llama_cpp")
    llm = llama_cpp.Llama(str(path), vocab_only=True, verbose=False)
    return lambda s: llm.tokenize(s.encode("utf-8"), add_bos=False, special=True)


def test_smollm_tokenizer_against_llama_cpp_and_hf(dense_path):
    tokenizers = installed("tokenizers")
    meta = GGUFFile(dense_path).metadata
    assert (meta["tokenizer.ggml.model"], meta["tokenizer.ggml.pre"]) == ("gpt2", "smollm")
    tok = Tokenizer.from_metadata(meta)
    tokens, types = meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.token_type"]
    hf = tokenizers.Tokenizer(tokenizers.models.BPE({t: i for i, t in enumerate(tokens)},
                                                    [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]))
    # SmolLM2's tokenizer.json: {"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits":
    # true}, {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true}]}
    hf.pre_tokenizer = tokenizers.pre_tokenizers.Sequence([
        tokenizers.pre_tokenizers.Digits(individual_digits=True),
        tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)])
    hf.add_special_tokens([tokenizers.AddedToken(t, special=True, normalized=False)
                           for t, ty in zip(tokens, types, strict=True) if ty == 3])
    texts = strings(tok)
    assert len(texts) >= 1200 and len(set(texts)) > 1150
    _compare(tok, {"llama.cpp": _llama_cpp(dense_path),
                   "HF tokenizers": lambda s: hf.encode(s, add_special_tokens=False).ids}, texts)


def test_tiny_gpt2_tokenizer_against_llama_cpp_and_transformers(tmp_path):
    transformers = installed("transformers")
    path = write_tiny_model(tmp_path / "tiny.gguf", "llama", vocab=680)  # the most merges the tiny corpus yields
    meta = GGUFFile(path).metadata
    assert (meta["tokenizer.ggml.model"], meta["tokenizer.ggml.pre"]) == ("gpt2", "gpt-2")
    tok = Tokenizer.from_metadata(meta)
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=path.name)
    _compare(tok, {"llama.cpp": _llama_cpp(path),
                   "transformers": lambda s: hf.encode(s, add_special_tokens=False)}, strings(tok, seed=56))
