"""Llama: Llama 3 JSON (bare, or after <|python_tag|>) and Llama 4 pythonic calls."""

from __future__ import annotations

from tests.unit.parsers.tool_families.spec import TOOLS, Family
from tests.unit.parsers.tool_split import call
from vllmmlxd.parsers.tools import tool_parser_class

P = tool_parser_class("llama")

SEARCH = {
    "type": "function",
    "function": {
        "name": "search",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string"},
                "filters": {"type": "object"},
                "exact": {"type": "boolean"},
            },
        },
    },
}

FAMILY = Family(
    name="llama",
    tools=[*TOOLS, SEARCH],
    calls={
        "bare json answer": (
            '{"name": "get_weather", "parameters": {"city": "Paris"}}',
            [call("get_weather", '{"city": "Paris"}')],
        ),
        "python tag call after text": (
            'Let me check.\n\n<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris", "days": 2}}',
            [("content", "Let me check.\n\n"), call("get_weather", '{"city": "Paris", "days": 2}')],
        ),
        "json calls joined by semicolons": (
            '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Lyon"}}; {"name": "get_time", "parameters": {}}',
            [call("get_weather", '{"city": "Lyon"}'), call("get_time", "{}")],
        ),
        "bare json after leading space, text after it": (
            '\n\n{"name": "get_time", "parameters": {}}\n\nChecking the time.',
            [("content", "\n\n"), call("get_time", "{}"), ("content", "\n\nChecking the time.")],
        ),
        "pythonic parallel calls": (
            '[get_weather(city="Paris", days=3), get_time()]',
            [call("get_weather", '{"city": "Paris", "days": 3}'), call("get_time", "{}")],
        ),
        "pythonic literals, json names, brackets in strings": (
            '[search(query=\'a ] b ) c \\\' "\', filters={"lang": "en", "tags": [1, 2]}, exact=true)]',
            [call("search", '{"query": "a ] b ) c \' \\"", "filters": {"lang": "en", "tags": [1, 2]}, "exact": true}')],
        ),
        "pythonic between python start and end": (
            '<|python_start|>[get_weather(city="Rome")]<|python_end|>',
            [call("get_weather", '{"city": "Rome"}')],
        ),
        "braces and markers inside json strings": (
            '{"name": "search", "parameters": {"query": "} ; {<|python_tag|>"}}',
            [call("search", '{"query": "} ; {<|python_tag|>"}')],
        ),
        "the arguments key is read too": (
            '{"name": "get_time", "arguments": {}}',
            [call("get_time", "{}")],
        ),
    },
    plain={
        "a markdown answer starting with a bracket stays text": "[1] See the docs: [link](https://example.com).",
        "a json answer that is no call stays text": '{"answer": 42}\n',
        "json mid-answer is text": 'The call is {"name": "get_time", "parameters": {}} here.',
        "plain answer": "It is sunny {mostly} [22 C].",
    },
    malformed={
        "a pythonic call evaluates nothing": '[search(query=__import__("os").getcwd())]',
        "malformed json stays text": '<|python_tag|>{"name": "get_time", "parameters": {}',
    },
    unknown_tool={
        "a built-in tool call after the tag stays text": '<|python_tag|>brave_search.call(query="weather")',
        "unknown tool stays text": '[rm_rf(path="/")]',
    },
    render=("get_weather", {"city": "Rome"}),
    rendered='{"name": "get_weather", "parameters": {"city": "Rome"}}',
    markers=frozenset({"<|python_tag|>", "<|python_start|>", "<|python_end|>"}),
    two_calls=(P.render_call("get_time", {}) + "; " + P.render_call("get_time", {}),),
    grammar_accepts=(P.render_call("get_time", {}) + "; " + P.render_call("get_weather", {"city": "Oslo"}),),
)
