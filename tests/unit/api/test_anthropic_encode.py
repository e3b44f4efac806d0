"""Unit tests of the Anthropic encoder: the frames' order and shapes, read back by the official SDK's
own event models and stream accumulator, and the whole message as the fold of the same events."""

from __future__ import annotations

import functools
import json

import anthropic
import httpx2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter

from vllmmlxd.api.anthropic.encode import LOCAL_SIGNATURE, MessagesStreamEncoder, message_response
from vllmmlxd.api.stream import Folded
from vllmmlxd.engine.types import Finished, ReasoningDelta, TextDelta, Usage

DONE = Finished("stop", Usage(7, 3))


@functools.cache
def sdk():
    """The SDK's message model, its event adapter and its stream accumulator. Imported by the first
    test that reads with them: every test process imports this file to collect it."""
    from anthropic.lib.streaming._messages import accumulate_event
    from anthropic.types import Message, RawMessageStreamEvent

    return Message, TypeAdapter(RawMessageStreamEvent), accumulate_event


def message(body):
    return sdk()[0].model_validate(body)


def encode(events, error=None):
    """Every frame of one response, as the stream layer would send them."""
    enc = MessagesStreamEncoder("msg_1", "local-model", 7)
    frames = enc.start()
    for event in events:
        frames += enc.event(event)
    if error:
        frames += enc.error(*error)
    return frames + enc.end()


def parse(frames):
    """Each frame's data; every frame is one ``event:`` line naming its data's type, then one ``data:`` line."""
    out = []
    for frame in frames:
        head, data, rest = frame.split("\n", 2)
        assert head.startswith("event: ") and data.startswith("data: ") and rest == "\n"
        obj = json.loads(data[len("data: ") :])
        assert head[len("event: ") :] == obj["type"]
        out.append(obj)
    return out


def outline(frames):
    """The order of events, with what each block or delta is."""
    names = []
    for obj in parse(frames):
        detail = (obj.get("content_block") or obj.get("delta") or {}).get("type") if "index" in obj else None
        names.append(f"{obj['type']}:{detail}" if detail else obj["type"])
    return names


def fold(events):
    folded = Folded()
    for event in events:
        folded.add(event)
    return folded


def accumulated(frames):
    """The message the SDK's own accumulator builds from the frames, each event validated strictly first."""
    _, event, accumulate = sdk()
    snapshot = None
    for obj in parse(frames):
        if obj["type"] in ("ping", "error"):
            continue  # the SDK's Stream skips pings and raises errors before accumulating
        snapshot = accumulate(event=event.validate_python(obj), current_snapshot=snapshot, json_bufs={})
    return message(snapshot.to_dict())


def sdk_client(body: bytes, content_type: str) -> anthropic.Anthropic:
    """A real SDK client whose transport answers every request with ``body``."""

    def answer(request):
        return httpx2.Response(200, headers={"content-type": content_type}, content=body)

    return anthropic.Anthropic(
        base_url="http://local.test",
        api_key="k",
        max_retries=0,
        http_client=httpx2.Client(transport=httpx2.MockTransport(answer)),
    )


