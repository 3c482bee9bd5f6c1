"""OpenAI request bodies → one validated `CompletionRequest` (untrusted input: every field's type and range is
checked before use; unknown fields are ignored, as OpenAI-compatible servers do; what guild cannot honour is a
400, not silently dropped). The field table is data: name → (kind, check, what the error says)."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, replace

from ..engine.sampling import MAX_TOP_LOGPROBS, SamplingParams
from ..speculative.registry import strategies
from ..window import MAX_DRAFT

MAX_BODY_BYTES = 8 * 2**20  # a request body; prompts past any context are refused before tokenising
MAX_MESSAGES = 4096
MAX_STOP = 4  # OpenAI's limit
MAX_STOP_CHARS = 256
ROLES = ("system", "developer", "user", "assistant", "tool")
MAX_TOOLS = 128
TOOL_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")  # OpenAI's function names


class RequestError(Exception):
    """A request guild refuses: HTTP `status`, an OpenAI-style error object."""

    def __init__(self, message: str, param: str | None = None, status: int = 400,
                 code: str | None = None, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.message, self.param, self.status, self.code, self.kind = message, param, status, code, kind

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


def _number(lo: float, hi: float, lo_open: bool = False):
    def check(v):
        return math.isfinite(v) and (v > lo if lo_open else v >= lo) and v <= hi
    return check


# name → (accepted JSON kinds, check, the range in words); `None` values mean "use the default" as in OpenAI
FIELDS = {
    "temperature": ("number", _number(0.0, 2.0), "a number in [0, 2]"),
    "top_p": ("number", _number(0.0, 1.0, lo_open=True), "a number in (0, 1]"),
    "presence_penalty": ("number", _number(-2.0, 2.0), "a number in [-2, 2]"),
    "frequency_penalty": ("number", _number(-2.0, 2.0), "a number in [-2, 2]"),
    "seed": ("integer", lambda v: 0 <= v < 2**63, "an integer in [0, 2^63)"),
    "max_tokens": ("integer", lambda v: v >= 1, "an integer >= 1"),
    "max_completion_tokens": ("integer", lambda v: v >= 1, "an integer >= 1"),
    "n": ("integer", lambda v: v == 1, "1 (guild returns one choice)"),
    "stream": ("boolean", None, "true or false"),
    "model": ("string", None, "a string"),
    # extensions, named as llama.cpp's server names them
    "top_k": ("integer", lambda v: 0 <= v <= 2**31, "an integer >= 0 (0 = off)"),
    "min_p": ("number", _number(0.0, 1.0), "a number in [0, 1]"),
    "repeat_penalty": ("number", _number(0.0, 100.0, lo_open=True), "a number in (0, 100]"),
    "repeat_last_n": ("integer", lambda v: v >= -1, "an integer >= -1 (-1 = all)"),
    "decode_strategy": ("string", lambda v: v in strategies(), f"one of {', '.join(strategies())}"),
    "spec_max_draft": ("integer", lambda v: 0 <= v <= MAX_DRAFT, f"an integer in 0..{MAX_DRAFT}"),
    "return_tokens": ("boolean", None, "true or false"),
    "top_logprobs": ("integer", lambda v: 0 <= v <= MAX_TOP_LOGPROBS, f"an integer in 0..{MAX_TOP_LOGPROBS}"),
}
MAX_LEGACY_LOGPROBS = 5  # /v1/completions' `logprobs` is a count, at most 5 in OpenAI's API
_KINDS = {"number": (int, float), "integer": (int,), "boolean": (bool,), "string": (str,)}


@dataclass(frozen=True)
class CompletionRequest:
    chat: bool
    messages: tuple[dict, ...]  # chat: [{"role", "content": str}]
    prompt: str  # completions
    max_tokens: int | None  # None: up to the context
    sampling: SamplingParams
    seeded: bool  # the request named a seed (else the server draws one)
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool
    strategy: str
    max_draft: int
    model: str | None
    return_tokens: bool
    logprobs: int | None = None  # None: none; else each token's log-probability and this many alternatives
    grammar: tuple[str, object, str] | None = None  # (kind, spec, the field it came from): compiled by the app
    tools: tuple[dict, ...] = ()  # OpenAI's {"type": "function", "function": {name, description, parameters}}
    tool_choice: str = "none"  # auto | none | required | the one function's name (`named` True)
    named: bool = False


@dataclass(frozen=True)
class Defaults:
    """What a request gets for the fields it leaves out: `guild serve`'s flags (the sampling flags of `run`)."""

    sampling: SamplingParams = SamplingParams()
    strategy: str = "adaptive"
    max_draft: int = 4


