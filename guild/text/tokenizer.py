"""GGUF tokenizer metadata → text encoder/decoder, incremental detokenizer and chat-template renderer.

Two vocabulary families are supported, chosen by ``tokenizer.ggml.model``:

* ``gpt2``: byte-level BPE. The GGUF vocab and merges become a HuggingFace ``tokenizers`` BPE model
  behind a ByteLevel pre-tokenizer (``add_prefix_space=False``), as transformers' GGUF converter builds
  it. ``tokenizer.ggml.pre`` selects the word-splitting regexes llama.cpp uses for that model family
  (llama-vocab.cpp, ``LLAMA_VOCAB_PRE_TYPE_*``); an unknown value falls back to the plain GPT-2
  ByteLevel regex and is recorded in ``Tokenizer.pre_note`` (and logged).
* ``llama``: SentencePiece-style BPE (tokens with ``▁``, ``tokenizer.ggml.scores``, ``<0xNN>`` byte
  tokens). Merges are derived from the scores (a pair merges with the priority of the piece it
  forms, as SentencePiece and llama.cpp's SPM tokenizer do), with byte fallback and the ``▁`` space
  prefix of ``tokenizer.ggml.add_space_prefix``.

Control / user-defined / unknown tokens become added tokens, so ``"<|im_start|>"`` written in text
encodes to its single id. Decoding goes through a per-token byte table (the exact bytes each token
stands for), so ``decode`` and the streaming ``StreamDecoder`` agree byte for byte.
"""

from __future__ import annotations

import codecs
import datetime
import json
import logging
import threading
from collections.abc import Iterable, Sequence
from typing import Any

import jinja2
import jinja2.ext
from tokenizers import Tokenizer as _HFTokenizer

from ..errors import ChatTemplateError, GuildError, MetadataError
from ..formats.gguf import GGUFFile
from .template_guard import GuardedEnvironment, guard_filters, raised_by_guild, render
from .vocab import (
    _HEX_BYTE,
    TT_BYTE,
    TT_CONTROL,
    TT_NORMAL,
    TT_UNKNOWN,
    TT_USER_DEFINED,
    _build_gpt2,
    _build_spm,
    _meta,
    _meta_list,
    _token_id,
)

log = logging.getLogger(__name__)

__all__ = ["Tokenizer", "StreamDecoder", "ChatTemplateError", "CHATML_TEMPLATE"]


# Token texts llama.cpp treats as end-of-generation (llama-vocab.cpp, "special_eog_ids").
_EOG_TEXTS = frozenset(
    {
        "<|eot_id|>",
        "<|im_end|>",
        "<|end|>",
        "<|return|>",
        "<|call|>",
        "<end_of_turn>",
        "<|endoftext|>",
        "<|eom_id|>",
        "<EOT>",
        "_<EOT>",
        "<|end_of_text|>",
    }
)

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + (message['content'] or '') + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def _has_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


