"""GLM-4.5/4.6/4.7: <arg_key>/<arg_value> pairs in <tool_call> tags, values read by schema type."""

from __future__ import annotations

from tests.unit.parsers.tool_families.spec import TOOLS, Family
from tests.unit.parsers.tool_split import call
from vllmmlxd.parsers.tools import tool_parser_class

P = tool_parser_class("glm47")

SEARCH = {
    "type": "function",
    "function": {
        "name": "search",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string"},
                "filters": {"type": "object"},
                "limit": {"type": "integer"},
                "exact": {"type": "boolean"},
                "tags": {"type": "array", "items": {"type": "string"}},
                "unit": {"type": "string", "enum": ["metric", "imperial"]},
            },
            "required": ["query"],
        },
    },
}

FAMILY = Family(
    name="glm47",
    tools=[*TOOLS, SEARCH],
    calls={
        "4.5/4.6: one call after text": (
            "I'll check the weather in Paris for you.\n"
            "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
            "<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>",
            [
                ("content", "I'll check the weather in Paris for you.\n"),
                call("get_weather", '{"city": "Paris", "days": 3}'),
            ],
        ),
        "4.7: no newlines": (
            "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>",
            [call("get_weather", '{"city": "Paris"}')],
        ),
        "parallel calls, one without arguments": (
            "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Lyon</arg_value>\n</tool_call>\n"
            "<tool_call>get_time\n</tool_call>",
            [call("get_weather", '{"city": "Lyon"}'), ("content", "\n"), call("get_time", "{}")],
        ),
        "values read by schema type": (
            "<tool_call>search\n<arg_key>query</arg_key>\n<arg_value>007</arg_value>\n"
            '<arg_key>filters</arg_key>\n<arg_value>{"lang": "fr"}</arg_value>\n'
            "<arg_key>limit</arg_key>\n<arg_value>10</arg_value>\n"
            "<arg_key>exact</arg_key>\n<arg_value>true</arg_value>\n"
            '<arg_key>tags</arg_key>\n<arg_value>["a", "b"]</arg_value>\n</tool_call>',
            [
                call(
                    "search",
                    '{"query": "007", "filters": {"lang": "fr"}, "limit": 10, "exact": true, "tags": ["a", "b"]}',
                )
            ],
        ),
        "a value that is not JSON stays a string": (
            "<tool_call>search<arg_key>query</arg_key><arg_value>x</arg_value>"
            "<arg_key>limit</arg_key><arg_value>ten</arg_value></tool_call>",
            [call("search", '{"query": "x", "limit": "ten"}')],
        ),
        "markers and braces inside a value": (
            "<tool_call>search\n<arg_key>query</arg_key>\n<arg_value>a </tool_call> b {<tool_call>\n c</arg_value>\n</tool_call>",
            [call("search", '{"query": "a </tool_call> b {<tool_call>\\n c"}')],
        ),
        "hermes-style JSON inside the tags": (
            '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>',
            [call("get_time", "{}")],
        ),
        "no end marker before eos": (
            "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n",
            [call("get_weather", '{"city": "Paris"}')],
        ),
    },
    without_tools={
        "without tools every value is a string": (
            "<tool_call>get_weather<arg_key>days</arg_key><arg_value>3</arg_value></tool_call>",
            [call("get_weather", '{"days": "3"}')],
        ),
    },
    plain={"plain answer": "Use <tool> tags like <arg_key> in XML {freely}."},
    malformed={
        "unfinished value stays text": "Sure.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Par",
        "a key with no value stays text": "<tool_call>get_weather\n<arg_key>city</arg_key>\n</tool_call> ok",
        "a call that is not a name stays text": "<tool_call>get_weather(city='Paris')</tool_call>",
    },
    unknown_tool={
        "unknown tool stays text": (
            "<tool_call>rm_rf\n<arg_key>path</arg_key>\n<arg_value>/</arg_value>\n</tool_call>"
        ),
    },
    render=("search", {"query": "a <b>", "filters": {"lang": "fr"}, "limit": 5, "exact": False, "unit": "metric"}),
    markers=frozenset({"<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"}),
    two_calls=(P.render_call("get_time", {}) + "\n" + P.render_call("get_time", {}),),
    grammar_accepts=(
        P.render_call("search", {"query": "a </arg_key> <b>\n", "limit": 5, "tags": ["x"], "unit": "imperial"}),
        P.render_call("get_time", {}) + "\n" + P.render_call("get_weather", {"city": "Oslo"}),
        "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>",  # 4.7
    ),
    grammar_refuses=(
        P.render_call("search", {"query": "x", "limit": "ten"}),
        P.render_call("search", {"query": "x", "unit": "kelvin"}),
    ),
)
