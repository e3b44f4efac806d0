"""The Responses API's wire format: the response object with its output items, and the stream of
typed events (each with its ``sequence_number``) that builds the same object. Pure.

Output items, in the order the model wrote them: ``reasoning`` (its thinking, as a summary
text), ``message`` (one ``output_text`` part), ``function_call`` (``call_id``, ``name``,
``arguments``), and ``mcp_call`` for a tool the worker ran itself (with its ``output``).
"""

from __future__ import annotations

import base64
import hashlib
import time
from collections.abc import Callable, Sequence
from typing import Any

from ...config.mcp import MCP_TOOL_SEPARATOR
from ...engine.types import EngineEvent, Finished, Logprobs, ReasoningDelta, TextDelta, ToolCallDelta, Usage
from ..logprob_format import token_entries
from ..openai.translate import extended_sampling
from ..sampling import Applied, applied
from ..sse import sse_event
from ..stream import Folded
from ..tool_loop import McpCall, McpOutcome
from ..tooling import call_id
from .ids import response_id
from .protocol import ResponsesRequest
from .translate import namespaced

Spaces = dict[str, tuple[str, str]]


def item_id(prefix: str, rid: str, n: int) -> str:
    """An output item's id, the same in a stream and in the whole response of one request."""
    return prefix + hashlib.sha256(f"{rid}:item:{n}".encode()).hexdigest()[:24]


def usage(u: Usage) -> dict[str, Any]:
    return {
        "input_tokens": u.prompt_tokens,
        "input_tokens_details": {"cached_tokens": u.cached_tokens},
        "output_tokens": u.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": u.total_tokens,
    }


def text_part(text: str, logprobs: Sequence[Any] = ()) -> dict[str, Any]:
    """An ``output_text`` part; ``logprobs``: its tokens' (``include: message.output_text.logprobs``)."""
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": token_entries(logprobs)}


def message_item(iid: str, text: str, status: str = "completed", logprobs: Sequence[Any] = ()) -> dict[str, Any]:
    """An assistant message; ``in_progress`` while streamed (its part comes in its own events),
    ``incomplete`` when the token limit cut it."""
    content = [] if status == "in_progress" else [text_part(text, logprobs)]
    return {"id": iid, "type": "message", "role": "assistant", "status": status, "content": content}


def reasoning_item(iid: str, text: str, sealed: bool = False) -> dict[str, Any]:
    """The model's thinking as a summary; ``sealed`` (``include: reasoning.encrypted_content``) adds
    the opaque ``encrypted_content`` clients send back on a stateless next turn. Nothing is secret
    from the client here (the summary is the whole text), and input reasoning is dropped anyway,
    so it is the text, base64-encoded."""
    item: dict[str, Any] = {
        "id": iid,
        "type": "reasoning",
        "summary": [{"type": "summary_text", "text": text}] if text else [],
    }
    if sealed:
        item["encrypted_content"] = base64.b64encode(text.encode()).decode()
    return item


def call_item(
    iid: str, rid: str, call: ToolCallDelta, status: str = "completed", spaces: Spaces | None = None
) -> dict[str, Any]:
    """A function call; a namespaced tool's (``spaces``: the model's name → namespace, name) with
    its ``namespace`` and its own name, as the request declared it."""
    space, name = (spaces or {}).get(call.name, (None, call.name))
    item = {
        "id": iid,
        "type": "function_call",
        "status": status,
        "call_id": call_id("call_", rid, call.index),
        "name": name,
        "arguments": "" if status == "in_progress" else call.arguments,
    }
    return item if space is None else {**item, "namespace": space}


def mcp_item(iid: str, outcome: McpOutcome) -> dict[str, Any]:
    server, _, tool = outcome.call.name.partition(MCP_TOOL_SEPARATOR)
    return {
        "id": iid,
        "type": "mcp_call",
        "server_label": server,
        "name": tool or outcome.call.name,
        "arguments": outcome.call.arguments,
        "output": None if outcome.is_error else outcome.text,
        "error": outcome.text if outcome.is_error else None,
    }