ASK = {"model": "local-model", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
START = ["message_start", "ping"]
END = ["message_delta", "message_stop"]


def test_text_only():
    frames = encode([TextDelta("Hel"), TextDelta(""), TextDelta("lo"), DONE])
    assert outline(frames) == [
        *START,
        "content_block_start:text",
        "content_block_delta:text_delta",
        "content_block_delta:text_delta",
        "content_block_stop",
        *END,
    ]
    data = parse(frames)
    assert data[0]["message"] == {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "local-model",
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": 7, "output_tokens": 0},
    }
    assert data[2] == {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
    assert data[-2] == {
        "type": "message_delta",
        "delta": {"stop_reason": "end_turn", "stop_sequence": None},
        "usage": {"output_tokens": 3},
    }
    assert data[-1] == {"type": "message_stop"}


def test_reasoning_then_text_are_two_blocks_in_order():
    events = [ReasoningDelta("think"), ReasoningDelta(" more"), TextDelta("Paris"), DONE]
    frames = encode(events)
    assert outline(frames) == [
        *START,
        "content_block_start:thinking",
        "content_block_delta:thinking_delta",
        "content_block_delta:thinking_delta",
        "content_block_delta:signature_delta",
        "content_block_stop",
        "content_block_start:text",
        "content_block_delta:text_delta",
        "content_block_stop",
        *END,
    ]
    data = parse(frames)
    assert data[2]["content_block"] == {"type": "thinking", "thinking": "", "signature": ""}
    assert [d["index"] for d in data if "index" in d] == [0, 0, 0, 0, 0, 1, 1, 1]
    assert data[5]["delta"] == {"type": "signature_delta", "signature": LOCAL_SIGNATURE}
    body = message_response("msg_1", "local-model", fold(events))
    assert body["content"] == [
        {"type": "thinking", "thinking": "think more", "signature": LOCAL_SIGNATURE},
        {"type": "text", "text": "Paris"},
    ]
    assert accumulated(frames) == message(body)


def test_reasoning_that_never_ends_is_closed_with_the_message():
    events = [ReasoningDelta("hmm"), ReasoningDelta("..."), Finished("length", Usage(7, 2))]
    frames = encode(events)
    assert outline(frames) == [
        *START,
        "content_block_start:thinking",
        "content_block_delta:thinking_delta",
        "content_block_delta:thinking_delta",
        "content_block_delta:signature_delta",
        "content_block_stop",
        *END,
    ]
    body = message_response("msg_1", "local-model", fold(events))
    assert [b["type"] for b in body["content"]] == ["thinking"] and body["stop_reason"] == "max_tokens"
    assert accumulated(frames) == message(body)


def test_empty_output_is_one_empty_text_block_both_ways():
    events = [TextDelta(""), ReasoningDelta(""), DONE]
    frames = encode(events)
    assert outline(frames) == [*START, "content_block_start:text", "content_block_stop", *END]
    body = message_response("msg_1", "local-model", fold(events))
    assert body["content"] == [{"type": "text", "text": ""}]
    assert accumulated(frames) == message(body)


@pytest.mark.parametrize(
    "finished,reason,sequence",
    [
        (Finished("stop", Usage(7, 4), stop_sequence="END"), "stop_sequence", "END"),
        (Finished("length", Usage(7, 16)), "max_tokens", None),
        (Finished("tool_calls", Usage(7, 5)), "tool_use", None),
    ],
)
def test_how_it_ended_is_in_message_delta_and_the_body(finished, reason, sequence):
    events = [TextDelta("some text"), finished]
    data = parse(encode(events))
    assert data[-2]["delta"] == {"stop_reason": reason, "stop_sequence": sequence}
    assert data[-2]["usage"] == {"output_tokens": finished.usage.completion_tokens}
    body = message_response("msg_1", "local-model", fold(events))
    assert (body["stop_reason"], body["stop_sequence"]) == (reason, sequence)
    assert body["usage"] == {"input_tokens": 7, "output_tokens": finished.usage.completion_tokens}


def test_whole_body_shape():
    body = message_response("msg_9", "m", fold([TextDelta("hi"), DONE]))
    assert body == {
        "id": "msg_9",
        "type": "message",
        "role": "assistant",
        "model": "m",
        "content": [{"type": "text", "text": "hi"}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 7, "output_tokens": 3},
    }


@pytest.mark.parametrize("kind,type_", [("server", "api_error"), ("timeout", "timeout_error")])
def test_mid_stream_error_is_an_error_event_and_nothing_after(kind, type_):
    frames = encode([ReasoningDelta("a"), TextDelta("b")], error=("it broke", kind))
    assert outline(frames)[-2:] == ["content_block_delta:text_delta", "error"]
    assert parse(frames)[-1] == {"type": "error", "error": {"type": type_, "message": "it broke"}}
    client = sdk_client("".join(frames).encode(), "text/event-stream")
    with pytest.raises(anthropic.APIStatusError) as e, client.messages.stream(**ASK) as stream:
        stream.get_final_message()
    assert e.value.body == {"type": "error", "error": {"type": type_, "message": "it broke"}}


def test_the_end_adds_nothing():
    assert MessagesStreamEncoder("m", "m", 1).end() == []


def test_the_sdk_reads_the_stream_and_the_body_as_the_same_message():
    events = [
        ReasoningDelta("Let me think."),
        TextDelta("Hello"),
        TextDelta(", world"),
        Finished("stop", Usage(7, 6), stop_sequence="\n\n"),
    ]
    with sdk_client("".join(encode(events)).encode(), "text/event-stream").messages.stream(**ASK) as stream:
        texts = list(stream.text_stream)
        streamed = stream.get_final_message()
    whole = sdk_client(
        json.dumps(message_response("msg_1", "local-model", fold(events))).encode(), "application/json"
    ).messages.create(**ASK)
    assert texts == ["Hello", ", world"]
    assert message(streamed.to_dict()) == whole
    assert whole.content[0].type == "thinking" and whole.content[1].text == "Hello, world"
    assert (whole.stop_reason, whole.stop_sequence, whole.usage.output_tokens) == ("stop_sequence", "\n\n", 6)


chunks = st.lists(st.text(max_size=6), max_size=5)
endings = st.sampled_from(
    [Finished("stop", Usage(7, 9)), Finished("length", Usage(7, 9)), Finished("stop", Usage(7, 9), stop_sequence="###")]
)


@settings(max_examples=60, deadline=None)
@given(reasoning=chunks, text=chunks, finished=endings)
def test_the_whole_message_is_the_fold_of_the_stream(reasoning, text, finished):
    events = [ReasoningDelta(r) for r in reasoning] + [TextDelta(t) for t in text] + [finished]
    frames = encode(events)
    data = parse(frames)
    indexes = [d["index"] for d in data if d["type"] == "content_block_start"]
    assert indexes == list(range(len(indexes)))
    assert all(
        d["delta"].get("text") or d["delta"].get("thinking") or d["delta"].get("signature")
        for d in data
        if d["type"] == "content_block_delta"
    )  # no empty deltas
    assert accumulated(frames) == message(message_response("msg_1", "local-model", fold(events)))
