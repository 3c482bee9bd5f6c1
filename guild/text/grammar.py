"""Grammars for constrained decoding, compiled by llguidance (the library llama.cpp and vLLM use): a JSON schema,
any JSON object, a Lark grammar (llguidance's dialect: regexes, `%json{...}` schemas inline) or a regex.

llguidance computes a token mask from the grammar's state in tens of microseconds on a 49k vocabulary (measured
in docs/serving.md), with no extra dependencies; xgrammar needs torch. The engine only sees
guild.engine.constraint.Constraint, one fresh matcher per generation."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass

import llguidance

from ..engine.constraint import Constraint
from ..errors import GuildError
from .tokenizer import Tokenizer
from .vocab import TT_CONTROL, TT_UNKNOWN

KINDS = ("json_schema", "json_object", "lark", "regex")
# whitespace between JSON tokens: a space, or one or two newlines and an indent of at most 20 (llama.cpp's
# json-schema-to-grammar `space` rule), so a model cannot loop on blank lines until max_tokens
JSON_OPTIONS = {"whitespace_pattern": r"(?: |\n{1,2}[ \t]{0,20})?"}
MAX_GRAMMAR_CHARS = 2**20  # a schema or grammar as text: real ones are a few KiB


class GrammarError(GuildError):
    """A schema or grammar that does not compile; `where` names where it came from (a flag, a request field)."""

    def __init__(self, where: str, why: str):
        super().__init__(f"{where}: {why}")
        self.where = where


@dataclass(frozen=True)
class Grammar:
    kind: str  # one of KINDS
    source: str  # llguidance's grammar text (validated against the tokenizer)


class _Vocab:
    """The tokenizer as llguidance's TokenizerWrapper reads it: each id's exact bytes, the control tokens (which
    text never matches), and an encoder for text the grammar forces."""

    def __init__(self, tok: Tokenizer):
        self.tok = tok
        self.eos_token_id = tok.eos_id if tok.eos_id is not None else min(tok.eos_ids, default=0)
        self.bos_token_id = tok.bos_id
        self.tokens = [tok.token_bytes(i) for i in range(tok.vocab_size)]
        self.special_token_ids = [i for i, t in enumerate(tok.token_types) if t in (TT_CONTROL, TT_UNKNOWN)]

    def __call__(self, text: str) -> list[int]:
        return self.tok.encode(text, parse_special=False)


@functools.lru_cache(maxsize=4)
def _ll_tokenizer(tok: Tokenizer):
    """llguidance's view of the vocabulary (about 0.4 s for 49k tokens: built once per tokenizer)."""
    v = _Vocab(tok)
    eos = sorted(tok.eos_ids) or [v.eos_token_id]
    return llguidance.LLTokenizer(llguidance.TokenizerWrapper(v), eos_token=eos)


def compile_grammar(kind: str, spec, tok: Tokenizer | None, where: str) -> Grammar:
    """`spec`: a JSON schema (dict or JSON text) for json_schema, ignored for json_object, the grammar's text for
    lark and regex. Checked against the tokenizer now, so a bad one fails here, naming `where`; tok None checks
    all but what needs the vocabulary (special tokens), e.g. before a model loads."""
    if kind not in KINDS:
        raise GrammarError(where, f"unknown grammar kind '{kind}' (one of {', '.join(KINDS)})")
    try:
        if kind == "json_object":
            source = llguidance.LLMatcher.grammar_from_json_schema({"type": "object"}, defaults=JSON_OPTIONS)
        elif kind == "json_schema":
            if isinstance(spec, str):
                spec = json.loads(spec)
            if not isinstance(spec, dict):
                raise GrammarError(where, "a JSON schema must be a JSON object")
            if len(json.dumps(spec)) > MAX_GRAMMAR_CHARS:
                raise GrammarError(where, f"the schema is over {MAX_GRAMMAR_CHARS} characters")
            source = llguidance.LLMatcher.grammar_from_json_schema(spec, defaults=JSON_OPTIONS)
        else:
            if not isinstance(spec, str) or not spec.strip():
                raise GrammarError(where, f"the {kind} is empty")
            if len(spec) > MAX_GRAMMAR_CHARS:
                raise GrammarError(where, f"the {kind} is over {MAX_GRAMMAR_CHARS} characters")
            source = (llguidance.LLMatcher.grammar_from_lark if kind == "lark"
                      else llguidance.LLMatcher.grammar_from_regex)(spec)
    except (ValueError, RecursionError) as e:
        raise GrammarError(where, _one_line(e)) from None
    bad, msgs = llguidance.LLMatcher.validate_grammar_with_warnings(source, None if tok is None else _ll_tokenizer(tok))
    if bad:
        raise GrammarError(where, _one_line(msgs[0]) if msgs else "does not compile")
    return Grammar(kind, source)


def constraint(g: Grammar, tok: Tokenizer) -> Constraint:
    """A fresh matcher for one generation."""
    m = llguidance.LLMatcher(_ll_tokenizer(tok), g.source, log_level=0)
    if m.is_error():
        raise GrammarError("grammar", _one_line(m.get_error()))
    return Constraint(m, tok.vocab_size, tok.eos_ids)


def _one_line(e) -> str:
    s = str(e).strip()
    return s.splitlines()[0][:300] if s else type(e).__name__