def echoed_tool(tool: Any) -> Any:
    """A tool as the response lists it: as sent, a function tool with its (nullable) ``strict``
    and ``description``, which the spec requires."""
    if isinstance(tool, dict) and tool.get("type") == "function":
        return {"description": None, "parameters": None, "strict": None, **tool}
    if isinstance(tool, dict) and tool.get("type") == "namespace" and isinstance(tool.get("tools"), list):
        return {**tool, "tools": [echoed_tool(t) for t in tool["tools"]]}
    return tool


def echoed_format(format: dict[str, Any] | None) -> dict[str, Any]:
    """``text.format`` as the response lists it: a JSON schema's with its (nullable) description
    and ``strict``, true: the output is held to the schema while decoding, whatever was asked."""
    if not format:
        return {"type": "text"}
    if format.get("type") == "json_schema":
        return {"name": "response", "description": None, "schema": None, **format, "strict": True}
    return format


def final_status(finish: Finished | None) -> str:
    """An item's or a response's status once it is written: ``incomplete`` when the token limit cut it."""
    return "incomplete" if finish is not None and finish.reason == "length" else "completed"


class ResponseShape:
    """What every response object of one request carries besides its output: the request's
    settings, with the sampling values it runs with (``applied``: the entry's defaults filled in)."""

    def __init__(self, req: ResponsesRequest, model: str, values: Applied | None = None):
        self.model = model
        self.spaces = namespaced(req.tools)
        self.sealed = "reasoning.encrypted_content" in (req.include or ())
        self.created_at = int(time.time())
        values = values or applied(extended_sampling(req, req.max_output_tokens), None)
        reasoning = req.reasoning
        self.settings = {
            "instructions": req.instructions,
            "max_output_tokens": req.max_output_tokens,
            "max_tool_calls": req.max_tool_calls,
            "parallel_tool_calls": req.parallel_tool_calls is not False,
            "temperature": values.temperature,
            "top_p": values.top_p,
            "presence_penalty": values.presence_penalty,
            "frequency_penalty": values.frequency_penalty,
            "top_logprobs": req.top_logprobs or 0,
            "tool_choice": req.tool_choice or "auto",
            "tools": [echoed_tool(t) for t in req.tools or ()],
            "text": {"format": echoed_format(req.text.format if req.text else None)},
            "truncation": req.truncation,
            "metadata": req.metadata or {},
            "user": req.user,
            "safety_identifier": req.safety_identifier,
            "prompt_cache_key": req.prompt_cache_key,
            "previous_response_id": req.previous_response_id,
            "reasoning": {
                "effort": reasoning.effort if reasoning else None,
                "summary": reasoning.summary if reasoning else None,
            },
            "store": req.store,
            "background": False,
            "service_tier": "default",
        }

    def body(self, rid: str, status: str, output: list[dict], finish: Finished | None) -> dict[str, Any]:
        incomplete = final_status(finish) == "incomplete"
        return {
            "id": rid,
            "object": "response",
            "created_at": self.created_at,
            "completed_at": int(time.time()) if finish is not None else None,
            "status": "incomplete" if incomplete and status == "completed" else status,
            "model": self.model,
            "output": output,
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
            "usage": usage(finish.usage) if finish is not None else None,
            **self.settings,
        }

    def reasoning(self, iid: str, text: str) -> dict[str, Any]:
        return reasoning_item(iid, text, self.sealed)

    def call(self, iid: str, rid: str, call: ToolCallDelta, status: str = "completed") -> dict[str, Any]:
        return call_item(iid, rid, call, status, self.spaces)


def output_items(rid: str, folded: Folded, shape: ResponseShape) -> list[dict[str, Any]]:
    """The folded answer as output items, in the order the model wrote them; the last, when the
    token limit cut it, ``incomplete``."""
    items: list[dict[str, Any]] = []
    for i, part in enumerate(folded.parts):
        n = len(items)
        status = final_status(folded.finish) if i == len(folded.parts) - 1 else "completed"
        if part[0] == "text":
            items.append(message_item(item_id("msg_", rid, n), part[1], status, folded.part_logprobs.get(i, [])))
        elif part[0] == "reasoning":
            items.append(shape.reasoning(item_id("rs_", rid, n), part[1]))
        elif part[0] == "tool_call":
            items.append(shape.call(item_id("fc_", rid, n), rid, part[1], status))
        elif part[0] == "mcp_result":
            items.append(mcp_item(item_id("mcp_", rid, n), part[1]))
    return items


