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
    them content; anything else (malformed JSON, an unknown tool, an unclosed call) stays content."""
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


def _json_calls(s: str, fmt: CallFormat, names: set[str]) -> list[ToolCall]:
    try:
        v = json.loads(s)
    except ValueError:
        return []
    items = v if isinstance(v, list) else [v]
    out = []
    for c in items:
        if not isinstance(c, dict) or c.get("name") not in names:
            return []
        args = c.get(fmt.args_key, c.get("arguments", c.get("parameters")))
        if not isinstance(args, dict):
            return []
        out.append(ToolCall(c["name"], json.dumps(args, ensure_ascii=False), "call_" + secrets.token_hex(12)))
    return out


class CallStream:
    """Streamed content with tools on: text is passed on until it could be the start of a call (the format's
    opener, or a bare JSON object for formats without one), then held until the end, when `finish` parses it."""

    def __init__(self, tok: Tokenizer):
        fmt = call_format(tok)
        self.opener = fmt.opener
        self.text = ""
        self.sent = 0
        self.holding = False

    def push(self, piece: str) -> str:
        self.text += piece
        if self.holding:
            return ""
        if self.opener is None:
            if self.text.lstrip()[:1] in ("{", "<"):
                self.holding = True
                return ""
            return self._send(len(self.text))
        i = self.text.find(self.opener, self.sent)
        if i >= 0:
            self.holding = True
            return self._send(i)
        tail = next((n for n in range(min(len(self.opener) - 1, len(self.text) - self.sent), 0, -1)
                     if self.opener.startswith(self.text[-n:])), 0)
        return self._send(len(self.text) - tail)

    def _send(self, upto: int) -> str:
        out = self.text[self.sent:upto]
        self.sent = max(self.sent, upto)
        return out

    def finish(self, tok: Tokenizer, names: set[str]) -> tuple[str, list[ToolCall]]:
        """(the content not yet sent, the calls)."""
        content, calls = parse(self.text, tok, names)
        if calls:
            return content[self.sent:] if len(content) > self.sent else "", calls
        return self.text[self.sent:], []