def parse(body: bytes, chat: bool, defaults: Defaults = Defaults()) -> CompletionRequest:
    if len(body) > MAX_BODY_BYTES:
        raise RequestError(f"request body of {len(body)} bytes is over the limit of {MAX_BODY_BYTES}", status=413)
    try:  # JSON in HTTP is UTF-8 (RFC 8259); json.loads alone would also take UTF-16 and UTF-32
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RequestError(f"request body is not UTF-8 (byte 0x{body[e.start]:02x} at offset {e.start})") from None
    try:
        d = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise RequestError(f"request body is not valid JSON: {str(e)[:200]}") from None
    if not isinstance(d, dict):
        raise RequestError("request body must be a JSON object")
    v = {name: _field(d, name) for name in FIELDS}
    if d.get("functions") not in (None, []):
        raise RequestError("'functions' is not supported by guild serve: use 'tools'", "functions")
    tools, tool_choice = _tools(d) if chat else ((), ("none", False))
    messages, prompt = (_messages(d.get("messages")), "") if chat else ((), _prompt(d.get("prompt")))
    so = d.get("stream_options")
    if so is not None and not (isinstance(so, dict) and isinstance(so.get("include_usage", False), bool)):
        raise RequestError("'stream_options' must be an object like {\"include_usage\": true}", "stream_options")
    sp = defaults.sampling
    overrides = {k: v[k] for k in ("temperature", "top_p", "top_k", "min_p", "repeat_penalty", "presence_penalty",
                                   "frequency_penalty", "seed") if v[k] is not None}
    if v["repeat_last_n"] is not None:
        overrides["penalty_last_n"] = v["repeat_last_n"]
    max_tokens = v["max_completion_tokens"] if v["max_completion_tokens"] is not None else v["max_tokens"]
    return CompletionRequest(
        chat=chat, messages=messages, prompt=prompt, max_tokens=max_tokens,
        sampling=replace(sp, **overrides), seeded=v["seed"] is not None, stop=_stop(d.get("stop")),
        stream=bool(v["stream"]), include_usage=bool(so and so.get("include_usage")),
        strategy=v["decode_strategy"] or defaults.strategy,
        max_draft=defaults.max_draft if v["spec_max_draft"] is None else v["spec_max_draft"],
        model=v["model"], return_tokens=bool(v["return_tokens"]), logprobs=_logprobs(d, v, chat),
        grammar=_grammar(d), tools=tools, tool_choice=tool_choice[0], named=tool_choice[1],
    )


def _grammar(d: dict) -> tuple[str, object, str] | None:
    """`response_format` (json_object, json_schema) or guild's `grammar` (llguidance's Lark) / `regex`."""
    found = []
    rf = d.get("response_format")
    if rf is not None:
        kind = rf.get("type") if isinstance(rf, dict) else None
        if kind == "json_object":
            found.append(("json_object", None, "response_format"))
        elif kind == "json_schema":
            js = rf.get("json_schema")
            if not isinstance(js, dict) or not isinstance(js.get("schema", {}), dict):
                raise RequestError("'response_format.json_schema' must be an object with a 'schema' object",
                                   "response_format.json_schema")
            found.append(("json_schema", js.get("schema", {}), "response_format.json_schema.schema"))
        elif kind != "text":
            raise RequestError("'response_format.type' must be text, json_object or json_schema",
                               "response_format")
    for name, kind in (("grammar", "lark"), ("regex", "regex")):
        if d.get(name) is not None:
            if not isinstance(d[name], str) or not d[name].strip():
                raise RequestError(f"'{name}' must be a non-empty string", name)
            found.append((kind, d[name], name))
    if len(found) > 1:
        raise RequestError(f"'{found[1][2]}' and '{found[0][2]}' cannot both constrain one reply", found[1][2])
    return found[0] if found else None


def _tools(d: dict) -> tuple[tuple[dict, ...], tuple[str, bool]]:
    ts = d.get("tools")
    if ts in (None, []):
        ts = []
    if not isinstance(ts, list) or len(ts) > MAX_TOOLS:
        raise RequestError(f"'tools' must be a list of at most {MAX_TOOLS} tools", "tools")
    out, names = [], set()
    for i, t in enumerate(ts):
        f = t.get("function") if isinstance(t, dict) and t.get("type") == "function" else None
        if not isinstance(f, dict) or not isinstance(f.get("name"), str) or not TOOL_NAME.fullmatch(f["name"]):
            raise RequestError(f"tools[{i}] must be {{\"type\": \"function\", \"function\": {{\"name\": ...}}}} with a "
                               "name of 1-64 letters, digits, '_', '.' or '-'", f"tools[{i}].function.name")
        if f["name"] in names:
            raise RequestError(f"tools[{i}]: a second function named '{f['name']}'", f"tools[{i}].function.name")
        names.add(f["name"])
        params = f.get("parameters", {"type": "object", "properties": {}})
        if isinstance(params, str):  # a schema sent as text must at least be JSON
            try:
                params = json.loads(params)
            except ValueError:
                params = None
        if not isinstance(params, dict):
            raise RequestError(f"tools[{i}].function.parameters must be a JSON schema object",
                               f"tools[{i}].function.parameters")
        desc = f.get("description", "")
        if not isinstance(desc, str):
            raise RequestError(f"tools[{i}].function.description must be a string", f"tools[{i}].function.description")
        out.append({"type": "function", "function": {"name": f["name"], "description": desc, "parameters": params}})
    tc = d.get("tool_choice")
    if tc is None:
        choice = ("auto" if out else "none", False)
    elif tc in ("auto", "none", "required"):
        choice = (tc, False)
    elif isinstance(tc, dict) and tc.get("type") == "function" and isinstance(tc.get("function"), dict):
        choice = (tc["function"].get("name"), True)
    else:
        raise RequestError("'tool_choice' must be auto, none, required or {\"type\": \"function\", \"function\": "
                           "{\"name\": ...}}", "tool_choice")
    if choice[0] != "none" and not out:
        raise RequestError("'tool_choice' needs 'tools'", "tool_choice")
    if choice[1] and choice[0] not in names:
        raise RequestError(f"'tool_choice' names no tool in 'tools': {json.dumps(choice[0])[:80]}", "tool_choice")
    return tuple(out), choice