# ------------------------------------------------------------------------------------------------
# Tokenizer
# ------------------------------------------------------------------------------------------------
class Tokenizer:
    """Text ↔ token ids for a GGUF model, built from its ``tokenizer.*`` metadata."""

    def __init__(
        self,
        *,
        hf: _HFTokenizer,
        model: str,
        tokens: list[str],
        token_types: list[int],
        token_bytes: list[bytes],
        bos_id: int | None,
        eos_id: int | None,
        eos_ids: frozenset[int],
        add_bos: bool,
        add_eos: bool,
        strip_leading_space: bool,
        chat_template: str | None,
        pre: str | None,
        pre_note: str | None,
    ):
        self._hf = hf
        self.model = model
        self.tokens = tokens
        self.token_types = token_types
        self._token_bytes = token_bytes
        self.vocab_size = len(tokens)
        self.bos_id = bos_id
        self.eos_id = eos_id
        self.eos_ids = eos_ids
        self.add_bos = add_bos
        self.add_eos = add_eos
        self.chat_template = chat_template
        self.pre = pre
        self.pre_note = pre_note
        self._strip_leading_space = strip_leading_space
        self._special = frozenset(i for i, t in enumerate(token_types) if t in (TT_CONTROL, TT_UNKNOWN))
        self._lock = threading.Lock()
        self._template_cache: Any = None

    # -- construction ------------------------------------------------------------------------------
    @classmethod
    def from_metadata(cls, meta: dict) -> Tokenizer:
        model = _meta(meta, "tokenizer.ggml.model", str)
        if model not in ("gpt2", "llama"):
            raise MetadataError(
                f"tokenizer.ggml.model: unsupported tokenizer model {model!r} (supported: 'gpt2', 'llama')"
            )
        tokens = _meta_list(meta, "tokenizer.ggml.tokens", str, None)
        if not tokens:
            raise MetadataError("tokenizer.ggml.tokens: empty token list")
        n = len(tokens)
        types = _meta_list(meta, "tokenizer.ggml.token_type", int, n, None)
        if types is None:
            types = [TT_NORMAL] * n
            if model == "llama":  # no types recorded: recognise <0xNN> byte tokens by their text
                types = [TT_BYTE if _HEX_BYTE.fullmatch(t) else TT_NORMAL for t in tokens]
        types = list(types)

        bos = _token_id(meta, "tokenizer.ggml.bos_token_id", n)
        eos = _token_id(meta, "tokenizer.ggml.eos_token_id", n)
        eos_set = {eos} if eos is not None else set()
        for key in ("tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"):
            tid = _token_id(meta, key, n)
            if tid is not None:
                eos_set.add(tid)
        for i, t in enumerate(tokens):
            if t in _EOG_TEXTS and types[i] in (TT_CONTROL, TT_USER_DEFINED):
                eos_set.add(i)

        template = _meta(meta, "tokenizer.chat_template", str, None)
        add_eos = _meta(meta, "tokenizer.ggml.add_eos_token", bool, False)

        if model == "gpt2":
            hf, token_bytes, pre, pre_note, add_bos_default = _build_gpt2(meta, tokens, types)
            strip = False
        else:
            hf, token_bytes, strip = _build_spm(meta, tokens, types)
            pre, pre_note, add_bos_default = None, None, True
        add_bos = _meta(meta, "tokenizer.ggml.add_bos_token", bool, add_bos_default)

        return cls(
            hf=hf,
            model=model,
            tokens=list(tokens),
            token_types=types,
            token_bytes=token_bytes,
            bos_id=bos,
            eos_id=eos,
            eos_ids=frozenset(eos_set),
            add_bos=add_bos,
            add_eos=add_eos,
            strip_leading_space=strip,
            chat_template=template,
            pre=pre,
            pre_note=pre_note,
        )

    @classmethod
    def from_gguf(cls, path) -> Tokenizer:

        return cls.from_metadata(GGUFFile(path).metadata)

    # -- encode ------------------------------------------------------------------------------------
    def encode(self, text: str, add_special: bool = False, parse_special: bool = True) -> list[int]:
        """Token ids for ``text``.

        ``add_special`` prepends BOS (when the model's ``add_bos_token`` says so) and appends EOS (when
        ``add_eos_token`` does). With ``parse_special`` (default) control tokens written in the text,
        e.g. ``"<|im_start|>"``, become their single ids; user-defined tokens always do.
        """
        if not isinstance(text, str):
            raise TypeError(f"encode() takes str, not {type(text).__name__}")
        if not text:
            ids: list[int] = []
        else:
            with self._lock:  # encode_special_tokens is tokenizer-wide state
                self._hf.encode_special_tokens = not parse_special
                try:
                    ids = self._hf.encode(text, add_special_tokens=False).ids
                except TypeError:  # the Rust side takes no lone surrogates (e.g. a JSON "\\ud800" escape)
                    if not _has_surrogate(text):
                        raise
                    raise GuildError("text is not valid Unicode (a lone surrogate code point)") from None
                finally:
                    self._hf.encode_special_tokens = False
        if add_special:
            if self.add_bos and self.bos_id is not None:
                ids = [self.bos_id, *ids]
            if self.add_eos and self.eos_id is not None:
                ids = [*ids, self.eos_id]
        return ids

    # -- decode ------------------------------------------------------------------------------------
    def token_bytes(self, token_id: int) -> bytes:
        """The exact bytes token ``token_id`` stands for (control tokens: their text)."""
        tid = int(token_id)
        if not 0 <= tid < self.vocab_size:
            raise ValueError(f"token id {tid} is outside the vocabulary (size {self.vocab_size})")
        return self._token_bytes[tid]

    def token_to_id(self, text: str) -> int | None:
        return self._hf.token_to_id(text)

    def _piece(self, token_id: int, first: bool, skip_special: bool) -> bytes | None:
        """Bytes of one token in a decode; None when skipped. ``first``: no text emitted before it."""
        tid = int(token_id)
        if skip_special and tid in self._special:
            return None
        b = self.token_bytes(tid)
        if first and self._strip_leading_space and b[:1] == b" ":
            b = b[1:]
        return b

    def decode(self, ids: Iterable[int], skip_special: bool = False) -> str:
        """Text of ``ids``; invalid UTF-8 (e.g. a truncated character) becomes U+FFFD.

        Control tokens are rendered as their text unless ``skip_special``.
        """
        parts = []
        first = True
        for tid in ids:
            b = self._piece(tid, first, skip_special)
            if b is None:
                continue
            parts.append(b)
            first = False
        return b"".join(parts).decode("utf-8", errors="replace")

    def detokenizer(self, skip_special: bool = False) -> StreamDecoder:
        return StreamDecoder(self, skip_special=skip_special)

    # -- chat template -----------------------------------------------------------------------------
    def apply_chat_template(self, messages: Sequence[dict], add_generation_prompt: bool = True, **kwargs: Any) -> str:
        """Render ``messages`` with the model's ``tokenizer.chat_template`` (ChatML when it has none).

        Extra keyword arguments (``tools=...``, ``documents=...``) become template variables.
        """

        template = self._compiled_template()
        variables = {
            "bos_token": self.tokens[self.bos_id] if self.bos_id is not None else "",
            "eos_token": self.tokens[self.eos_id] if self.eos_id is not None else "",
            **kwargs,
            "messages": list(messages),
            "add_generation_prompt": add_generation_prompt,
        }

        try:
            return render(template, variables)  # time, output, depth and memory limits
        except ChatTemplateError:
            raise
        except jinja2.TemplateError as e:
            raise ChatTemplateError(f"tokenizer.chat_template: render failed: {_one_line(e)}") from None
        except Exception as e:  # noqa: BLE001 - the template is the file's code: a failure in it is its error ...
            if raised_by_guild(e):  # ... but one in guild's filters and guards is a bug, to surface as one
                raise
            raise ChatTemplateError(
                f"tokenizer.chat_template: render failed ({type(e).__name__}: {_one_line(e)})"
            ) from None

    def _compiled_template(self):
        if self._template_cache is None:


            env = GuardedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
            env.filters["tojson"] = _tojson
            env.globals["raise_exception"] = _raise_exception
            env.globals["strftime_now"] = _strftime_now
            source = self.chat_template if self.chat_template else CHATML_TEMPLATE
            guard_filters(env)
            try:
                self._template_cache = env.from_string(source)
            except jinja2.TemplateError as e:
                raise MetadataError(f"tokenizer.chat_template: invalid Jinja template: {_one_line(e)}") from None
            except (RecursionError, MemoryError, ValueError, OverflowError) as e:  # pathological nesting
                raise MetadataError(f"tokenizer.chat_template: cannot compile ({type(e).__name__})") from None
        return self._template_cache

    def __repr__(self) -> str:
        return (
            f"Tokenizer(model={self.model!r}, pre={self.pre!r}, vocab_size={self.vocab_size}, "
            f"bos_id={self.bos_id}, eos_ids={sorted(self.eos_ids)})"
        )


