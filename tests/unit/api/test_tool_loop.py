"""The server-side tool loop (api.tool_loop) over a scripted engine and a fake hub: which calls it
runs, what the model is shown next, its limits, failures as results; and the two families'
extensions, read back by the official SDKs' own models and stream accumulators."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field

import openai
from starlette.requests import Request

from vllmmlxd.api.anthropic.encode import MessagesStreamEncoder, message_response
from vllmmlxd.api.context import ServingContext
from vllmmlxd.api.openai.encode import ChatStreamEncoder, chat_response
from vllmmlxd.api.sampling import SamplingRequest
from vllmmlxd.api.stream import Folded
from vllmmlxd.api.tool_loop import McpCall, McpOutcome, ToolLoop, offer
from vllmmlxd.config.schema import ModelConfig
from vllmmlxd.engine.types import (
    Constraint,
    EngineStats,
    Finished,
    GenerationRequest,
    ModelInfo,
    SamplingParams,
    TextDelta,
    ToolCallDelta,
    ToolUse,
    Usage,
)
from vllmmlxd.errors import InvalidRequest

CONFIG = ModelConfig(model="builtin:tiny", mcp_auto_execute=("files__*", "clock__now"), mcp_max_tool_calls=3)
CLIENT_TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
ASK = [{"role": "user", "content": "hi"}]


@dataclass(frozen=True)
class Tool:
    name: str
    server: str
    tool: str
    description: str = "d"
    input_schema: dict = field(default_factory=lambda: {"type": "object"})


@dataclass(frozen=True)
class Result:
    content: list
    is_error: bool = False

    def text(self) -> str:
        return "\n".join(b["text"] for b in self.content if b.get("type") == "text")


class FakeHub:
    """Tools of two servers; ``call`` answers from ``answers`` (a Result, or an exception to raise)."""

    def __init__(self, answers=None):
        self.answers = answers or {}
        self.calls: list[tuple[str, dict]] = []
        self.asked_servers = "unset"

    def tools(self, servers=None):
        self.asked_servers = servers
        every = [
            Tool("files__read", "files", "read"),
            Tool("files__list", "files", "list"),
            Tool("clock__now", "clock", "now"),
            Tool("clock__zone", "clock", "zone"),
        ]
        return [t for t in every if servers is None or t.server in servers]

    async def call(self, name, arguments):
        self.calls.append((name, arguments))
        answer = self.answers.get(name, Result([{"type": "text", "text": f"{name} says hi"}]))
        if isinstance(answer, Exception):
            raise answer
        return answer


class ScriptedEngine:
    """Each ``generate`` plays the next turn's events; every rendered conversation is kept."""

    def __init__(self, turns):
        self.turns = list(turns)
        self.info = ModelInfo(
            name="m", context_length=4096, vocab_size=100, source="builtin:tiny", tool_parser="hermes"
        )
        self.stats = EngineStats()
        self.rendered: list[tuple[list[dict], list[dict] | None]] = []
        self.requests: list[GenerationRequest] = []

    def apply_chat_template(self, messages, *, tools=None, template_kwargs=None):
        self.rendered.append((json.loads(json.dumps(messages)), tools))
        return list(range(10 * len(messages)))

    def check_constraint(self, constraint):
        return None

    def generate(self, request):
        self.requests.append(request)
        events = self.turns.pop(0)

        async def play():
            try:
                for event in events:
                    yield event
            finally:  # as the real engine does: a closed stream cancels its request
                request.cancelled.set()

        return play()


def call(index, name, arguments='{"path": "a"}'):
    return ToolCallDelta(index, name, arguments)


def ended(reason, prompt=10, completion=5):
    return Finished(reason, Usage(prompt, completion))


def context(engine, hub=None):
    ctx = ServingContext(engine=engine, config=CONFIG, key="k", mcp=hub)
    return ctx


def fake_request(caller=None):
    r = Request({"type": "http", "method": "POST", "path": "/", "headers": [], "client": ("1.2.3.4", 1), "state": {}})
    r.state.caller = caller
    return r


