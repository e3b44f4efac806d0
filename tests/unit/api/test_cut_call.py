"""A forced tool call cut short by max_tokens is still a call (api.chat.ForcedCall, tooling.cut_call):
the partial call with finish_reason length (OpenAI) / a tool_use block with stop_reason max_tokens
(Anthropic), whose input is what of the arguments parses."""

from __future__ import annotations

import asyncio
import json

import pytest

from tests.unit.api.test_chat import PROMPT, serve
from tests.unit.api.test_tool_loop import ended
from vllmmlxd.api.anthropic.encode import MessagesEncoding
from vllmmlxd.api.openai.encode import ChatEncoding
from vllmmlxd.api.sampling import SamplingRequest
from vllmmlxd.api.tooling import ToolChoice, cut_call
from vllmmlxd.api.turn import ChatPrompt, ChatTurn
from vllmmlxd.engine.types import TextDelta, ToolCallDelta

TOOLS = [{"type": "function", "function": {"name": n, "parameters": {"type": "object"}}} for n in ("get", "get_time")]
CUT = '<tool_call>\n{"name": "f", "arguments": {"city": "Pa'


@pytest.mark.parametrize(
    "text,choice,expected",
    [
        (
            '<tool_call>\n{"name": "get_time", "arguments": {"zone": "UT',
            ToolChoice("required"),
            ("get_time", '{"zone": "UT'),
        ),
        ("[TOOL_CALLS]get_time[ARGS]{", ToolChoice("required"), ("get_time", "{")),
        ('<tool_call>\n{"name": "get', ToolChoice("named", "get_time"), ("get_time", "")),
        ('<tool_call>\n{"name": "ge', ToolChoice("required"), None),  # two tools: which one is not known
        ("  ", ToolChoice("named", "get"), None),
    ],
)
def test_the_cut_call_read_out_of_the_text(text, choice, expected):
    assert cut_call(text, TOOLS, choice) == expected


def forced(prefix, stream=False):
    return ChatTurn(PROMPT, SamplingRequest(max_tokens=5), prefix, tool_choice=ToolChoice("named", "f"), stream=stream)


def test_openai_answers_the_partial_call_with_finish_reason_length():
    body, _, _ = serve(forced("chatcmpl-"), ChatEncoding(1, "m", False), [TextDelta(CUT, 5), ended("length")])
    choice = body["choices"][0]
    assert choice["finish_reason"] == "length" and choice["message"]["content"] is None
    assert [c["function"] for c in choice["message"]["tool_calls"]] == [{"name": "f", "arguments": '{"city": "Pa'}]


def test_anthropic_answers_a_tool_use_block_with_stop_reason_max_tokens():
    body, _, _ = serve(forced("msg_"), MessagesEncoding("m"), [TextDelta(CUT, 5), ended("length")])
    assert body["stop_reason"] == "max_tokens"
    assert [(b["type"], b["name"], b["input"]) for b in body["content"]] == [("tool_use", "f", {"city": "Pa"})]


def test_a_stream_sends_the_same_partial_call():
    response, _, _ = serve(forced("msg_", stream=True), MessagesEncoding("m"), [TextDelta(CUT, 5), ended("length")])

    async def frames():
        return [f async for f in response.body_iterator]

    data = [json.loads(line[6:]) for f in asyncio.run(frames()) for line in f.splitlines() if line.startswith("data: ")]
    assert [d["content_block"]["type"] for d in data if d["type"] == "content_block_start"] == ["tool_use"]
    assert [d["delta"]["partial_json"] for d in data if d["type"] == "content_block_delta"] == ['{"city": "Pa"}']
    assert [d["delta"]["stop_reason"] for d in data if d["type"] == "message_delta"] == ["max_tokens"]


def test_a_complete_call_and_a_free_turn_are_left_as_they_are():
    events = [ToolCallDelta(0, "f", '{"a": 1}'), TextDelta("\n"), ended("tool_calls")]
    body, _, _ = serve(forced("chatcmpl-"), ChatEncoding(1, "m", False), events)
    assert body["choices"][0]["finish_reason"] == "tool_calls" and len(body["choices"][0]["message"]["tool_calls"]) == 1
    free = ChatTurn(ChatPrompt(PROMPT.messages, PROMPT.tools), SamplingRequest(max_tokens=5), "chatcmpl-")
    body, _, _ = serve(free, ChatEncoding(1, "m", False), [TextDelta(CUT, 5), ended("length")])
    assert body["choices"][0]["message"]["content"] == CUT and "tool_calls" not in body["choices"][0]["message"]
