"""Anthropic's wire format for engine events: the Messages SSE stream (one stateful encoder per
response) and the whole message built from the fold of the same events. Pure.

A stream's content blocks are what the whole message holds, in the same order: reasoning in a
``thinking`` block, then the answer in a ``text`` block; an answer with neither gets one empty
text block, so ``content[0]`` is always there for clients that read it.

Calls the worker ran itself (``api.tool_loop``) are no ``tool_use`` blocks, which a client
would run: each is a ``server_tool_use`` block (Anthropic's block for a tool its server ran)
followed by an ``mcp_tool_result`` block with what it gave back, then the next turn's blocks.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from ...engine.types import EngineEvent, Finished, ReasoningDelta, TextDelta, ToolCallDelta
from ...parsers.partial_json import partial_object
from ..sse import sse_event
from ..tool_loop import McpCall, McpOutcome
from ..tooling import call_id
from .protocol import error_body
from .translate import stop_reason

if TYPE_CHECKING:  # only its attributes are read; api.stream itself imports starlette
    from ..stream import Folded

# Anthropic signs thinking blocks so that it can trust them when they are sent back; nothing here
# signs, and blocks sent back are never checked. A fixed marker says so, and a non-empty one keeps
# clients that drop unsigned thinking blocks from dropping ours.
LOCAL_SIGNATURE = "vllmmlxd-local-unsigned"

# Mid-stream failures, by kind: Anthropic's types for the same failures answered before the stream.
_ERROR_TYPES = {"timeout": "timeout_error", "overloaded": "overloaded_error", "constraint": "invalid_request_error"}
CALL_PREFIX = "toolu_"
SERVER_CALL_PREFIX = "srvtoolu_"  # as Anthropic numbers the calls its server runs


def tool_input(arguments: str) -> dict:
    """A call's ``input``, always an object: its arguments, or for a call cut short by
    ``max_tokens`` what of them parses (``parsers.partial_json``), else ``{}``."""
    try:
        value = json.loads(arguments)
    except (ValueError, RecursionError):
        value = partial_object(arguments)
    return value if isinstance(value, dict) else {}


def _is_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except (ValueError, RecursionError):
        return False


def tool_use_block(message_id: str, call: ToolCallDelta) -> dict:
    return {
        "type": "tool_use",
        "id": call_id(CALL_PREFIX, message_id, call.index),
        "name": call.name,
        "input": tool_input(call.arguments),
    }


def server_tool_use_block(message_id: str, call: ToolCallDelta) -> dict:
    return {
        "type": "server_tool_use",
        "id": call_id(SERVER_CALL_PREFIX, message_id, call.index),
        "name": call.name,
        "input": json.loads(call.arguments),
    }


def mcp_tool_result_block(message_id: str, outcome: McpOutcome) -> dict:
    return {
        "type": "mcp_tool_result",
        "tool_use_id": call_id(SERVER_CALL_PREFIX, message_id, outcome.call.index),
        "is_error": outcome.is_error,
        "content": [{"type": "text", "text": outcome.text}],
    }


def message_response(message_id: str, model: str, folded: Folded) -> dict:
    """The non-streaming ``message`` body: the fold of the same events the stream sends."""
    assert folded.finish is not None
    content: list[dict] = []
    for kind, value in folded.parts:  # blocks in the order the model wrote them, as the stream sends them
        if isinstance(value, McpOutcome):  # mcp_result
            content.append(mcp_tool_result_block(message_id, value))
        elif isinstance(value, ToolCallDelta):  # a call: the worker's own (mcp_call), or the client's
            content.append((server_tool_use_block if kind == "mcp_call" else tool_use_block)(message_id, value))
        elif kind == "reasoning":
            content.append({"type": "thinking", "thinking": value, "signature": LOCAL_SIGNATURE})
        else:
            content.append({"type": "text", "text": value})
    if not content:
        content.append({"type": "text", "text": ""})
    reason, sequence = stop_reason(folded.finish)
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": {
            "input_tokens": folded.finish.usage.prompt_tokens,
            "output_tokens": folded.finish.usage.completion_tokens,
        },
    }


class MessagesEncoding:
    """The Messages API's two ways of writing a response (``api.chat.ChatEncoding``)."""

    def __init__(self, model: str):
        self.model = model

    def stream_encoder(self, rid: str, prompt_tokens: int) -> MessagesStreamEncoder:
        return MessagesStreamEncoder(rid, self.model, prompt_tokens)

    def response(self, rid: str, folded: Folded) -> dict:
        return message_response(rid, self.model, folded)


