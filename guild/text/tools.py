"""Tool calls (OpenAI's `tools`): the tools rendered into the prompt, the model's call text parsed back into calls,
and the grammar that forces a well-formed call when a request requires one.

A template that reads the Jinja `tools` variable gets the tools (and `tool_calls` / `role: tool` history) as it
expects them; one that does not gets them described in a system block, its history written in the Hermes form, as
llama.cpp's server does for such templates. Which text form the calls take is read from the template (FORMATS).
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass

from .grammar import Grammar, compile_grammar
from .tokenizer import Tokenizer


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # a JSON object's text, as OpenAI sends it
    id: str


@dataclass(frozen=True)
class CallFormat:
    """How one family of templates writes calls: a marker in the template's source that says it is this family,
    the text that opens a call (None: the call is a bare JSON object), the key of the arguments, the Lark wrapper
    of the calls (`{calls}` is the JSON schema of one call), and whether calls come as one JSON array."""

    name: str
    marker: str
    opener: str | None
    args_key: str
    lark: str
    array: bool = False


FORMATS = (
    CallFormat("hermes", "<tool_call>", "<tool_call>", "arguments",
               'start: "<tool_call>\\n" %json {calls} "\\n</tool_call>"\n'),
    CallFormat("mistral", "[TOOL_CALLS]", "[TOOL_CALLS]", "arguments",
               'start: "[TOOL_CALLS]" %json {array}\n', array=True),
    CallFormat("llama3", "<|python_tag|>", None, "parameters", "start: %json {calls}\n"),
)
GENERIC = FORMATS[0]  # templates without tool support: described in a system block, answered in this form

GENERIC_SYSTEM = (
    "You can call functions. To call one, answer with only this, nothing before or after it:\n"
    "<tool_call>\n{{\"name\": <function name>, \"arguments\": <arguments as a JSON object>}}\n</tool_call>\n"
    "A function's result comes back in <tool_response></tool_response> tags. The functions:\n<tools>\n{tools}\n"
    "</tools>"
)


def supports_tools(tok: Tokenizer) -> bool:
    src = tok.chat_template or ""
    return "tools" in src


def call_format(tok: Tokenizer) -> CallFormat:
    src = tok.chat_template or ""
    if not supports_tools(tok):
        return GENERIC
    return next((f for f in FORMATS if f.marker in src), GENERIC)


def render(tok: Tokenizer, messages: list[dict], tools: list[dict]) -> str:
    """The prompt for `messages` (OpenAI's, with `tool_calls` and role `tool`) offering `tools` (OpenAI's
    `{"type": "function", "function": {...}}` entries; empty: none offered)."""
    if supports_tools(tok):
        msgs = [_for_template(m) for m in messages]
        return tok.apply_chat_template(msgs, add_generation_prompt=True, **({"tools": tools} if tools else {}))
    msgs = [_generic(m) for m in messages]
    if tools:
        block = GENERIC_SYSTEM.format(tools="\n".join(json.dumps(t["function"], ensure_ascii=False) for t in tools))
        if msgs and msgs[0]["role"] == "system":
            msgs[0] = {"role": "system", "content": msgs[0]["content"] + "\n\n" + block}
        else:
            msgs.insert(0, {"role": "system", "content": block})
    return tok.apply_chat_template(msgs, add_generation_prompt=True)


def _for_template(m: dict) -> dict:
    """Templates index `tool_call.function.arguments` as a mapping (they `tojson` it): OpenAI's string parsed."""
    if not m.get("tool_calls"):
        return m
    calls = []
    for c in m["tool_calls"]:
        f = dict(c["function"])
        try:
            f["arguments"] = json.loads(f["arguments"])
        except ValueError:
            pass
        calls.append({**c, "function": f})
    return {**m, "tool_calls": calls}


def _generic(m: dict) -> dict:
    """History for a template that knows only text turns: calls and results written in the Hermes form."""
    if m["role"] == "tool":
        return {"role": "user", "content": f"<tool_response>\n{m['content']}\n</tool_response>"}
    if m.get("tool_calls"):
        calls = "\n".join("<tool_call>\n" + json.dumps({"name": c["function"]["name"], "arguments": _obj(
            c["function"]["arguments"])}, ensure_ascii=False) + "\n</tool_call>" for c in m["tool_calls"])
        return {"role": "assistant", "content": ((m.get("content") or "") + "\n" + calls).strip()}
    return {"role": m["role"], "content": m.get("content") or ""}


def _obj(arguments: str):
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments


def grammar(tok: Tokenizer, tools: list[dict], choice: str | None, where: str = "tool_choice") -> Grammar:
    """The grammar of one call in the template's form, to any of `tools` or only to `choice`: then the matcher
    allows only the end of the reply (a small model told it may call again would repeat the call until the
    token limit; parallel calls are for `tool_choice: auto`)."""
    fmt = call_format(tok)
    one = [{"type": "object", "properties": {"name": {"const": t["function"]["name"]},
                                             fmt.args_key: t["function"].get("parameters") or {"type": "object"}},
            "required": ["name", fmt.args_key], "additionalProperties": False}
           for t in tools if choice is None or t["function"]["name"] == choice]
    calls = json.dumps({"anyOf": one})
    array = json.dumps({"type": "array", "items": {"anyOf": one}, "minItems": 1, "maxItems": 1})
    return compile_grammar("lark", fmt.lark.replace("{calls}", calls).replace("{array}", array), tok, where)


def parse(text: str, tok: Tokenizer, names: set[str]) -> tuple[str, list[ToolCall]]:
    """(content, calls) of the model's reply: well-formed calls to offered tools become calls, the text before
    them content; anything else (malformed JSON, an unknown tool, an unclosed call) stays content. A call's
    `arguments` is the model's own text of the arguments object, so the fragments a stream sent add up to it."""
    fmt = call_format(tok)
    if fmt.opener is None:
        found = _json_calls(text.removeprefix("<|python_tag|>").strip(), fmt, names)
        return ("", found) if found else (text, [])
    i = text.find(fmt.opener)
    if i < 0:
        return text, []
    body = text[i:]
    if fmt.array:
        found = _json_calls(body[len(fmt.opener):].strip(), fmt, names)
    else:
        parts = re.findall(r"<tool_call>\s*(.*?)\s*</tool_call>", body, re.S)
        rest = re.sub(r"<tool_call>\s*.*?\s*</tool_call>", "", body, flags=re.S).strip()
        found = [c for p in parts for c in _json_calls(p, fmt, names)] if not rest else []
        if len(found) != len(parts):
            found = []
    return (text[:i].rstrip(), found) if found else (text, [])


_DECODER = json.JSONDecoder()
_WS = re.compile(r"\s*")


def _object(s: str, i: int) -> tuple[dict[str, tuple[object, str]], int] | None:
    """The JSON object at s[i:] (after whitespace) as {key: (value, the value's text)} and where it ends, or None
    where there is none; the value texts are what `arguments` keeps."""
    i = _WS.match(s, i).end()
    if s[i:i + 1] != "{":
        return None
    i = _WS.match(s, i + 1).end()
    out: dict[str, tuple[object, str]] = {}
    if s[i:i + 1] == "}":
        return out, i + 1
    try:
        while True:
            key, i = _DECODER.raw_decode(s, i)
            i = _WS.match(s, i).end()
            if not isinstance(key, str) or s[i:i + 1] != ":":
                return None
            j = _WS.match(s, i + 1).end()
            value, i = _DECODER.raw_decode(s, j)
            out[key] = (value, s[j:i])
            i = _WS.match(s, i).end()
            sep, i = s[i:i + 1], _WS.match(s, i + 1).end()
            if sep == "}":
                return out, i
            if sep != ",":
                return None
    except ValueError:
        return None


def _json_calls(s: str, fmt: CallFormat, names: set[str]) -> list[ToolCall]:
    """The calls in `s`, the whole of which is one call object or (array formats) a JSON array of them; [] where
    any part of it is not a well-formed call to an offered tool."""
    objs, i = [], 0
    if s.startswith("["):
        i = _WS.match(s, 1).end()
        while s[i:i + 1] != "]":
            got = _object(s, i)
            if got is None:
                return []
            objs.append(got[0])
            i = _WS.match(s, got[1]).end()
            if s[i:i + 1] == ",":
                i = _WS.match(s, i + 1).end()
            elif s[i:i + 1] != "]":
                return []
        i += 1
    else:
        got = _object(s, 0)
        if got is None:
            return []
        objs, i = [got[0]], got[1]
    if not objs or s[i:].strip():
        return []
    out = []
    for c in objs:
        name = c.get("name", (None,))[0]
        args = next((c[k] for k in (fmt.args_key, "arguments", "parameters") if k in c), None)
        if not isinstance(name, str) or name not in names or args is None or not isinstance(args[0], dict):
            return []
        out.append(ToolCall(name, args[1], "call_" + secrets.token_hex(12)))
    return out


@dataclass(frozen=True)
class CallDelta:
    """A piece of a streamed call: its first (`call` set: id and name, `arguments` "") or a fragment of its
    arguments text."""

    index: int
    arguments: str = ""
    call: ToolCall | None = None


# a Hermes call up to its arguments object: the name (without escapes) must have arrived before the call streams
_HERMES_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"([^"\\]*)"\s*,\s*"arguments"\s*:\s*(?=\{)')
_HERMES_TAIL = re.compile(r"\s*\}\s*</tool_call>")


