"""The Responses encoder's bodies and events hold every field the specification requires, with
its type, in every shape a response takes (text, reasoning, calls, cut by the limit, failed);
and the spec table finds what a body lacks (so the integration tests' watch can fail)."""

from __future__ import annotations

import json

import pytest

from tests.support.responses_spec import check_event, check_response
from vllmmlxd.api.responses.encode import ResponsesEncoding
from vllmmlxd.api.responses.protocol import ResponsesRequest
from vllmmlxd.api.sampling import Applied
from vllmmlxd.api.stream import Folded
from vllmmlxd.engine.types import Finished, ReasoningDelta, TextDelta, ToolCallDelta, Usage

REQUEST = {
    "input": "hi",
    "tools": [{"type": "function", "name": "w"}, {"type": "web_search"}],
    "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}},
    "reasoning": {"effort": "low"},
    "safety_identifier": "user-1",
    "prompt_cache_key": "k",
}
EVENTS = [ReasoningDelta("hm"), TextDelta("hi"), ToolCallDelta(0, "w", "{}"), TextDelta("there")]


@pytest.mark.parametrize("reason", ["stop", "length"])
def test_every_streamed_event_and_the_whole_body_hold_the_spec(reason):
    encoding = ResponsesEncoding(ResponsesRequest.model_validate(REQUEST), "m", values=Applied(0.3, 0.9, 0.0, 0.5))
    stream = encoding.stream_encoder("r1", 3)
    frames = stream.start()
    for event in [*EVENTS, Finished(reason, Usage(3, 4))]:
        frames += stream.event(event)
    events = [json.loads(frame.split("data: ", 1)[1]) for frame in frames]
    assert [p for e in events for p in check_event(e)] == []
    last = events[-1]["response"]
    assert (last["temperature"], last["top_p"], last["frequency_penalty"]) == (0.3, 0.9, 0.5)
    assert last["tools"][0]["strict"] is None and last["tools"][1] == {"type": "web_search"}
    cut = reason == "length"
    assert last["status"] == ("incomplete" if cut else "completed")
    assert [i["status"] for i in last["output"] if "status" in i][-1] == last["status"]

    folded = Folded()
    for event in EVENTS:
        folded.add(event)
    folded.finish = Finished(reason, Usage(3, 4))
    body = ResponsesEncoding(ResponsesRequest.model_validate(REQUEST), "m").response("r2", folded)
    assert check_response(body) == []
    assert body["output"][-1]["status"] == body["status"]


def test_a_failed_stream_holds_the_spec():
    stream = ResponsesEncoding(ResponsesRequest(input="hi"), "m").stream_encoder("r1", 3)
    frames = [*stream.start(), *stream.event(TextDelta("a")), *stream.error("boom", "timeout")]
    assert [p for f in frames for p in check_event(json.loads(f.split("data: ", 1)[1]))] == []


def test_the_table_names_what_a_body_lacks():
    body = ResponsesEncoding(ResponsesRequest(input="hi"), "m").response(
        "r1", Folded(finish=Finished("stop", Usage(1, 1)))
    )
    del body["completed_at"]
    body["temperature"] = None
    body["output"] = [{"type": "message", "id": "m", "status": "done", "role": "assistant", "content": []}]
    assert check_response(body) == [
        "response.completed_at: required, missing",
        "response.output[0].status: 'done' is not one of ['completed', 'in_progress', 'incomplete']",
        "response.temperature: null where the specification wants num",
    ]
    assert check_event({"type": "response.output_text.delta", "sequence_number": 1}) != []


@pytest.mark.parametrize("reason, status", [("length", "incomplete"), ("tool_calls", "completed")])
def test_a_streamed_call_is_done_with_the_status_the_end_gives_it(reason, status):
    stream = ResponsesEncoding(ResponsesRequest.model_validate(REQUEST), "m").stream_encoder("r1", 3)
    frames = [
        *stream.start(),
        *stream.event(ToolCallDelta(0, "w", '{"a": 1')),
        *stream.event(Finished(reason, Usage(3, 4))),
    ]
    events = [json.loads(frame.split("data: ", 1)[1]) for frame in frames]
    [done] = [e for e in events if e["type"] == "response.output_item.done"]
    assert done["item"]["status"] == status == events[-1]["response"]["output"][0]["status"]
    assert [p for e in events for p in check_event(e)] == []
