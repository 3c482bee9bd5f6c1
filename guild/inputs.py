"""Text that comes from a user or a file they name: prompts (-p, -i lines) and conversation files, size-capped
and checked as UTF-8 before it reaches the tokenizer. Python hands argv and stdin bytes that are not UTF-8 over
as lone surrogates (PEP 383, surrogateescape); here they become a one-line error, or U+FFFD where asked."""

from __future__ import annotations

import os
from pathlib import Path

import yaml

from . import safe_yaml
from .errors import BadFlagError, GuildError
from .files import read_capped

MAX_PROMPT_CHARS = 8 * 2**20  # far past any context window, small enough to tokenise
MAX_CONVERSATION_BYTES = 16 * 2**20
MAX_CORPUS_BYTES = 256 * 2**20  # a retrieval corpus: documents, not a dataset


def prompt_text(text: str, what: str, replace: bool = False) -> str:
    """`text` as given on the command line (or stdin): invalid UTF-8 is an error naming `what`, or U+FFFD with
    `replace`; too long is an error."""
    if len(text) > MAX_PROMPT_CHARS:
        raise BadFlagError(f"{what}: {len(text)} characters, over the limit of {MAX_PROMPT_CHARS}")
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        pass
    raw = text.encode("utf-8", "surrogateescape") if _escaped_only(text) else None
    if replace:
        return raw.decode("utf-8", "replace") if raw is not None else text.encode("utf-8", "replace").decode()
    if raw is None:
        raise BadFlagError(f"{what}: not valid Unicode text (lone surrogate code points)")
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadFlagError(f"{what}: invalid UTF-8 at byte {e.start} (0x{raw[e.start]:02x})") from None
    return raw.decode("utf-8")


def _escaped_only(text: str) -> bool:
    """Every surrogate is a surrogateescape'd byte (U+DC80..U+DCFF)."""
    try:
        text.encode("utf-8", "surrogateescape")
        return True
    except UnicodeEncodeError:
        return False


def read_text_file(path: str | os.PathLike, what: str, limit: int = MAX_CONVERSATION_BYTES,
                   errors: str = "strict") -> str:
    """A UTF-8 text file of at most `limit` bytes (read no further than that: /dev/zero ends here too);
    errors="replace" takes U+FFFD for invalid bytes instead of failing."""

    p = Path(path)
    data = read_capped(p, limit, f"{what} {p}")
    try:
        return data.decode("utf-8", errors)
    except UnicodeDecodeError as e:
        raise GuildError(f"{what} {p}: invalid UTF-8 at byte {e.start}") from None


def conversation_turns(path: str | os.PathLike) -> list[str]:
    """User turns from a JSON or YAML file: a list of strings or of {role, content} messages."""


    text = read_text_file(path, "--conversation")
    try:
        data = safe_yaml.load(text)
    except (yaml.YAMLError, safe_yaml.UnsafeYaml) as e:
        raise GuildError(f"--conversation {path}: cannot read ({str(e).splitlines()[0]})") from None
    turns = []
    for m in data if isinstance(data, list) else []:
        if isinstance(m, str):
            turns.append(m)
        elif isinstance(m, dict) and m.get("role", "user") == "user" and isinstance(m.get("content"), str):
            turns.append(m["content"])
    if not turns:
        raise GuildError(f"--conversation {path}: expected a list of user messages (strings or role/content)")
    return [prompt_text(t, f"--conversation {path}") for t in turns]
