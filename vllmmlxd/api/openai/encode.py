"""OpenAI's wire format for engine events: streamed chunks (one stateful encoder per response)
and whole responses built from the fold of the same events. Pure.

Calls the worker ran itself (``api.tool_loop``) are no ``tool_calls``: a client that finds
calls in a message runs them. They travel in an extension, ``mcp_calls`` (each call with its
``result``), on the message or, streamed, on deltas indexed like ``tool_calls`` so that
clients merging deltas put each call and its result together.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...engine.types import EngineEvent, Finished, Logprobs, ReasoningDelta, TextDelta, ToolCallDelta, Usage
from ..errors import openai_error
from ..logprob_format import completion_logprobs, token_entries
from ..sse import DONE, sse_data
from ..stream import ChoiceEvent, Folded
from ..tool_loop import McpCall, McpOutcome
from ..tooling import call_id

CALL_PREFIX = "call_"


def tool_call(rid: str, call: ToolCallDelta) -> dict:
    return {
        "id": call_id(CALL_PREFIX, rid, call.index),
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    }


def mcp_call(rid: str, call: ToolCallDelta) -> dict:
    """An executed call, without its result (``mcp_calls`` entries, and the streamed call)."""
    return {
        "id": call_id(CALL_PREFIX, rid, call.index),
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    }


def mcp_result(outcome: McpOutcome) -> dict:
    return {"content": outcome.text, "is_error": outcome.is_error}


def finish_reason(reason: str) -> str:
    return reason if reason in ("length", "tool_calls") else "stop"


def usage_dict(usage: Usage) -> dict:
    """OpenAI's usage object; the prompt tokens served from the prefix cache as its
    ``prompt_tokens_details.cached_tokens`` says them."""
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
        # A predicted output's tokens the answer kept, and those it did not (drafted and rejected).
        "completion_tokens_details": {
            "accepted_prediction_tokens": usage.accepted_predicted,
            "rejected_prediction_tokens": usage.predicted_tokens - usage.accepted_predicted,
        },
    }


def envelope(rid: str, obj: str, created: int, model: str, choices: list[dict], usage: Usage | None = None) -> dict:
    """What every OpenAI response and chunk shares; ``usage`` last, when there is one."""
    body = {"id": rid, "object": obj, "created": created, "model": model, "choices": choices}
    if usage is not None:
        body["usage"] = usage_dict(usage)
    return body


@dataclass(frozen=True)
class LogprobsAsked:
    """What a request asked of log-probabilities: whether any (each choice then has its ``logprobs``
    object), and tokens named by id (vLLM's ``return_tokens_as_token_ids``)."""

    wanted: bool = False
    as_ids: bool = False


def chat_logprobs(entries: list[Any], as_ids: bool = False) -> dict[str, Any]:
    return {"content": token_entries(entries, as_ids), "refusal": None}


def chat_choice(rid: str, folded: Folded, index: int = 0, asked: LogprobsAsked = LogprobsAsked()) -> dict:
    """One choice of a chat completion: its message, log-probabilities and finish reason."""
    assert folded.finish is not None
    message: dict[str, Any] = {"role": "assistant", "content": folded.text}
    if folded.tool_calls:
        message["content"] = folded.text or None  # as OpenAI answers a turn that only calls tools
        message["tool_calls"] = [tool_call(rid, c) for c in folded.tool_calls]
    if folded.executed:
        message["mcp_calls"] = [{**mcp_call(rid, o.call), "result": mcp_result(o)} for o in folded.executed]
    if folded.reasoning:
        # reasoning_content is what most clients read; newer ones read reasoning.
        message["reasoning_content"] = message["reasoning"] = folded.reasoning
    return {
        "index": index,
        "message": message,
        "logprobs": chat_logprobs(folded.logprobs, asked.as_ids) if asked.wanted else None,
        "finish_reason": finish_reason(folded.finish.reason),
    }


def each_choice(folded: Folded) -> list[tuple[int, Folded]]:
    """The folded answer's choices, by index: n > 1's, or the one."""
    return sorted(folded.choices.items()) if folded.choices else [(0, folded)]


def chat_response(rid: str, created: int, model: str, folded: Folded, asked: LogprobsAsked = LogprobsAsked()) -> dict:
    assert folded.finish is not None
    choices = [chat_choice(rid, one, i, asked) for i, one in each_choice(folded)]
    return envelope(rid, "chat.completion", created, model, choices, folded.finish.usage)


def completion_response(
    rid: str, created: int, model: str, folded: Folded, asked: LogprobsAsked = LogprobsAsked()
) -> dict:
    assert folded.finish is not None
    choices = [
        {
            "index": i,
            "text": one.text,
            "logprobs": completion_logprobs(one.logprobs, 0, asked.as_ids) if asked.wanted else None,
            "finish_reason": finish_reason(one.finish.reason if one.finish else "stop"),
        }
        for i, one in each_choice(folded)
    ]
    return envelope(rid, "text_completion", created, model, choices, folded.finish.usage)


class ChatEncoding:
    """Chat completions' two ways of writing a response (``api.chat.ChatEncoding``); ``logprobs``:
    the request asked for them (each choice then has its ``logprobs`` object, empty or not)."""

    def __init__(
        self, created: int, model: str, include_usage: bool, asked: LogprobsAsked = LogprobsAsked(), n: int = 1
    ):
        self.created, self.model, self.include_usage, self.asked, self.n = created, model, include_usage, asked, n

    def stream_encoder(self, rid: str, prompt_tokens: int) -> ChatStreamEncoder | ChoicesStreamEncoder:
        if self.n > 1:
            return ChoicesStreamEncoder(
                [ChatStreamEncoder(rid, self.created, self.model, False, self.asked.as_ids, i) for i in range(self.n)],
                ChatStreamEncoder(rid, self.created, self.model, self.include_usage),
            )
        return ChatStreamEncoder(rid, self.created, self.model, self.include_usage, self.asked.as_ids)

    def response(self, rid: str, folded: Folded) -> dict:
        return chat_response(rid, self.created, self.model, folded, self.asked)


class _Encoder:
    """Shared by chat and text completions: the envelope, the usage chunk, errors and [DONE]."""

    object_name = ""

    def __init__(self, rid: str, created: int, model: str, include_usage: bool, as_ids: bool = False, index: int = 0):
        self.rid, self.created, self.model, self.include_usage = rid, created, model, include_usage
        self.as_ids, self.index = as_ids, index
        self.pending: list[Any] = []  # log-probabilities for the next chunk (the tokens it carries)

    def _held(self) -> list[Any]:
        held, self.pending = self.pending, []
        return held

    def _chunk(self, choice: dict) -> str:
        return sse_data(envelope(self.rid, self.object_name, self.created, self.model, [choice]))

    def _finished(self, event: Finished, last_choice: dict) -> list[str]:
        frames = [self._chunk(last_choice)]
        if self.include_usage:
            frames.append(sse_data(envelope(self.rid, self.object_name, self.created, self.model, [], event.usage)))
        return frames

    def error(self, message: str, kind: str) -> list[str]:
        if kind == "timeout":
            return [sse_data(openai_error(message, "timeout_error", code="timeout"))]
        if kind == "constraint":
            return [sse_data(openai_error(message, "invalid_request_error", code="constraint_failed"))]
        return [sse_data(openai_error(message, "server_error"))]

    def end(self) -> list[str]:
        return [DONE]


class ChatStreamEncoder(_Encoder):
    """``chat.completion.chunk`` frames: the role first, reasoning deltas, then content deltas."""

    object_name = "chat.completion.chunk"

    def __init__(self, rid: str, created: int, model: str, include_usage: bool, as_ids: bool = False, index: int = 0):
        super().__init__(rid, created, model, include_usage, as_ids, index)
        self._mcp_index: dict[int, int] = {}  # an executed call's index among the response's calls -> in mcp_calls

    def _delta(self, delta: dict, finish: str | None = None) -> str:
        held = self._held()
        logprobs = chat_logprobs(held, self.as_ids) if held else None
        return self._chunk({"index": self.index, "delta": delta, "logprobs": logprobs, "finish_reason": finish})

    def start(self) -> list[str]:
        return [self._delta({"role": "assistant", "content": ""})]

    def _mcp(self, call: ToolCallDelta, entry: dict) -> str:
        # Indexed by the order the calls ran: a delta-merging client inserts each new index at its place.
        index = self._mcp_index.setdefault(call.index, len(self._mcp_index))
        return self._delta({"mcp_calls": [{"index": index, **entry}]})

    def event(self, event: EngineEvent) -> list[str]:
        if isinstance(event, Logprobs):  # they go with the chunk of the text their tokens made
            self.pending += event.entries
            return []
        if isinstance(event, TextDelta):
            return [self._delta({"content": event.text})]
        if isinstance(event, ReasoningDelta):
            return [self._delta({"reasoning_content": event.text, "reasoning": event.text})]
        if isinstance(event, ToolCallDelta):
            # The call's id and name first, then its arguments: clients concatenate the fragments.
            head = {**tool_call(self.rid, event), "function": {"name": event.name, "arguments": ""}}
            return [
                self._delta({"tool_calls": [{"index": event.index, **head}]}),
                self._delta({"tool_calls": [{"index": event.index, "function": {"arguments": event.arguments}}]}),
            ]
        if isinstance(event, McpCall):  # sent before it runs: a client sees what the model is waiting for
            return [self._mcp(event.call, mcp_call(self.rid, event.call))]
        if isinstance(event, McpOutcome):
            return [self._mcp(event.call, {"result": mcp_result(event)})]
        if isinstance(event, Finished):
            held = self._held()
            last = {"index": self.index, "delta": {}, "logprobs": chat_logprobs(held, self.as_ids) if held else None}
            return self._finished(event, {**last, "finish_reason": finish_reason(event.reason)})
        return []


class CompletionStreamEncoder(_Encoder):
    """``text_completion`` frames; a raw completion has no reasoning to send apart."""

    object_name = "text_completion"
    offset = 0  # characters of the choice's text sent so far (log-probabilities' text_offset)

    def _text(self, text: str, finish: str | None = None) -> dict:
        held = self._held()
        logprobs = completion_logprobs(held, self.offset, self.as_ids) if held else None
        self.offset += len(text)
        return {"index": self.index, "text": text, "logprobs": logprobs, "finish_reason": finish}

    def start(self) -> list[str]:
        return []

    def event(self, event: EngineEvent) -> list[str]:
        if isinstance(event, Logprobs):
            self.pending += event.entries
            return []
        if isinstance(event, (TextDelta, ReasoningDelta)):
            return [self._chunk(self._text(event.text))]
        if isinstance(event, Finished):
            return self._finished(event, self._text("", finish_reason(event.reason)))
        return []


class ChoicesStreamEncoder:
    """n choices' frames (``api.choices``): each choice's own encoder writes its chunks, indexed;
    ``last`` writes the usage chunk (of all choices, once) and the end."""

    def __init__(self, each: list[Any], last: _Encoder):
        self.each, self.last = each, last

    def start(self) -> list[str]:
        return [frame for encoder in self.each for frame in encoder.start()]

    def event(self, event: Any) -> list[str]:
        if isinstance(event, ChoiceEvent):
            return self.each[event.index].event(event.event)
        if isinstance(event, Finished) and self.last.include_usage:  # every choice has finished
            return [
                sse_data(
                    envelope(self.last.rid, self.last.object_name, self.last.created, self.last.model, [], event.usage)
                )
            ]
        return []

    def error(self, message: str, kind: str) -> list[str]:
        return self.last.error(message, kind)

    def end(self) -> list[str]:
        return self.last.end()