def first_turn(max_tokens=100, forced=True):
    return GenerationRequest(
        prompt_tokens=[1, 2, 3],
        sampling=SamplingParams(max_tokens=max_tokens),
        request_id="chatcmpl-1",
        reasoning=True,
        tool_use=ToolUse(()),
        constraint=Constraint("g") if forced else None,
    )


def run_loop(turns, hub=None, client_tools=None, max_tokens=100, limit=None):
    """Every event of one looped request, the engine (what it rendered and ran) and the hub."""
    hub = hub or FakeHub()
    engine = ScriptedEngine(turns)
    ctx = context(engine, hub)
    if limit is not None:
        ctx.config = CONFIG.model_copy(update={"mcp_max_tool_calls": limit})
    offered = offer(ctx, fake_request(), client_tools)
    loop = ToolLoop(ctx, offered, ASK, None, SamplingRequest(max_tokens=max_tokens), None, first_turn(max_tokens))

    async def collect():
        return [e async for e in loop.open()]

    return asyncio.run(collect()), engine, hub, loop


def test_nothing_is_offered_without_a_hub_a_pattern_or_a_matching_tool():
    engine = ScriptedEngine([])
    assert offer(context(engine, None), fake_request(), None) is None
    ctx = context(engine, FakeHub())
    ctx.config = CONFIG.model_copy(update={"mcp_auto_execute": ()})
    assert offer(ctx, fake_request(), None) is None
    ctx.config = CONFIG.model_copy(update={"mcp_auto_execute": ("nope__*",)})
    assert offer(ctx, fake_request(), [CLIENT_TOOL]) is None
    ctx.config = CONFIG.model_copy(update={"mcp_max_tool_calls": 0})
    assert offer(ctx, fake_request(), None) is None


def test_offered_tools_follow_the_patterns_and_come_after_the_clients_own():
    hub = FakeHub()
    clash = {"type": "function", "function": {"name": "clock__now", "parameters": {"type": "object"}}}
    offered = offer(context(ScriptedEngine([]), hub), fake_request(), [CLIENT_TOOL, clash])
    assert offered.names == {"files__read", "files__list"}  # the client's clock__now is the client's
    assert [t["function"]["name"] for t in offered.tools] == ["get_weather", "clock__now", "files__read", "files__list"]
    assert offered.tools[2]["function"]["parameters"] == {"type": "object"} and offered.limit == 3
    assert hub.asked_servers is None  # no key narrowing: every server


def test_a_keys_mcp_list_narrows_the_servers_offered():
    from vllmmlxd.config.keys import KeyGrant
    from vllmmlxd.http.access import Caller

    hub = FakeHub()
    ctx = context(ScriptedEngine([]), hub)
    ctx.config = CONFIG.model_copy(update={"mcp_servers_resolved": {"files": None, "clock": None}})
    caller = Caller(identity="key:a", key=KeyGrant(name="a", sha256="0" * 64, allowed=True, mcp=("clock",)))
    offered = offer(ctx, fake_request(caller), None)
    assert hub.asked_servers == {"clock"} and offered.names == {"clock__now"}


def test_an_auto_executed_call_runs_and_the_model_goes_on_with_its_result():
    turns = [
        [TextDelta(""), call(0, "files__read"), ended("tool_calls", 30, 7)],
        [TextDelta("It says hi."), ended("stop", 50, 4)],
    ]
    events, engine, hub, loop = run_loop(turns)
    assert hub.calls == [("files__read", {"path": "a"})]
    kinds = [type(e).__name__ for e in events]
    assert kinds == ["TextDelta", "McpCall", "McpOutcome", "TextDelta", "Finished"]
    assert events[2] == McpOutcome(call(0, "files__read"), "files__read says hi", False)
    assert events[-1] == Finished("stop", Usage(80, 11))  # every turn's tokens
    # The second turn saw the call and its result, in the template's terms, and the same tools.
    messages, tools = engine.rendered[-1]
    assert messages[0] == ASK[0]
    assistant, result = messages[1], messages[2]
    assert assistant["role"] == "assistant" and assistant["tool_calls"][0]["function"] == {
        "name": "files__read",
        "arguments": {"path": "a"},
    }
    assert result == {
        "role": "tool",
        "tool_call_id": assistant["tool_calls"][0]["id"],
        "name": "files__read",
        "content": "files__read says hi",
    }
    assert [t["function"]["name"] for t in tools] == ["files__read", "files__list", "clock__now"]
    second = engine.requests[1]
    # A forced choice held the first turn only; the next is free, within the tokens left, cancelled with the first.
    assert second.constraint is None and second.tool_use.parse_calls
    assert second.sampling.max_tokens == 93 and loop.cancelled.turn is second
    loop.cancelled.set()  # what stream/fold do when the response ends or the client goes
    assert loop.cancelled.is_set() and second.cancelled.is_set()
    assert second.request_id != engine.requests[0].request_id and loop.executed == 1


