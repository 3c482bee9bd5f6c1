"""`guild serve` for agents, through the official `openai` client: log-probabilities, JSON-schema output that every
strategy emits exactly as constrained `normal` does, and a two-step tool-call loop (a call, its result, an answer),
plain and streamed, with a template that offers tools (tests/serve/hermes_tools.jinja, the Hermes/Qwen form); the
400s name the field."""

import json
import math
from pathlib import Path

import pytest

openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")

from tests.serve.test_serve import MODEL, _post, _start, _stop  # noqa: E402

pytestmark = pytest.mark.slow

TEMPLATE = Path(__file__).resolve().parent / "hermes_tools.jinja"
STRATEGIES = ["normal", "lookup", "adaptive"]
PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 16}, "age": {"type": "integer", "minimum": 0, "maximum": 130},
    "languages": {"type": "array", "items": {"enum": ["English", "French", "German", "Italian"]}, "maxItems": 3}},
    "required": ["name", "age", "languages"], "additionalProperties": False}
CITY = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                         "country": {"type": "string", "maxLength": 20},
                                         "capital": {"type": "boolean"}},
        "required": ["city", "country", "capital"], "additionalProperties": False}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24},
                                                    "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {"name": "get_time", "description": "The local time in a city",
                                         "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                        "required": ["city"]}}}
ASK = [{"role": "user", "content": "What is the weather like in Paris today?"}]


@pytest.fixture(scope="module")
def server():
    p, port = _start("--parallel", "4", "--chat-template", str(TEMPLATE))
    yield port
    _stop(p)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"http://127.0.0.1:{server}/v1", api_key="none", max_retries=0, timeout=600)


def _chat(client, messages, strategy="adaptive", **kw):
    return client.chat.completions.create(model=MODEL, messages=messages, max_tokens=kw.pop("max_tokens", 48),
                                          extra_body={"return_tokens": True, "decode_strategy": strategy}, **kw)


def test_logprobs_are_the_same_for_every_strategy(client):
    msgs = [{"role": "user", "content": "Name three colours of the rainbow."}]
    got = {s: _chat(client, msgs, s, max_tokens=12, temperature=0, logprobs=True, top_logprobs=3) for s in STRATEGIES}
    r = got["normal"]
    content = r.choices[0].logprobs.content
    assert "".join(c.token for c in content) == r.choices[0].message.content
    for c in content:  # greedy: the emitted token is the most likely one
        assert len(c.top_logprobs) == 3 and c.top_logprobs[0].token == c.token
        assert c.top_logprobs[0].logprob == c.logprob <= 0 and c.top_logprobs[1].logprob <= c.logprob
        assert bytes(c.bytes).decode("utf-8", "replace") == c.token
    want = [(c.token, c.logprob, [(t.token, t.logprob) for t in c.top_logprobs]) for c in content]
    for s in STRATEGIES[1:]:
        assert [(c.token, c.logprob, [(t.token, t.logprob) for t in c.top_logprobs])
                for c in got[s].choices[0].logprobs.content] == want, s
    streamed = [c for ch in client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=12, temperature=0,
                                                            logprobs=True, top_logprobs=3, stream=True)
                if ch.choices and ch.choices[0].logprobs for c in ch.choices[0].logprobs.content]
    assert [(c.token, c.logprob) for c in streamed] == [(w[0], w[1]) for w in want]
    legacy = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=6, temperature=0,
                                       logprobs=2)
    lp = legacy.choices[0].logprobs
    assert "".join(lp.tokens) == legacy.choices[0].text and len(lp.top_logprobs[0]) == 2
    assert all(math.isfinite(x) and x <= 0 for x in lp.token_logprobs)


@pytest.mark.parametrize("schema, ask", [
    (PERSON, "Describe Ada Lovelace as a JSON object."),
    (CITY, "Give me a city in Europe as JSON."),
])
@pytest.mark.parametrize("sampling", ["greedy", "seeded"])
def test_json_schema_output_validates_and_every_strategy_equals_normal(client, schema, ask, sampling):
    kw = dict(temperature=0) if sampling == "greedy" else dict(temperature=0.8, top_p=0.95, seed=99)
    rf = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": True}}
    msgs = [{"role": "user", "content": ask}]
    got = {s: _chat(client, msgs, s, max_tokens=64, response_format=rf, **kw) for s in STRATEGIES}
    want = got["normal"].model_extra["guild"]["tokens"]
    for s, r in got.items():
        assert r.choices[0].finish_reason == "stop", (s, r.choices[0].message.content)
        jsonschema.validate(json.loads(r.choices[0].message.content), schema)
        assert r.model_extra["guild"]["tokens"] == want, s


def test_json_object(client):
    """Any JSON object: it parses when the model closes it (an open one at max_tokens is still JSON's prefix)."""
    for s in ("normal", "adaptive"):
        r = _chat(client, [{"role": "user", "content": "Give me a JSON object with your name."}], s, max_tokens=96,
                  temperature=0, response_format={"type": "json_object"})
        text = r.choices[0].message.content
        if r.choices[0].finish_reason == "stop":
            assert isinstance(json.loads(text), dict), text
        else:
            assert text.lstrip().startswith("{"), text


def _streamed_calls(chunks):
    """({index: call with its argument fragments}, finish_reason, content) of a streamed reply; each call's first
    delta carries its id, type and name with empty arguments, the later ones only argument fragments."""
    calls, finish, content = {}, None, ""
    for ch in chunks:
        d = ch.choices[0].delta if ch.choices else None
        for tc in (d.tool_calls or []) if d else []:
            if tc.index not in calls:
                assert tc.id.startswith("call_") and tc.type == "function" and tc.function.arguments == "", tc
                calls[tc.index] = {"id": tc.id, "name": tc.function.name, "arguments": "", "fragments": []}
            else:
                assert tc.id is None and tc.function.name is None and tc.function.arguments, tc
                calls[tc.index]["fragments"].append(tc.function.arguments)
                calls[tc.index]["arguments"] += tc.function.arguments
        content += (d.content or "") if d else ""
        finish = ch.choices[0].finish_reason if ch.choices and ch.choices[0].finish_reason else finish
    return calls, finish, content


