"""Text that comes from a user or a file they name: prompts (-p, -i lines) and conversation files, size-capped
and checked as UTF-8 before it reaches the tokenizer. Python hands argv and stdin bytes that are not UTF-8 over
as lone surrogates (PEP 383, surrogateescape); here they become a one-line error, or U+FFFD where asked."""

from __future__ import annotations

import os
from pathlib import Path

import yaml

from ..errors import BadFlagError, GuildError
from ..formats import safe_yaml
from ..formats.files import read_capped

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


ROLES = ("system", "user", "assistant")


def conversation_messages(path: str | os.PathLike, what: str = "--conversation") -> list[dict]:
    """Messages from a JSON or YAML file: a list of strings (user turns) or of {role, content} messages (role
    system, user or assistant; user when left out). A system message may only come first."""
    text = read_text_file(path, what)
    try:
        data = safe_yaml.load(text)
    except (yaml.YAMLError, safe_yaml.UnsafeYaml) as e:
        raise GuildError(f"{what} {path}: cannot read ({str(e).splitlines()[0]})") from None
    if not isinstance(data, list):
        raise GuildError(f"{what} {path}: expected a list of messages (strings or role/content)")
    msgs = []
    for i, m in enumerate(data):
        if isinstance(m, str):
            m = {"role": "user", "content": m}
        if not (isinstance(m, dict) and isinstance(m.get("content"), str) and m.get("role", "user") in ROLES):
            raise GuildError(f"{what} {path}: message {i + 1} is not a string or a role/content mapping "
                             f"(role: {', '.join(ROLES)})")
        role = m.get("role", "user")
        if role == "system" and msgs:
            raise GuildError(f"{what} {path}: message {i + 1}: a system message may only come first")
        msgs.append({"role": role, "content": prompt_text(m["content"], f"{what} {path}")})
    if not any(m["role"] == "user" for m in msgs):
        raise GuildError(f"{what} {path}: expected a list of user messages (strings or role/content)")
    return msgs


def conversation_turns(path: str | os.PathLike) -> tuple[str | None, list[str]]:
    """`--conversation FILE`: its system prompt (or None) and its user turns (assistant messages are what the
    model answers, so they are not replayed)."""
    msgs = conversation_messages(path)
    system = msgs[0]["content"] if msgs[0]["role"] == "system" else None
    return system, [m["content"] for m in msgs if m["role"] == "user"]


def prompt_source(prompt: str | None, file: str | os.PathLike | None, stdin=None) -> str | None:
    """The prompt of `-p TEXT`, `-p -` (standard input, read to its end) or `-f/--file FILE`."""
    import sys

    if prompt is not None and file is not None:
        raise BadFlagError("give either -p/--prompt or -f/--file, not both")
    if file is not None:
        return read_text_file(file, "-f/--file", MAX_PROMPT_CHARS * 4)
    if prompt == "-":
        stream = stdin or sys.stdin
        if stream.isatty():
            raise BadFlagError("-p -: standard input is a terminal; pipe the prompt in (or use -f FILE)")
        data = stream.buffer.read(MAX_PROMPT_CHARS * 4 + 1) if hasattr(stream, "buffer") else \
            stream.read(MAX_PROMPT_CHARS + 1).encode("utf-8", "surrogateescape")
        if len(data) > MAX_PROMPT_CHARS * 4:
            raise BadFlagError(f"-p -: standard input is over {MAX_PROMPT_CHARS * 4} bytes")
        try:
            return prompt_text(data.decode("utf-8"), "-p - (standard input)")
        except UnicodeDecodeError as e:
            raise BadFlagError(f"-p - (standard input): invalid UTF-8 at byte {e.start}") from None
    return None if prompt is None else prompt_text(prompt, "-p/--prompt")