def _logprobs(d: dict, v: dict, chat: bool) -> int | None:
    """Chat: `logprobs` true and `top_logprobs` alternatives (0..20); completions: `logprobs` N (0..5)."""
    lp = d.get("logprobs")
    if chat:
        if lp is not None and not isinstance(lp, bool):
            raise RequestError(f"'logprobs' must be true or false, got {json.dumps(lp)[:80]}", "logprobs")
        if v["top_logprobs"] is not None and not lp:
            raise RequestError("'top_logprobs' needs 'logprobs': true", "top_logprobs")
        return (v["top_logprobs"] or 0) if lp else None
    if lp is None:
        return None
    if isinstance(lp, bool) or not isinstance(lp, int) or not 0 <= lp <= MAX_LEGACY_LOGPROBS:
        raise RequestError(f"'logprobs' must be an integer in 0..{MAX_LEGACY_LOGPROBS}, got {json.dumps(lp)[:80]}",
                           "logprobs")
    return lp


def _field(d: dict, name: str):
    x = d.get(name)
    if x is None:
        return None
    kind, check, words = FIELDS[name]
    ok = isinstance(x, _KINDS[kind]) and (kind == "boolean" or not isinstance(x, bool))
    if ok and kind == "number":
        x = float(x)
    if not ok or (check is not None and not check(x)):
        raise RequestError(f"'{name}' must be {words}, got {json.dumps(x)[:80]}", name)
    return x


def _text(content, where: str) -> str:
    """A message's content: a string or a list of {"type": "text", "text": ...} parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                         and isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)
    raise RequestError(f"{where} must be a string or a list of text parts", where)


def _messages(ms) -> tuple[dict, ...]:
    if not isinstance(ms, list) or not ms:
        raise RequestError("'messages' must be a non-empty list", "messages")
    if len(ms) > MAX_MESSAGES:
        raise RequestError(f"'messages' holds {len(ms)} entries, over the limit of {MAX_MESSAGES}", "messages")
    out = []
    for i, m in enumerate(ms):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise RequestError(f"messages[{i}].role must be one of {', '.join(ROLES)}", f"messages[{i}].role")
        role = "system" if m["role"] == "developer" else m["role"]
        msg = {"role": role}
        calls = m.get("tool_calls") if role == "assistant" else None
        if calls:
            msg["tool_calls"] = _calls(calls, f"messages[{i}].tool_calls")
            msg["content"] = "" if m.get("content") is None else _text(m["content"], f"messages[{i}].content")
        else:
            msg["content"] = _text(m.get("content"), f"messages[{i}].content")
        if role == "tool":
            if not isinstance(m.get("tool_call_id"), str):
                raise RequestError(f"messages[{i}].tool_call_id must be a string", f"messages[{i}].tool_call_id")
            msg["tool_call_id"] = m["tool_call_id"]
            if isinstance(m.get("name"), str):
                msg["name"] = m["name"]
        out.append(msg)
    return tuple(out)


def _calls(calls, where: str) -> list[dict]:
    """An assistant turn's `tool_calls` as the history gives them back."""
    if not isinstance(calls, list):
        raise RequestError(f"{where} must be a list", where)
    out = []
    for j, c in enumerate(calls):
        f = c.get("function") if isinstance(c, dict) else None
        if not isinstance(f, dict) or not isinstance(f.get("name"), str) or not isinstance(f.get("arguments"), str):
            raise RequestError(f"{where}[{j}] must have a function with a name and arguments (a string)",
                               f"{where}[{j}]")
        out.append({"id": str(c.get("id", "")), "type": "function",
                    "function": {"name": f["name"], "arguments": f["arguments"]}})
    return out


def _prompt(p) -> str:
    if isinstance(p, list) and len(p) == 1:
        p = p[0]
    if not isinstance(p, str) or not p:
        raise RequestError("'prompt' must be a non-empty string (one prompt per request)", "prompt")
    return p


def _stop(s) -> tuple[str, ...]:
    if s is None:
        return ()
    items = [s] if isinstance(s, str) else s
    if not isinstance(items, list) or len(items) > MAX_STOP or not all(
            isinstance(x, str) and 0 < len(x) <= MAX_STOP_CHARS for x in items):
        raise RequestError(f"'stop' must be a string or a list of at most {MAX_STOP} non-empty strings of at most "
                           f"{MAX_STOP_CHARS} characters", "stop")
    return tuple(items)