def test_calls_are_numbered_across_turns():
    turns = [
        [call(0, "files__read"), ended("tool_calls")],
        [call(0, "clock__now", "{}"), ended("tool_calls")],
        [TextDelta("done"), ended("stop")],
    ]
    events, engine, _hub, _ = run_loop(turns)
    assert [e.call.index for e in events if isinstance(e, McpCall)] == [0, 1]
    ids = [m["tool_call_id"] for m in engine.rendered[-1][0] if m["role"] == "tool"]
    assert len(set(ids)) == 2


def test_a_turn_with_a_client_tool_goes_to_the_client_whole():
    turns = [[call(0, "files__read"), call(1, "get_weather", '{"city": "Paris"}'), ended("tool_calls")]]
    events, engine, hub, _ = run_loop(turns, client_tools=[CLIENT_TOOL])
    assert hub.calls == [] and len(engine.requests) == 1
    assert [type(e).__name__ for e in events] == ["ToolCallDelta", "ToolCallDelta", "Finished"]
    assert events[-1].reason == "tool_calls"


def test_the_budget_stops_execution_and_hands_the_calls_to_the_client():
    turns = [
        [call(0, "files__read"), ended("tool_calls")],
        [call(0, "files__list", "{}"), call(1, "clock__now", "{}"), ended("tool_calls")],
    ]
    events, _engine, hub, loop = run_loop(turns, limit=2)
    assert [n for n, _ in hub.calls] == ["files__read"] and loop.executed == 1
    tail = events[2:]
    assert [type(e).__name__ for e in tail] == ["ToolCallDelta", "ToolCallDelta", "Finished"]
    assert [e.index for e in tail[:2]] == [1, 2] and tail[-1].reason == "tool_calls"


def test_a_call_cut_short_by_max_tokens_is_not_run():
    events, _, hub, _ = run_loop([[call(0, "files__read"), ended("length")]])
    assert hub.calls == [] and events[-1].reason == "length"


def test_failures_are_the_calls_results_told_to_the_model():
    hub = FakeHub(
        {
            "files__read": InvalidRequest("arguments do not fit the schema: 'path' is required"),
            "files__list": Result([{"type": "text", "text": "denied"}], is_error=True),
            "clock__now": RuntimeError("boom"),
        }
    )
    turns = [
        [call(0, "files__read"), call(1, "files__list", "{}"), call(2, "clock__now", "{}"), ended("tool_calls")],
        [call(0, "files__read", "[1]"), ended("tool_calls")],
        [TextDelta("sorry"), ended("stop")],
    ]
    events, engine, _, _ = run_loop(turns, hub=hub, limit=8)
    outcomes = [e for e in events if isinstance(e, McpOutcome)]
    assert all(o.is_error for o in outcomes) and len(outcomes) == 4
    assert "'path' is required" in outcomes[0].text and outcomes[1].text == "denied"
    assert outcomes[2].text == "Error: the tool failed (RuntimeError)" and "not a JSON object" in outcomes[3].text
    results = [m["content"] for m in engine.rendered[1][0] if m["role"] == "tool"]
    assert all(text.startswith("Error") for text in results)  # templates have no error flag
    assert events[-1] == Finished("stop", Usage(30, 15))


def test_no_tokens_left_ends_the_response_as_length_after_the_results():
    events, engine, _, _ = run_loop([[call(0, "files__read"), ended("tool_calls", 10, 20)]], max_tokens=20)
    assert [type(e).__name__ for e in events] == ["McpCall", "McpOutcome", "Finished"]
    assert events[-1] == Finished("length", Usage(10, 20)) and len(engine.requests) == 1