class CallStream:
    """Streamed content with tools on. Text is passed on until it could be the start of a call (the format's
    opener, or a bare JSON object for formats without one; whitespace before it is held). A Hermes call then
    streams as it is generated: its id and name once the name is complete and offered, then its arguments text
    fragment by fragment; the end of the reply (`finish`) checks the whole text as `parse` does. Other forms, and
    a call whose start does not take that shape, are held until the end and parsed whole."""

    def __init__(self, tok: Tokenizer, names: set[str]):
        self.fmt, self.names = call_format(tok), names
        self.text = ""
        self.sent = 0  # content sent up to here
        self.pos = 0  # where the calls' text is read on from
        self.state = "content"  # content, head, args, tail, between, hold
        self.streamed: list[ToolCall] = []  # calls whose start was sent; arguments as far as sent
        self.depth, self.quoted, self.escaped = 0, False, False  # the arguments object's scanner

    def push(self, piece: str) -> tuple[str, list[CallDelta]]:
        """(content to send, call deltas to send after it) for the next piece of the reply's text."""
        self.text += piece
        if self.state == "content":
            return self._content(), self._calls()
        return "", self._calls()

    def _content(self) -> str:
        t, opener = self.text, self.fmt.opener
        if opener is None:
            if t.lstrip()[:1] in ("{", "<"):
                self.state = "hold"
                return ""
            return self._send(len(t.rstrip()))
        i = t.find(opener, self.sent)
        if i >= 0:
            self.pos = i + len(opener)
            self.state = "head" if not self.fmt.array else "hold"
            return self._send(len(t[:i].rstrip()))
        tail = next((n for n in range(min(len(opener) - 1, len(t) - self.sent), 0, -1)
                     if opener.startswith(t[-n:])), 0)
        return self._send(len(t[:len(t) - tail].rstrip()))

    def _send(self, upto: int) -> str:
        out = self.text[self.sent:upto]
        self.sent = max(self.sent, upto)
        return out

    def _calls(self) -> list[CallDelta]:
        out: list[CallDelta] = []
        t = self.text
        while True:
            if self.state == "head":
                m = _HERMES_HEAD.match(t, self.pos)
                if m is None:
                    return out
                if m[1] not in self.names:  # an unknown tool: parsed (and refused) at the end
                    self.state = "hold"
                    return out
                call = ToolCall(m[1], "", "call_" + secrets.token_hex(12))
                self.streamed.append(call)
                out.append(CallDelta(len(self.streamed) - 1, "", call))
                self.pos, self.state = m.end(), "args"
            elif self.state == "args":
                start, end = self.pos, self._scan()
                if end > start:
                    last = self.streamed[-1]
                    self.streamed[-1] = ToolCall(last.name, last.arguments + t[start:end], last.id)
                    out.append(CallDelta(len(self.streamed) - 1, t[start:end]))
                if self.state == "args":
                    return out
            elif self.state == "tail":
                m = _HERMES_TAIL.match(t, self.pos)
                if m is None:
                    return out
                self.pos, self.state = m.end(), "between"
            elif self.state == "between":
                rest = t[self.pos:].lstrip()
                if not rest.startswith(self.fmt.opener):
                    return out
                self.pos = len(t) - len(rest) + len(self.fmt.opener)
                self.state = "head"
            else:
                return out

    def _scan(self) -> int:
        """Reads the arguments object on from self.pos; returns how far it reaches (its end once closed, when the
        state moves on to the call's tail)."""
        t = self.text
        i = self.pos
        while i < len(t):
            c = t[i]
            i += 1
            if self.quoted:
                if self.escaped:
                    self.escaped = False
                elif c == "\\":
                    self.escaped = True
                elif c == '"':
                    self.quoted = False
            elif c == '"':
                self.quoted = True
            elif c in "{[":
                self.depth += 1
            elif c in "}]":
                self.depth -= 1
                if self.depth == 0:
                    self.state = "tail"
                    break
        self.pos = i
        return i

    def finish(self, tok: Tokenizer) -> tuple[str, list[ToolCall], bool]:
        """(the content not yet sent, the calls not yet sent, whether the reply is calls). Streamed calls that the
        whole text does not confirm (cut by max_tokens, broken after the name, text after the calls) end the reply
        as it stands, as OpenAI's API ends a call cut by max_tokens: the reply is then not calls."""
        content, calls = parse(self.text, tok, self.names)
        if self.streamed:
            ok = len(calls) >= len(self.streamed) and all(
                (a.name, a.arguments) == (b.name, b.arguments) for a, b in zip(self.streamed, calls, strict=False))
            return "", calls[len(self.streamed):] if ok else [], ok
        if calls:
            return content[self.sent:], calls, True
        return self.text[self.sent:], [], False