class MessagesStreamEncoder:
    """Anthropic's ``message_start`` ... ``message_stop`` frames for one response.

    A content block opens when the kind of delta changes (``thinking`` or ``text``) and closes
    when the next opens or the message ends; blocks are numbered from 0. Empty deltas send nothing.
    """

    def __init__(self, message_id: str, model: str, input_tokens: int):
        self.message_id, self.model, self.input_tokens = message_id, model, input_tokens
        self._open: str | None = None  # the kind of the open block
        self._blocks = 0  # blocks opened so far; the open one is number _blocks - 1
        self._ran_tools = False  # then usage covers several turns, input tokens included

    def start(self) -> list[str]:
        """``message_start`` with the message skeleton, then one ``ping``."""
        message: dict[str, Any] = {
            "id": self.message_id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            # Nothing is generated yet when this is sent; message_delta carries the real count.
            "usage": {"input_tokens": self.input_tokens, "output_tokens": 0},
        }
        return [_frame({"type": "message_start", "message": message}), _frame({"type": "ping"})]

    def event(self, event: EngineEvent) -> list[str]:
        """Frames for one engine event; ``Finished`` closes the open block and the message."""
        if isinstance(event, ReasoningDelta) and event.text:
            return self._delta("thinking", {"type": "thinking_delta", "thinking": event.text})
        if isinstance(event, TextDelta) and event.text:
            return self._delta("text", {"type": "text_delta", "text": event.text})
        if isinstance(event, (ToolCallDelta, McpCall)):
            # A tool_use block starts with an empty input; its JSON follows as input_json_delta.
            if isinstance(event, McpCall):
                call, block, self._ran_tools = event.call, server_tool_use_block(self.message_id, event.call), True
            else:
                call, block = event, tool_use_block(self.message_id, event)
            partial = call.arguments
            if block["type"] == "tool_use" and not _is_object(partial):  # cut short: what of it parses, as whole
                partial = json.dumps(block["input"], ensure_ascii=False)
            block = {**block, "input": {}}
            frames = self._close()
            self._open, self._blocks = "tool_use", self._blocks + 1
            frames.append(_frame({"type": "content_block_start", "index": self._blocks - 1, "content_block": block}))
            frames.append(
                _frame(
                    {
                        "type": "content_block_delta",
                        "index": self._blocks - 1,
                        "delta": {"type": "input_json_delta", "partial_json": partial},
                    }
                )
            )
            return frames + self._close()
        if isinstance(event, McpOutcome):
            frames = self._close()
            self._blocks += 1
            block = mcp_tool_result_block(self.message_id, event)
            return [
                *frames,
                _frame({"type": "content_block_start", "index": self._blocks - 1, "content_block": block}),
                _frame({"type": "content_block_stop", "index": self._blocks - 1}),
            ]
        if isinstance(event, Finished):
            frames = self._close()
            if self._blocks == 0:
                frames += self._open_block("text") + self._close()
            reason, sequence = stop_reason(event)
            usage = {"output_tokens": event.usage.completion_tokens}
            if self._ran_tools:  # message_start counted the first turn's prompt only; these are all turns'
                usage = {"input_tokens": event.usage.prompt_tokens, **usage}
            frames.append(
                _frame(
                    {
                        "type": "message_delta",
                        "delta": {"stop_reason": reason, "stop_sequence": sequence},
                        "usage": usage,
                    }
                )
            )
            frames.append(_frame({"type": "message_stop"}))
            return frames
        return []

    def error(self, message: str, kind: str) -> list[str]:
        """An ``error`` event, as Anthropic's stream sends one; the SDKs raise it as an APIStatusError."""
        return [_frame(error_body(_ERROR_TYPES.get(kind, "api_error"), message))]

    def end(self) -> list[str]:
        """Nothing: Anthropic's stream ends at ``message_stop`` (there is no ``[DONE]``)."""
        return []

    def _delta(self, kind: str, delta: dict) -> list[str]:
        frames = [] if self._open == kind else self._close() + self._open_block(kind)
        frames.append(_frame({"type": "content_block_delta", "index": self._blocks - 1, "delta": delta}))
        return frames

    def _open_block(self, kind: str) -> list[str]:
        empty = {"thinking": "", "signature": ""} if kind == "thinking" else {"text": ""}
        block = {"type": kind, **empty}
        self._open, self._blocks = kind, self._blocks + 1
        return [_frame({"type": "content_block_start", "index": self._blocks - 1, "content_block": block})]

    def _close(self) -> list[str]:
        if self._open is None:
            return []
        index, frames = self._blocks - 1, []
        if self._open == "thinking":
            # Anthropic sends a thinking block's signature last, just before its stop.
            frames.append(
                _frame(
                    {
                        "type": "content_block_delta",
                        "index": index,
                        "delta": {"type": "signature_delta", "signature": LOCAL_SIGNATURE},
                    }
                )
            )
        self._open = None
        frames.append(_frame({"type": "content_block_stop", "index": index}))
        return frames


def _frame(data: dict) -> str:
    # Every frame is named by its type: the SDKs drop frames without an ``event:`` line.
    return sse_event(data["type"], data)
