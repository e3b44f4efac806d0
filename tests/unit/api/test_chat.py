"""``serve_chat`` over a scripted engine: one pipeline, each family's body or stream at its end."""

from __future__ import annotations

import asyncio
import json

from tests.unit.api.test_tool_loop import ScriptedEngine, ended, fake_request
from vllmmlxd.api.anthropic.encode import MessagesEncoding
from vllmmlxd.api.chat import render_prompt, serve_chat
from vllmmlxd.api.context import ServingContext
from vllmmlxd.api.openai.encode import ChatEncoding
from vllmmlxd.api.sampling import SamplingRequest
from vllmmlxd.api.tooling import ToolChoice
from vllmmlxd.api.turn import ChatPrompt, ChatTurn
from vllmmlxd.config.schema import ModelConfig
from vllmmlxd.engine.types import TextDelta, ToolCallDelta

TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
PROMPT = ChatPrompt([{"role": "user", "content": "hi"}], [TOOL])


def serve(turn, encoding, events):
    engine = ScriptedEngine([events])
    ctx = ServingContext(engine=engine, config=ModelConfig(model="builtin:tiny"), key="k")
    return asyncio.run(serve_chat(ctx, fake_request(), turn, encoding)), engine, ctx


def test_one_turn_gives_each_family_its_body():
    events = [TextDelta("hello"), ended("stop", prompt=10, completion=1)]
    turn = ChatTurn(PROMPT, SamplingRequest(max_tokens=5), "chatcmpl-")
    body, engine, _ = serve(turn, ChatEncoding(1, "m", False), events)
    assert body["choices"][0]["message"]["content"] == "hello" and body["id"].startswith("chatcmpl-")
    assert engine.requests[0].tool_use.parse_calls and engine.requests[0].constraint is None
    body, _, _ = serve(ChatTurn(PROMPT, SamplingRequest(max_tokens=5), "msg_"), MessagesEncoding("m"), events)
    assert body["content"] == [{"type": "text", "text": "hello"}] and body["id"].startswith("msg_")


def test_a_forced_turn_is_held_to_the_call_grammar_and_rendered_as_count_tokens_renders():
    turn = ChatTurn(PROMPT, SamplingRequest(max_tokens=5), "msg_", tool_choice=ToolChoice("named", "f"))
    body, engine, ctx = serve(turn, MessagesEncoding("m"), [ToolCallDelta(0, "f", "{}"), ended("tool_calls")])
    assert engine.requests[0].constraint is not None
    assert body["stop_reason"] == "tool_use" and body["content"][0]["name"] == "f"
    assert asyncio.run(render_prompt(ctx, PROMPT, None)).tokens == engine.requests[0].prompt_tokens


def test_a_stream_goes_through_the_family_encoder():
    turn = ChatTurn(PROMPT, SamplingRequest(max_tokens=5), "chatcmpl-", stream=True)
    response, _, _ = serve(turn, ChatEncoding(1, "m", True), [TextDelta("a"), ended("stop")])

    async def frames():
        return [f async for f in response.body_iterator]

    chunks = [json.loads(f[len("data: ") :]) for f in asyncio.run(frames()) if f.startswith("data: {")]
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"]) == "a"
    assert chunks[-1]["usage"]["completion_tokens"] == 5