def _tool_loop(client, stream: bool):
    """A required call, its result, then the answer; the transcript."""
    first = dict(tools=[WEATHER, TIME], tool_choice="required", temperature=0, max_tokens=64)
    if stream:
        calls, finish, content = _streamed_calls(client.chat.completions.create(model=MODEL, messages=ASK,
                                                                                stream=True, **first))
        assert content == ""
        call = calls[0]
        assert len(call["fragments"]) > 1, call  # the arguments arrived as the model wrote them
    else:
        r = client.chat.completions.create(model=MODEL, messages=ASK, **first)
        finish, m = r.choices[0].finish_reason, r.choices[0].message
        assert m.content is None and len(m.tool_calls) >= 1
        tc = m.tool_calls[0]
        call = {"id": tc.id, "name": tc.function.name, "arguments": tc.function.arguments}
    assert finish == "tool_calls"
    assert call["name"] in ("get_weather", "get_time") and call["id"].startswith("call_")
    params = (WEATHER if call["name"] == "get_weather" else TIME)["function"]["parameters"]
    jsonschema.validate(json.loads(call["arguments"]), params)
    history = [*ASK, {"role": "assistant", "content": None, "tool_calls": [
        {"id": call["id"], "type": "function", "function": {"name": call["name"], "arguments": call["arguments"]}}]},
        {"role": "tool", "tool_call_id": call["id"], "content": "18 degrees celsius, sunny"}]
    second = dict(tools=[WEATHER, TIME], tool_choice="none", temperature=0, max_tokens=32)
    if stream:
        answer = "".join(ch.choices[0].delta.content or "" for ch in client.chat.completions.create(
            model=MODEL, messages=history, stream=True, **second) if ch.choices)
    else:
        r2 = client.chat.completions.create(model=MODEL, messages=history, **second)
        assert r2.choices[0].finish_reason in ("stop", "length") and not r2.choices[0].message.tool_calls
        answer = r2.choices[0].message.content
    assert answer.strip()
    return call, answer


def test_agent_loop(client):
    call, answer = _tool_loop(client, stream=False)
    print(f"\nagent loop: call {call['name']}({call['arguments']}) -> tool '18 degrees celsius, sunny' -> {answer!r}")
    scall, sanswer = _tool_loop(client, stream=True)
    assert (scall["name"], scall["arguments"], sanswer) == (call["name"], call["arguments"], answer)


def test_streamed_call_arguments_arrive_in_fragments(client):
    """A named call, streamed token by token (normal; the agent loop streams adaptive's windows): its arguments
    in several fragments that add up to the non-streamed call's."""
    kw = dict(model=MODEL, messages=ASK, tools=[WEATHER, TIME], temperature=0, max_tokens=48,
              tool_choice={"type": "function", "function": {"name": "get_weather"}},
              extra_body={"decode_strategy": "normal"})
    whole = client.chat.completions.create(**kw).choices[0].message.tool_calls
    calls, finish, content = _streamed_calls(client.chat.completions.create(stream=True, **kw))
    assert finish == "tool_calls" and content == "" and list(calls) == [0]
    assert len(calls[0]["fragments"]) > 1, calls
    assert (calls[0]["name"], calls[0]["arguments"]) == (whole[0].function.name, whole[0].function.arguments)
    jsonschema.validate(json.loads(calls[0]["arguments"]), WEATHER["function"]["parameters"])


def test_named_function_and_auto(client):
    r = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER, TIME], temperature=0,
                                       tool_choice={"type": "function", "function": {"name": "get_time"}},
                                       max_tokens=48)
    m = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls" and [c.function.name for c in m.tool_calls] == ["get_time"]
    jsonschema.validate(json.loads(m.tool_calls[0].function.arguments), TIME["function"]["parameters"])
    auto = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER], temperature=0, max_tokens=48)
    m = auto.choices[0].message
    assert (auto.choices[0].finish_reason == "tool_calls") == bool(m.tool_calls)  # whichever the model chose
    assert m.tool_calls or m.content


def test_bad_agent_requests(server):
    bad_schema = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "foo"}}}
    not_json = {"type": "function", "function": {"name": "f", "parameters": "{not json"}}
    for body, param in [
        ({"messages": ASK, "tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
         "tool_choice"),
        ({"messages": ASK, "tools": [not_json]}, "tools[0].function.parameters"),
        ({"messages": ASK, "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": 3}}}]},
         "tools[0].function.parameters"),
        ({"messages": ASK, "response_format": bad_schema}, "response_format.json_schema.schema"),
        ({"messages": ASK, "response_format": {"type": "xml"}}, "response_format"),
        ({"messages": ASK, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"messages": ASK, "top_logprobs": 2}, "top_logprobs"),
        ({"messages": ASK, "tool_choice": "required"}, "tool_choice"),
        ({"messages": [*ASK, {"role": "tool", "content": "x"}]}, "messages[1].tool_call_id"),
        ({"messages": ASK, "grammar": "start: (("}, "grammar"),
    ]:
        status, _, err = _post(server, "/v1/chat/completions", json.dumps(body).encode())
        assert status == 400 and err["error"]["param"] == param, (body, err)
    status, _, err = _post(server, "/v1/completions", json.dumps({"prompt": "x", "logprobs": 9}).encode())
    assert status == 400 and err["error"]["param"] == "logprobs"
