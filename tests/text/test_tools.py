"""Tool calls without a model: the prompt a template with and without tool support gets, the call forms parsed
back (malformed text stays content), and the streamed split of content and calls."""

import copy
import json
from pathlib import Path

import pytest

from guild.text import tools
from guild.text.chat import use_chat_template
from guild.text.tokenizer import Tokenizer

HERMES = Path(__file__).resolve().parent.parent / "serve" / "hermes_tools.jinja"
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}
HISTORY = [{"role": "user", "content": "Weather in Paris?"},
           {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function", "function": {
               "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
           {"role": "tool", "tool_call_id": "call_1", "content": "18 C and sunny"}]


@pytest.fixture(scope="module")
def plain(dense_path):
    return Tokenizer.from_gguf(dense_path)


@pytest.fixture(scope="module")
def hermes(plain):
    tok = copy.copy(plain)
    use_chat_template(tok, HERMES)
    return tok


def test_a_template_without_tools_gets_the_generic_block(plain):
    assert not tools.supports_tools(plain) and tools.call_format(plain) is tools.GENERIC
    text = tools.render(plain, HISTORY, [WEATHER])
    assert "<tools>\n" + json.dumps(WEATHER["function"]) in text and "<tool_call>" in text
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in text
    assert "<tool_response>\n18 C and sunny\n</tool_response>" in text and text.endswith("<|im_start|>assistant\n")


def test_a_tools_template_renders_its_own_way(hermes):
    assert tools.supports_tools(hermes) and tools.call_format(hermes).name == "hermes"
    text = tools.render(hermes, HISTORY, [WEATHER])
    assert text.startswith("<|im_start|>system\n# Tools") and json.dumps(WEATHER) in text
    assert '"arguments": {"city": "Paris"}' in text  # the string from the history, parsed for `tojson`


@pytest.mark.parametrize("fmt, text, content, n", [
    ("hermes", 'Sure.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>', "Sure.", 1),
    ("hermes", '<tool_call>{"name": "get_weather", "arguments": {"city": "A"}}</tool_call>\n<tool_call>{"name": '
               '"get_weather", "arguments": {"city": "B"}}</tool_call>', "", 2),
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"\n</tool_call>', None, 0),
    ("hermes", '<tool_call>\n{"name": "launch", "arguments": {}}\n</tool_call>', None, 0),
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}', None, 0),
    ("mistral", '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Rome"}}]', "", 1),
    ("llama3", '{"name": "get_weather", "parameters": {"city": "Rome"}}', "", 1),
    ("llama3", '{"name": "get_weather", "parameters": "Rome"}', None, 0),
])
def test_call_forms_parse_and_malformed_text_stays_content(plain, monkeypatch, fmt, text, content, n):
    f = next(f for f in tools.FORMATS if f.name == fmt)
    monkeypatch.setattr(tools, "call_format", lambda tok: f)
    got, calls = tools.parse(text, plain, {"get_weather"})
    assert len(calls) == n and got == (text if content is None else content)
    assert all(c.name == "get_weather" and json.loads(c.arguments)["city"] and c.id.startswith("call_")
               for c in calls)


def test_streamed_content_stops_at_a_call(plain):
    s = tools.CallStream(plain)
    sent = "".join(s.push(p) for p in ["Let me ", "check. <tool", "_call>\n{\"name\": \"get_weather\", ",
                                       "\"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>"])
    rest, calls = s.finish(plain, {"get_weather"})
    assert sent == "Let me check. " and rest == "" and [c.name for c in calls] == ["get_weather"]
    s = tools.CallStream(plain)
    sent = "".join(s.push(p) for p in ["a <", "b > c"])
    assert sent + s.finish(plain, {"get_weather"})[0] == "a <b > c"
