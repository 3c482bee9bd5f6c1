"""OpenAI request bodies → one validated `CompletionRequest` (untrusted input: every field's type and range is
checked before use; unknown fields are ignored, as OpenAI-compatible servers do; what guild cannot honour is a
400, not silently dropped). The field table is data: name → (kind, check, what the error says)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace

from ..engine.sampling import SamplingParams
from ..speculative.registry import strategies
from ..window import MAX_DRAFT

MAX_BODY_BYTES = 8 * 2**20  # a request body; prompts past any context are refused before tokenising
MAX_MESSAGES = 4096
MAX_STOP = 4  # OpenAI's limit
MAX_STOP_CHARS = 256
ROLES = ("system", "developer", "user", "assistant")


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
}
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


@dataclass(frozen=True)
class Defaults:
    """What a request gets for the fields it leaves out: `guild serve`'s flags (the sampling flags of `run`)."""

    sampling: SamplingParams = SamplingParams()
    strategy: str = "adaptive"
    max_draft: int = 4


def parse(body: bytes, chat: bool, defaults: Defaults = Defaults()) -> CompletionRequest:
    if len(body) > MAX_BODY_BYTES:
        raise RequestError(f"request body of {len(body)} bytes is over the limit of {MAX_BODY_BYTES}", status=413)
    try:
        d = json.loads(body)
    except (ValueError, RecursionError) as e:
        raise RequestError(f"request body is not valid JSON: {str(e)[:200]}") from None
    if not isinstance(d, dict):
        raise RequestError("request body must be a JSON object")
    v = {name: _field(d, name) for name in FIELDS}
    for name, why in (("logprobs", "logprobs"), ("tools", "tool calls"), ("functions", "function calls")):
        if d.get(name) not in (None, False, []):
            raise RequestError(f"'{name}' is not supported by guild serve ({why})", name)
    rf = d.get("response_format")
    if rf is not None and not (isinstance(rf, dict) and rf.get("type") == "text"):
        raise RequestError("'response_format' other than {\"type\": \"text\"} is not supported", "response_format")
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
        model=v["model"], return_tokens=bool(v["return_tokens"]),
    )


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
        out.append({"role": role, "content": _text(m.get("content"), f"messages[{i}].content")})
    return tuple(out)


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
