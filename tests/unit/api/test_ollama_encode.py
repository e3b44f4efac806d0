"""Unit tests of Ollama's encoding: NDJSON lines read back by the official client's own models,
the whole answer as the fold of the same events, the closing counts and durations, and what
show and ps say of a model."""

import json

import ollama
import pytest

from vllmmlxd.api.ollama import describe
from vllmmlxd.api.ollama.encode import (
    ChatStreamEncoder,
    Clock,
    GenerateStreamEncoder,
    chat_response,
    generate_response,
    load_answer,
)
from vllmmlxd.api.stream import Folded
from vllmmlxd.engine.types import Finished, ReasoningDelta, TextDelta, ToolCallDelta, Usage

DONE = Finished("stop", Usage(7, 3))
EVENTS = [ReasoningDelta("hm"), TextDelta("Hel"), TextDelta("lo"), ToolCallDelta(0, "f", '{"a": 1}', 4), DONE]


class Progress:
    started_at, first_token_at, last_token_at = 10.0, 10.5, 12.0


def clock():
    return Clock(started=9.0, progress=lambda: Progress())


def lines(encoder, events):
    out = encoder.start()
    for event in events:
        out += encoder.event(event)
    out += encoder.end()
    assert all(line.endswith("\n") and "\n" not in line[:-1] for line in out)  # one JSON object a line
    return [json.loads(line) for line in out]


def test_chat_lines_read_by_the_official_client_add_up_to_the_whole_answer():
    parts = [ollama.ChatResponse.model_validate(p) for p in lines(ChatStreamEncoder("r1", "tiny", clock()), EVENTS)]
    assert [p.done for p in parts] == [False, False, False, False, True]
    assert "".join(p.message.content for p in parts) == "Hello"
    assert "".join(p.message.thinking or "" for p in parts) == "hm"
    (call,) = parts[3].message.tool_calls
    assert call.function.name == "f" and call.function.arguments == {"a": 1}
    folded = Folded()
    for event in EVENTS:
        folded.add(event)
    whole = ollama.ChatResponse.model_validate(chat_response("r1", "tiny", folded, clock()))
    assert whole.message.content == "Hello" and whole.message.thinking == "hm"
    assert whole.message.tool_calls == parts[3].message.tool_calls
    assert whole.done_reason == parts[-1].done_reason == "stop"


def test_the_closing_line_carries_counts_and_nanosecond_durations():
    last = lines(ChatStreamEncoder("r1", "tiny", clock()), [Finished("length", Usage(7, 3))])[-1]
    assert last["done"] and last["done_reason"] == "length"
    assert last["prompt_eval_count"] == 7 and last["eval_count"] == 3
    assert last["prompt_eval_duration"] == 500_000_000 and last["eval_duration"] == 1_500_000_000
    assert last["load_duration"] == 0 and last["total_duration"] >= 3_000_000_000
    assert last["created_at"].endswith("Z") and last["message"] == {"role": "assistant", "content": ""}


def test_a_tool_calls_turn_is_done_with_stop():
    assert (
        lines(ChatStreamEncoder("r", "m", clock()), [Finished("tool_calls", Usage(1, 1))])[-1]["done_reason"] == "stop"
    )


def test_generate_lines_and_whole_answer():
    events = [ReasoningDelta("hm"), TextDelta("Once"), TextDelta(" upon"), DONE]
    parts = [
        ollama.GenerateResponse.model_validate(p) for p in lines(GenerateStreamEncoder("r", "tiny", clock()), events)
    ]
    assert "".join(p.response for p in parts) == "Once upon" and parts[0].thinking == "hm" and parts[-1].done
    folded = Folded()
    for event in events:
        folded.add(event)
    whole = ollama.GenerateResponse.model_validate(generate_response("r", "tiny", folded, clock()))
    assert whole.response == "Once upon" and whole.thinking == "hm" and whole.eval_count == 3


def test_an_error_mid_stream_is_one_line_the_client_raises():
    (line,) = ChatStreamEncoder("r", "m", clock()).error("took too long", "timeout")
    assert json.loads(line) == {"error": "took too long"}


@pytest.mark.parametrize("chat", [True, False])
def test_nothing_to_generate_loads_or_unloads(chat):
    assert load_answer("m", chat=chat, unload=False)["done_reason"] == "load"
    assert load_answer("m", chat=chat, unload=True)["done_reason"] == "unload"


FACTS = describe.Facts(
    name="tiny",
    source="/models/tiny",
    context_length=2048,
    template="{{ messages }}",
    family="llama",
    quantization_bits=4,
    size_bytes=1234,
    capabilities=describe.capabilities(generates=True, tools=True, thinking=False, vision=False, embeds=True),
    parameters=(("temperature", 0.7), ("num_ctx", 2048)),
    started=0.0,
)


def test_show_reads_as_the_official_clients_show_response():
    shown = ollama.ShowResponse.model_validate(describe.show_body(FACTS))
    assert shown.capabilities == ["completion", "tools", "embedding"]
    assert shown.modelinfo["llama.context_length"] == 2048 and shown.template == "{{ messages }}"
    assert shown.details.family == "llama" and shown.details.quantization_level == "Q4"
    assert shown.parameters.splitlines()[0].split() == ["temperature", "0.7"]


def test_ps_line_and_its_expiry():
    assert describe.expires_at(None, 0.0) == describe.FOREVER
    assert describe.expires_at(300, 100, now=0.0) == "1970-01-01T00:03:20.000000Z"
    assert describe.expires_at(0, 5, now=0.0) == "1970-01-01T00:00:00.000000Z"
    (model,) = ollama.ProcessResponse.model_validate({"models": [describe.ps_line(FACTS, describe.FOREVER)]}).models
    assert model.model == "tiny" and model.size == 1234 and model.context_length == 2048


def test_capabilities_of_an_embeddings_only_entry():
    assert describe.capabilities(generates=False, tools=True, thinking=True, vision=True, embeds=True) == ("embedding",)