Done = Callable[[dict[str, Any]], None]
# Per kind of open item: its id prefix, its delta event, and which part of the item the delta is in.
DELTAS = {
    "text": ("msg_", "response.output_text.delta", "content_index"),
    "reasoning": ("rs_", "response.reasoning_summary_text.delta", "summary_index"),
}


class ResponsesEncoding:
    """The Responses API's two ways of writing one response (``api.chat.ChatEncoding``); ``done``
    is given the whole response object once it is written (the store keeps it)."""

    def __init__(
        self, req: ResponsesRequest, model: str, done: Done = lambda body: None, values: Applied | None = None
    ):
        self.shape, self.done = ResponseShape(req, model, values), done
        self._ids: dict[str, str] = {}

    def response_id(self, rid: str) -> str:
        """The response served under request ``rid``: an id minted once for it (``ids.py``), never the
        request's own (a client may choose that one, and /v1/status shows it)."""
        if rid not in self._ids:
            self._ids[rid] = response_id(self.shape.model)
        return self._ids[rid]

    def stream_encoder(self, rid: str, prompt_tokens: int) -> ResponsesStreamEncoder:
        return ResponsesStreamEncoder(self.response_id(rid), self.shape, self.done)

    def response(self, rid: str, folded: Folded) -> dict[str, Any]:
        rid = self.response_id(rid)
        body = self.shape.body(rid, "completed", output_items(rid, folded, self.shape), folded.finish)
        self.done(body)
        return body