class StreamDecoder:
    """Incremental detokenizer: ``push(id)`` returns the text completed by that token.

    Bytes of a UTF-8 character split across byte-level tokens are held back until the character is
    complete, so no U+FFFD is emitted for valid UTF-8; ``flush()`` returns whatever is still held
    (as U+FFFD if the sequence ended mid-character). The concatenation of all ``push`` results and
    ``flush()`` equals ``Tokenizer.decode`` of the same ids.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special: bool = False):
        self._tok = tokenizer
        self._skip_special = skip_special
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._first = True
        self.ids: list[int] = []

    def push(self, token_id: int) -> str:
        tid = int(token_id)
        b = self._tok._piece(tid, self._first, self._skip_special)
        self.ids.append(tid)
        if b is None:
            return ""
        self._first = False
        return self._utf8.decode(b)

    def flush(self) -> str:
        out = self._utf8.decode(b"", final=True)
        self._utf8.reset()
        return out

    @property
    def pending(self) -> bool:
        """True while bytes of an incomplete character are held back."""
        return bool(self._utf8.getstate()[0])


# ------------------------------------------------------------------------------------------------
# chat-template helpers (as transformers' apply_chat_template provides them)
# ------------------------------------------------------------------------------------------------
def _raise_exception(message):
    raise ChatTemplateError(f"tokenizer.chat_template: {_one_line(ValueError(str(message)[:500]))}")


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    try:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
    except (TypeError, ValueError) as e:  # the template's value or arguments (not JSON, a circular list)
        raise ChatTemplateError(f"tokenizer.chat_template: tojson: {_one_line(e)}") from None


def _strftime_now(fmt):
    try:
        return datetime.datetime.now().strftime(fmt)
    except (TypeError, ValueError) as e:  # the template's format
        raise ChatTemplateError(f"tokenizer.chat_template: strftime_now: {_one_line(e)}") from None


def _one_line(e: BaseException) -> str:
    s = str(e).strip()
    return s.splitlines()[0] if s else type(e).__name__