def test_an_engine_error_in_a_later_turn_ends_the_loop_with_it():
    turns = [[call(0, "files__read"), ended("tool_calls")], [Finished("error", Usage(3, 0), error="boom")]]
    events, _, _, _ = run_loop(turns)
    assert events[-1].reason == "error" and events[-1].error == "boom" and events[-1].usage == Usage(13, 5)


LOOPED = [
    TextDelta("Let me look."),
    McpCall(call(0, "files__read")),
    McpOutcome(call(0, "files__read"), "files__read says hi", False),
    McpCall(call(1, "clock__now", "{}")),
    McpOutcome(call(1, "clock__now", "{}"), "Error: down", True),
    TextDelta("Done."),
    Finished("stop", Usage(80, 11)),
]


def test_openai_whole_response_lists_executed_calls_apart_from_tool_calls():
    from openai.types.chat import ChatCompletion  # imported here: every test process collects this file

    folded = Folded()
    for event in LOOPED:
        folded.add(event)
    body = chat_response("chatcmpl-1", 1, "m", folded)
    msg = body["choices"][0]["message"]
    assert msg["content"] == "Let me look.Done." and "tool_calls" not in msg
    assert body["choices"][0]["finish_reason"] == "stop" and body["usage"]["total_tokens"] == 91
    assert [(c["function"]["name"], c["result"]) for c in msg["mcp_calls"]] == [
        ("files__read", {"content": "files__read says hi", "is_error": False}),
        ("clock__now", {"content": "Error: down", "is_error": True}),
    ]
    parsed = ChatCompletion.model_validate(body)  # the SDK's model keeps the extension
    assert parsed.choices[0].message.tool_calls is None
    assert parsed.choices[0].message.model_extra["mcp_calls"][0]["id"].startswith("call_")


def test_openai_stream_carries_the_same_in_mcp_calls_deltas():
    from openai.lib.streaming._deltas import accumulate_delta
    from openai.types.chat import ChatCompletionChunk

    enc = ChatStreamEncoder("chatcmpl-1", 1, "m", True)
    frames = enc.start()
    for event in LOOPED:
        frames += enc.event(event)
    frames += enc.end()
    assert frames[-1] == "data: [DONE]\n\n" and sum(f == "data: [DONE]\n\n" for f in frames) == 1
    chunks = [ChatCompletionChunk.model_validate(json.loads(f[len("data: ") :])) for f in frames[:-1]]
    acc: dict = {}
    for chunk in chunks:
        if chunk.choices:
            accumulate_delta(acc, chunk.choices[0].delta.model_dump(exclude_unset=True))
    # Merged as OpenAI's own stream helper merges deltas: each call with its result, nothing in tool_calls.
    assert acc["content"] == "Let me look.Done." and "tool_calls" not in acc
    folded = Folded()
    for event in LOOPED:
        folded.add(event)
    whole = chat_response("chatcmpl-1", 1, "m", folded)["choices"][0]["message"]["mcp_calls"]
    assert [{k: v for k, v in c.items() if k != "index"} for c in acc["mcp_calls"]] == whole
    assert chunks[-1].usage.completion_tokens == 11


def test_openai_stream_helper_reads_a_looped_stream():
    # openai's ChatCompletionStreamState is what client.chat.completions.stream() runs on.
    from openai.lib.streaming.chat import ChatCompletionStreamState
    from openai.types.chat import ChatCompletionChunk

    enc = ChatStreamEncoder("chatcmpl-1", 1, "m", False)
    state = ChatCompletionStreamState()
    for frame in enc.start() + [f for e in LOOPED for f in enc.event(e)]:
        state.handle_chunk(ChatCompletionChunk.model_validate(json.loads(frame[len("data: ") :])))
    final = state.get_final_completion()
    assert final.choices[0].message.content == "Let me look.Done." and final.choices[0].message.tool_calls in (None, [])
    assert openai.__version__