class ResponsesStreamEncoder:
    """The documented event sequence: created, in_progress, then per item added / deltas / done,
    then completed (or incomplete, or failed). One per response."""

    def __init__(self, rid: str, shape: ResponseShape, done: Done = lambda body: None):
        self.rid, self.shape, self.done = rid, shape, done
        self.seq = 0
        self.items: list[dict[str, Any]] = []  # finished output items, as the final object lists them
        self.open: str | None = None  # "text" or "reasoning": the item being written
        self.buffer = ""
        self.pending: list[Any] = []  # log-probabilities for the next text delta (its tokens')
        self.item_logprobs: list[Any] = []  # the open message's, for its done events
        self.held: tuple[int, str, ToolCallDelta] | None = None  # a call whose done waits for the next event

    def _emit(self, kind: str, **fields: Any) -> str:
        frame = sse_event(kind, {"type": kind, "sequence_number": self.seq, **fields})
        self.seq += 1
        return frame

    def start(self) -> list[str]:
        body = self.shape.body(self.rid, "in_progress", [], None)
        return [self._emit("response.created", response=body), self._emit("response.in_progress", response=body)]

    def _iid(self, prefix: str) -> str:
        return item_id(prefix, self.rid, len(self.items))

    def _open(self, kind: str) -> list[str]:
        if self.open == kind:
            return []
        frames = self._close()
        n = len(self.items)
        self.open, self.buffer, self.item_logprobs = kind, "", []
        if kind == "text":
            iid = self._iid("msg_")
            frames.append(
                self._emit("response.output_item.added", output_index=n, item=message_item(iid, "", "in_progress"))
            )
            frames.append(
                self._emit(
                    "response.content_part.added",
                    item_id=iid,
                    output_index=n,
                    content_index=0,
                    part=text_part(""),
                )
            )
        else:
            iid = self._iid("rs_")
            frames.append(self._emit("response.output_item.added", output_index=n, item=self.shape.reasoning(iid, "")))
            frames.append(
                self._emit(
                    "response.reasoning_summary_part.added",
                    item_id=iid,
                    output_index=n,
                    summary_index=0,
                    part={"type": "summary_text", "text": ""},
                )
            )
        return frames

    def _close(self, status: str = "completed") -> list[str]:
        if self.open is None:
            return []
        n, text = len(self.items), self.buffer
        frames = []
        if self.open == "text":
            iid = self._iid("msg_")
            part = text_part(text, self.item_logprobs)
            frames.append(
                self._emit(
                    "response.output_text.done",
                    item_id=iid,
                    output_index=n,
                    content_index=0,
                    text=text,
                    logprobs=part["logprobs"],
                )
            )
            frames.append(
                self._emit("response.content_part.done", item_id=iid, output_index=n, content_index=0, part=part)
            )
            item = message_item(iid, text, status, self.item_logprobs)
        else:
            iid = self._iid("rs_")
            frames.append(
                self._emit(
                    "response.reasoning_summary_text.done", item_id=iid, output_index=n, summary_index=0, text=text
                )
            )
            frames.append(
                self._emit(
                    "response.reasoning_summary_part.done",
                    item_id=iid,
                    output_index=n,
                    summary_index=0,
                    part={"type": "summary_text", "text": text},
                )
            )
            item = self.shape.reasoning(iid, text)
        frames.append(self._emit("response.output_item.done", output_index=n, item=item))
        self.items.append(item)
        self.open, self.buffer = None, ""
        return frames

    def event(self, event: EngineEvent | McpCall | McpOutcome) -> list[str]:
        if isinstance(event, Logprobs):
            self.pending += event.entries
            return []
        held = self._release(final_status(event) if isinstance(event, Finished) else "completed")
        return held + self._event(event)

    def _release(self, status: str) -> list[str]:
        """The last call's ``output_item.done``, with its status: ``incomplete`` when the limit cut it."""
        if self.held is None:
            return []
        n, iid, call = self.held
        self.held = None
        self.items[n] = self.shape.call(iid, self.rid, call, status)
        return [self._emit("response.output_item.done", output_index=n, item=self.items[n])]

    def _event(self, event: EngineEvent | McpCall | McpOutcome) -> list[str]:
        if isinstance(event, (TextDelta, ReasoningDelta)):
            kind = "text" if isinstance(event, TextDelta) else "reasoning"
            frames = self._open(kind)
            self.buffer += event.text
            prefix, name, part = DELTAS[kind]
            fields = {"item_id": self._iid(prefix), "output_index": len(self.items), part: 0, "delta": event.text}
            held, self.pending = self.pending, []
            if kind == "text":  # a reasoning delta's tokens are not the message's: theirs are dropped
                fields["logprobs"] = token_entries(held)
                self.item_logprobs += held
            return [*frames, self._emit(name, **fields)]
        if isinstance(event, ToolCallDelta):
            frames = self._close()
            n, iid = len(self.items), self._iid("fc_")
            done = self.shape.call(iid, self.rid, event)
            frames.append(
                self._emit(
                    "response.output_item.added",
                    output_index=n,
                    item=self.shape.call(iid, self.rid, event, "in_progress"),
                )
            )
            frames.append(
                self._emit("response.function_call_arguments.delta", item_id=iid, output_index=n, delta=event.arguments)
            )
            frames.append(
                self._emit(
                    "response.function_call_arguments.done", item_id=iid, output_index=n, arguments=event.arguments
                )
            )
            self.items.append(done)
            self.held = (n, iid, event)  # done once the next event says whether the limit cut it
            return frames
        if isinstance(event, McpOutcome):
            frames = self._close()
            n = len(self.items)
            item = mcp_item(self._iid("mcp_"), event)
            frames.append(self._emit("response.output_item.added", output_index=n, item=item))
            frames.append(self._emit("response.output_item.done", output_index=n, item=item))
            self.items.append(item)
            return frames
        if isinstance(event, Finished):
            frames = self._close(final_status(event))
            body = self.shape.body(self.rid, "completed", self.items, event)
            kind = "response.incomplete" if body["status"] == "incomplete" else "response.completed"
            self.done(body)
            return [*frames, self._emit(kind, response=body)]
        return []  # McpCall: its item is written with its outcome

    def error(self, message: str, kind: str) -> list[str]:
        frames = self._release("incomplete") + self._close()
        code = {"timeout": "timeout", "constraint": "invalid_request_error"}.get(kind, "server_error")
        body = self.shape.body(self.rid, "failed", self.items, None)
        body["error"] = {"code": code, "message": message}
        return [*frames, self._emit("response.failed", response=body)]

    def end(self) -> list[str]:
        return []
