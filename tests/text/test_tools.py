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


CALL = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "days": [1, 2], '
        '"note": "a \\"}\\" b"}}\n</tool_call>')


def _stream(tok, pieces, names=frozenset({"get_weather"})):
    """Feeds `pieces` to a CallStream: (content sent, {index: [id, name, [argument fragments]]}, finish())."""
    s = tools.CallStream(tok, set(names))
    content, calls = "", {}
    for p in pieces:
        text, deltas = s.push(p)
        content += text
        for d in deltas:
            if d.call is not None:
                assert d.index not in calls and d.arguments == ""
                calls[d.index] = [d.call.id, d.call.name, []]
            else:
                calls[d.index][2].append(d.arguments)
    return content, calls, s.finish(tok)


def _pieces(text, n=3):
    return [text[i:i + n] for i in range(0, len(text), n)]


def test_streamed_content_stops_at_a_call(plain):
    content, calls, (rest, found, is_calls) = _stream(plain, ["Let me ", "check. <tool", "_call>\n{\"name\": \"get_"
                                                              "weather\", ", "\"arguments\": {\"city\": \"Oslo\"}}\n"
                                                              "</tool_call>"])
    assert content == "Let me check." and rest == "" and found == [] and is_calls
    assert [(c[1], "".join(c[2])) for c in calls.values()] == [("get_weather", '{"city": "Oslo"}')]
    content, calls, (rest, found, is_calls) = _stream(plain, ["a <", "b > c "])
    assert content + rest == "a <b > c " and not calls and not is_calls


@pytest.mark.parametrize("n", [1, 3, 7])
def test_streamed_arguments_add_up_to_the_parsed_call(plain, n):
    """Fragment by fragment, whatever the pieces (braces and quotes inside strings included); two calls in one
    reply get indexes 0 and 1; the concatenation is the `arguments` that `parse` returns for the whole text."""
    text = "Sure.\n" + CALL + "\n" + CALL.replace("Oslo", "Rome")
    content, calls, (rest, found, is_calls) = _stream(plain, _pieces(text, n))
    want_content, want = tools.parse(text, plain, {"get_weather"})
    assert content == want_content == "Sure." and rest == "" and found == [] and is_calls
    assert [(c[1], "".join(c[2])) for c in calls.values()] == [(w.name, w.arguments) for w in want]
    assert json.loads(want[0].arguments) == {"city": "Oslo", "days": [1, 2], "note": 'a "}" b'}
    assert all(len(c[2]) > 1 for c in calls.values()) and calls[0][0] != calls[1][0]


@pytest.mark.parametrize("text, content", [
    ('<tool_call>\n{"name": "launch", "arguments": {}}\n</tool_call>', None),  # not offered: never streamed
    ('I think <tool_call> is {not json', None),
    ('<tool_call>\n{"arguments": {"city": "Oslo"}, "name": "get_weather"}\n</tool_call>', ""),  # parsed whole
])
def test_calls_that_do_not_stream_end_as_parse_says(plain, text, content):
    got, calls, (rest, found, is_calls) = _stream(plain, _pieces(text))
    assert not calls
    want_content, want = tools.parse(text, plain, {"get_weather"})
    assert got + rest == want_content == (text if content is None else content)
    assert [(c.name, c.arguments) for c in found] == [(c.name, c.arguments) for c in want]
    assert is_calls == bool(want)


def test_a_streamed_call_cut_short_is_not_calls(plain):
    """The call's start was sent; the text then stops (max_tokens), breaks, or goes on after the call: the reply is
    not calls, nothing more is sent (OpenAI's API ends a call cut by max_tokens the same way), and `parse` returns
    it as content."""
    for text in (CALL[:60], CALL[:-3] + "!!", CALL + "\nHope that helps."):
        content, calls, (rest, found, is_calls) = _stream(plain, _pieces(text))
        assert content == "" and list(calls) == [0] and (rest, found, is_calls) == ("", [], False)
        assert tools.parse(text, plain, {"get_weather"}) == (text, [])
