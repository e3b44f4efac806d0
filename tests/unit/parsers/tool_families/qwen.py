"""Qwen: hermes JSON, or Qwen3-Coder XML (values typed by the tool's schema), in <tool_call> tags."""

from __future__ import annotations

import json

from tests.unit.parsers.tool_families.spec import TOOLS, Family
from tests.unit.parsers.tool_split import call
from vllmmlxd.parsers.tools import tool_parser_class

P = tool_parser_class("qwen")

WRITE_FILE = {
    "type": "function",
    "function": {
        "name": "write_file",
        "parameters": {
            "type": "object",
            "properties": {
                "path": {"type": "string"},
                "content": {"type": "string"},
                "overwrite": {"type": "boolean"},
                "mode": {"type": "integer"},
                "tags": {"type": "array"},
                "ratio": {"type": "number"},
            },
        },
    },
}

FAMILY = Family(
    name="qwen",
    tools=[*TOOLS, WRITE_FILE],
    calls={
        "json call after text": (
            'Let me check the weather.\n\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
            [("content", "Let me check the weather.\n\n"), call("get_weather", '{"city": "Paris"}')],
        ),
        "xml call after text": (
            "I'll look that up.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nSan Francisco\n</parameter>\n"
            "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
            [("content", "I'll look that up.\n"), call("get_weather", '{"city": "San Francisco", "days": 3}')],
        ),
        "parallel calls, both forms": (
            '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lyon"}}\n</tool_call>\n'
            "<tool_call>\n<function=get_time>\n</function>\n</tool_call>",
            [call("get_weather", '{"city": "Lyon"}'), ("content", "\n"), call("get_time", "{}")],
        ),
        "xml values typed by the schema, raw text kept": (
            "<tool_call>\n<function=write_file>\n<parameter=path>\n/tmp/a.py\n</parameter>\n"
            '<parameter=content>\ndef f():\n    return {"a": 1}  # </tool_call\n\n</parameter>\n'
            "<parameter=overwrite>\ntrue\n</parameter>\n<parameter=mode>\n644\n</parameter>\n"
            '<parameter=tags>\n["x", "y"]\n</parameter>\n<parameter=ratio>\n0.5\n</parameter>\n</function>\n</tool_call>',
            [
                call(
                    "write_file",
                    json.dumps(
                        {
                            "path": "/tmp/a.py",
                            "content": 'def f():\n    return {"a": 1}  # </tool_call\n',
                            "overwrite": True,
                            "mode": 644,
                            "tags": ["x", "y"],
                            "ratio": 0.5,
                        }
                    ),
                )
            ],
        ),
        "a value that is not its type stays a string": (
            "<tool_call>\n<function=write_file>\n<parameter=mode>\nrw-r--r--\n</parameter>\n</function>\n</tool_call>",
            [call("write_file", '{"mode": "rw-r--r--"}')],
        ),
        "braces and tags inside json strings": (
            '<tool_call>\n{"name": "get_weather", "arguments": {"city": "{<tool_call>} </tool_call"}}\n</tool_call>',
            [call("get_weather", '{"city": "{<tool_call>} </tool_call"}')],
        ),
        "no end tag before eos": (
            "<tool_call>\n<function=get_time>\n</function>\n",
            [call("get_time", "{}")],
        ),
    },
    without_tools={
        "xml without tools keeps strings": (
            "<tool_call>\n<function=f>\n<parameter=n>\n3\n</parameter>\n</function>\n</tool_call>",
            [call("f", '{"n": "3"}')],
        ),
    },
    plain={"plain answer": "It is sunny, <b>22</b> degrees."},
    malformed={
        "xml cut off stays text": "<tool_call>\n<function=get_weather>\n<parameter=city>\nPar",
        "malformed json stays text": 'ok <tool_call>\n{"name": "get_time", "arguments": {</tool_call> done',
    },
    unknown_tool={
        "unknown tool stays text": (
            "<tool_call>\n<function=rm_rf>\n<parameter=path>\n/\n</parameter>\n</function>\n</tool_call>"
        ),
    },
    render=("get_weather", {"city": "Rome"}),
    markers=frozenset({"<tool_call>", "</tool_call>"}),
    two_calls=(P.render_call("get_time", {}) + "\n" + P.render_call("get_time", {}),),
    grammar_accepts=(P.render_call("get_time", {}) + "\n" + P.render_call("get_weather", {"city": "Oslo"}),),
)