def anthropic_frames(events):
    enc = MessagesStreamEncoder("msg_1", "m", 30)
    frames = enc.start()
    for event in events:
        frames += enc.event(event)
    return frames + enc.end()


def test_anthropic_message_and_stream_show_server_tool_use_and_results():
    from anthropic._models import construct_type
    from anthropic.lib.streaming._messages import accumulate_event
    from anthropic.types import Message, RawMessageStreamEvent

    folded = Folded()
    for event in LOOPED:
        folded.add(event)
    body = message_response("msg_1", "m", folded)
    kinds = [b["type"] for b in body["content"]]
    assert kinds == ["text", "server_tool_use", "mcp_tool_result", "server_tool_use", "mcp_tool_result", "text"]
    use, result = body["content"][1], body["content"][2]
    assert use["id"].startswith("srvtoolu_") and use["input"] == {"path": "a"} and result["tool_use_id"] == use["id"]
    assert result["content"] == [{"type": "text", "text": "files__read says hi"}] and body["content"][4]["is_error"]
    assert body["usage"] == {"input_tokens": 80, "output_tokens": 11} and body["stop_reason"] == "end_turn"
    # The SDK builds responses leniently (construct_type, not validation): the blocks keep their fields.
    parsed = construct_type(type_=Message, value=body)
    assert [b.type for b in parsed.content] == kinds and parsed.content[2].tool_use_id == use["id"]
    assert parsed.content[1].input == {"path": "a"} and parsed.content[4].is_error is True
    snapshot, bufs = None, {}
    for frame in anthropic_frames(LOOPED):
        data = json.loads(frame.split("\n")[1][len("data: ") :])
        if data["type"] != "ping":  # the SDK's Stream skips pings; it builds events as leniently as responses
            event = construct_type(type_=RawMessageStreamEvent, value=data)
            snapshot = accumulate_event(event=event, current_snapshot=snapshot, json_bufs=bufs)
    streamed = snapshot.content
    assert [b.type for b in streamed] == kinds
    assert streamed[1].input == {"path": "a"} and streamed[1].id == use["id"]
    assert streamed[2].content == result["content"] and streamed[2].tool_use_id == use["id"]
    assert snapshot.usage.input_tokens == 80 and snapshot.usage.output_tokens == 11


def test_ordinary_streams_are_unchanged():
    plain = [TextDelta("hi"), Finished("stop", Usage(30, 1))]
    frames = anthropic_frames(plain)
    delta = json.loads(next(f for f in frames if f.startswith("event: message_delta")).split("\n")[1][6:])
    assert delta["usage"] == {"output_tokens": 1}  # input tokens come with message_start only, as before
    enc = ChatStreamEncoder("c", 1, "m", False)
    assert not any("mcp_calls" in f for f in enc.start() + [f for e in plain for f in enc.event(e)])


def test_a_response_ended_during_a_call_starts_no_further_turn():
    loops = []

    class Leaving(FakeHub):
        async def call(self, name, arguments):
            loops[0].cancelled.set()  # what stream/fold do when the client goes
            return await super().call(name, arguments)

    engine = ScriptedEngine([[call(0, "files__read"), ended("tool_calls")], [TextDelta("never"), ended("stop")]])
    ctx = context(engine, Leaving())
    loop = ToolLoop(ctx, offer(ctx, fake_request(), None), ASK, None, SamplingRequest(), None, first_turn())
    loops.append(loop)

    async def collect():
        return [e async for e in loop.open()]

    events = asyncio.run(collect())
    assert len(engine.requests) == 1 and not any(isinstance(e, Finished) for e in events)
    assert engine.requests[0].cancelled.is_set()


def test_the_blocks_a_looped_message_holds_are_accepted_back_in_a_history():
    from vllmmlxd.api.anthropic.protocol import MessagesRequest

    folded = Folded()
    for event in LOOPED:
        folded.add(event)
    content = message_response("msg_1", "m", folded)["content"]
    req = MessagesRequest.model_validate(
        {
            "max_tokens": 5,
            "messages": [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": content},
                {"role": "user", "content": "ok"},
            ],
        }
    )
    assert [b.type for b in req.messages[1].content][:3] == ["text", "server_tool_use", "mcp_tool_result"]
