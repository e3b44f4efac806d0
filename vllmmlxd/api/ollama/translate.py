"""Pure translation of Ollama requests: ``options`` into neutral sampling, ``format`` into an output
format, ``think`` into the template's switch, ``keep_alive`` into seconds, and chat messages (or a
generate prompt) into the chat template's messages: one ``ChatTurn`` for ``api.chat.serve_chat``.

Ollama ignores options it does not know, and options that do not apply where it runs (``num_gpu``
on a CPU): so do these. A known option with a value of the wrong type or range is a 400 naming it.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from ...errors import InvalidRequest
from ..images import ImageRef, image_part
from ..sampling import SamplingRequest
from ..structured import OutputFormat, checked_schema
from ..tooling import ToolChoice, openai_tool_choice
from ..turn import ChatPrompt, ChatTurn, content_of
from .protocol import ChatRequest, GenerateRequest, Message, _Generating

ID_PREFIX = "ollama-"  # request ids (x-request-id, engine logs): Ollama's bodies carry none
CALL_ID_PREFIX = "call_"  # the ids the template sees for calls sent back without one
# num_predict: -1 is "no limit", -2 "fill the context"; both are as many as the entry and the context allow.
UNBOUNDED = 2**31 - 1
RANDOM_SEED = -1  # Ollama's "no seed"
MAX_STOP_STRINGS = 16  # the engine's limit, as for OpenAI's stop


@dataclass(frozen=True)
class Model:
    """What translation needs to know of the model it translates for."""

    name: str  # as clients see it, for errors
    reasoning: bool  # has a reasoning parser: ``think`` can be honoured


def _number(name: str, value: Any, check: Callable[[float], bool], rule: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or not check(value):
        raise InvalidRequest(f"option {name} must be {rule} (got {value!r})", param=f"options.{name}")
    return float(value)


def _integer(name: str, value: Any, check: Callable[[int], bool], rule: str) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # JSON clients may write 128 as 128.0
    if isinstance(value, bool) or not isinstance(value, int) or not check(value):
        raise InvalidRequest(f"option {name} must be {rule} (got {value!r})", param=f"options.{name}")
    return value


def _stops(value: Any) -> tuple[str, ...]:
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise InvalidRequest("option stop must be a list of strings", param="options.stop")
    if len(stops) > MAX_STOP_STRINGS:
        raise InvalidRequest(f"option stop takes at most {MAX_STOP_STRINGS} strings", param="options.stop")
    return tuple(stops)


def sampling(options: dict[str, Any] | None) -> SamplingRequest:
    """Ollama's ``options`` as neutral sampling; unknown options ignored, known ones checked."""
    o = {k: v for k, v in (options or {}).items() if v is not None}
    fields: dict[str, Any] = {}
    if "temperature" in o:
        fields["temperature"] = _number("temperature", o["temperature"], lambda v: v >= 0, "a number >= 0")
    if "top_p" in o:
        fields["top_p"] = _number("top_p", o["top_p"], lambda v: 0 < v <= 1, "a number above 0, at most 1")
    if "min_p" in o:
        fields["min_p"] = _number("min_p", o["min_p"], lambda v: 0 <= v <= 1, "a number from 0 to 1")
    if "top_k" in o:
        fields["top_k"] = _integer("top_k", o["top_k"], lambda v: v >= 0, "a whole number >= 0 (0: no limit)")
    if "num_predict" in o:
        n = _integer(
            "num_predict", o["num_predict"], lambda v: v >= 1 or v in (-1, -2), "a count >= 1, -1 or -2 (no limit)"
        )
        fields["max_tokens"] = UNBOUNDED if n < 0 else n  # clamped to the entry's and the context's room
    if "seed" in o:
        seed = _integer("seed", o["seed"], lambda v: True, "a whole number")
        fields["seed"] = None if seed == RANDOM_SEED else seed
    if "stop" in o:
        fields["stop"] = _stops(o["stop"])
    if "repeat_penalty" in o:
        fields["repetition_penalty"] = _number(
            "repeat_penalty", o["repeat_penalty"], lambda v: 0 < v <= 10, "a number above 0, at most 10"
        )
    for name in ("presence_penalty", "frequency_penalty"):
        if name in o:
            fields[name] = _number(name, o[name], lambda v: -2 <= v <= 2, "a number from -2 to 2")
    if "num_ctx" in o:
        fields["context_window"] = _integer("num_ctx", o["num_ctx"], lambda v: v >= 1, "a count >= 1")
    return SamplingRequest(**fields)


def output_format(fmt: str | dict[str, Any] | None) -> OutputFormat | None:
    """``format``: ``"json"`` (any JSON object) or a JSON schema, enforced while decoding."""
    if fmt is None or fmt == "":
        return None
    if fmt == "json":
        return OutputFormat({"type": "object"}, "format")
    if isinstance(fmt, dict):
        return OutputFormat(checked_schema(fmt, "format"), "format")
    raise InvalidRequest(f'format must be "json" or a JSON schema (got {fmt!r})', param="format")


def thinking(think: bool | str | None, model: Model) -> dict[str, bool]:
    """``think`` as the template's switch: on (true, or an effort), off, or (absent) the model's default.
    A model that cannot reason is a 400 when asked to, as Ollama answers."""
    if think is None:
        return {}
    if isinstance(think, str) and think not in ("low", "medium", "high"):
        raise InvalidRequest(f'think must be true, false, "low", "medium" or "high" (got {think!r})', param="think")
    on = think is not False
    if on and not model.reasoning:
        raise InvalidRequest(f"model {model.name!r} does not support thinking", param="think")
    return {"enable_thinking": on}


_DURATION = re.compile(r"(-?)((?:\d+(?:\.\d*)?|\.\d+)(?:ns|us|µs|ms|s|m|h))+", re.ASCII)
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_UNIT_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def keep_alive_s(value: float | str | None) -> float | None:
    """``keep_alive`` in seconds: a number of seconds or a duration (``30s``, ``5m``, ``1h30m``); a
    negative one is "for ever" (-1). None when the request says nothing."""
    if value is None:
        return None
    if isinstance(value, str):
        text = value.strip()
        if re.fullmatch(r"-?\d+(\.\d+)?", text):
            seconds = float(text)
        elif _DURATION.fullmatch(text):
            seconds = sum(float(n) * _UNIT_S[u] for n, u in _PART.findall(text)) * (-1 if text.startswith("-") else 1)
        else:
            raise InvalidRequest(
                f"keep_alive must be a duration such as 30s, 5m or 1h, or a number of seconds (got {value!r})",
                param="keep_alive",
            )
    else:
        seconds = float(value)
    if not math.isfinite(seconds):
        raise InvalidRequest("keep_alive must be a finite duration", param="keep_alive")
    return -1.0 if seconds < 0 else seconds


def refuse_unhonoured(req: _Generating) -> None:
    """Fields Ollama defines that this server would not honour: a 400 naming them (none of the
    common ones today; ``/api/generate`` refuses its own: ``refuse_generate_fields``)."""


def request_sampling(req: _Generating) -> SamplingRequest:
    """The request's ``options``, and its ``logprobs`` / ``top_logprobs`` (either asks for them)."""
    asked = req.logprobs or bool(req.top_logprobs)
    return replace(sampling(req.options), logprobs=(req.top_logprobs or 0) if asked else None)


def with_images(text: str, images: list[str] | None, where: str) -> str | list[dict[str, Any]]:
    """A message's content: its text, or with ``images`` (base64, no media type: told by their bytes)
    the images first, then the text, as parts the chat pipeline resolves (``api.image_input``: a text
    model refuses them, naming itself; a vision model's are checked and decoded)."""
    if not images:
        return text
    parts: list[str | dict[str, Any]] = [
        image_part(ImageRef(f"{where}[{k}]", data=data)) for k, data in enumerate(images)
    ]
    return content_of([*parts, text], "")


def to_template_messages(messages: list[Message], model: Model) -> list[dict[str, Any]]:
    """Ollama's messages as the chat template takes them. A call sent back without an id gets one
    (templates that label results read it), and each tool message the id of the call it answers:
    the first unanswered call of its tool name, else the first unanswered call."""
    out: list[dict[str, Any]] = []
    pending: list[tuple[str, str]] = []  # (id, name) of the last assistant turn's unanswered calls
    for i, msg in enumerate(messages):
        item: dict[str, Any] = {
            "role": msg.role,
            "content": with_images(msg.content or "", msg.images, f"messages[{i}].images"),
        }
        if msg.role == "assistant":
            if msg.thinking:
                item["reasoning_content"] = msg.thinking
            if msg.tool_calls:
                calls = [
                    _template_call(c, f"{CALL_ID_PREFIX}{i}_{j}", f"messages[{i}]")
                    for j, c in enumerate(msg.tool_calls)
                ]
                item["tool_calls"] = calls
                pending = [(c["id"], c["function"]["name"]) for c in calls]
        elif msg.role == "tool":
            name = msg.tool_name or msg.name
            match = next((p for p in pending if p[1] == name), pending[0] if pending else None)
            if match is not None:
                pending.remove(match)
                item["tool_call_id"] = match[0]
                name = name or match[1]
            if name:
                item["name"] = name
        out.append(item)
    return out


def _template_call(call: Any, fallback_id: str, where: str) -> dict[str, Any]:
    arguments = call.function.arguments
    if isinstance(arguments, str):  # JSON text: templates render arguments as objects
        try:
            arguments = json.loads(arguments)
        except (ValueError, RecursionError):
            raise InvalidRequest(f"{where}.tool_calls: arguments must be a JSON object", param=where) from None
    return {
        "id": call.id or fallback_id,
        "type": "function",
        "function": {"name": call.function.name, "arguments": arguments},
    }


def chat_turn(req: ChatRequest, model: Model) -> ChatTurn:
    """``/api/chat`` as the neutral turn ``serve_chat`` serves."""
    refuse_unhonoured(req)
    prompt = ChatPrompt(to_template_messages(req.messages, model), req.tools or None, thinking(req.think, model))
    choice = openai_tool_choice(req.tool_choice, None)
    return ChatTurn(prompt, request_sampling(req), ID_PREFIX, choice, output_format(req.format), stream=req.streamed)


def refuse_generate_fields(req: GenerateRequest) -> None:
    """``/api/generate``'s fields this server does not serve: a 400 naming each, and what to do instead."""
    refuse_unhonoured(req)
    if req.suffix:
        raise InvalidRequest(
            "suffix (fill-in-the-middle) is not supported by this server: send the text before and after "
            "in the prompt, or use /api/chat",
            param="suffix",
        )
    if req.template:
        raise InvalidRequest(
            "template is not supported by this server: prompts are rendered with the model's own chat "
            "template (send raw: true to write the whole prompt yourself)",
            param="template",
        )
    if req.context:
        raise InvalidRequest(
            "context (token ids of an earlier answer) is not supported by this server: use /api/chat with "
            "the conversation's messages",
            param="context",
        )
    if req.raw and req.system:
        raise InvalidRequest("system is not applied to a raw prompt: put it in the prompt", param="system")
    if req.raw and req.think:
        raise InvalidRequest("think needs the chat template: it cannot be used with raw: true", param="think")
    if req.raw and req.images:
        raise InvalidRequest("images need the chat template: they cannot be used with raw: true", param="images")


def generate_turn(req: GenerateRequest, model: Model) -> ChatTurn:
    """``/api/generate`` (not raw) as one chat turn: ``system``, then the prompt as the user's message."""
    refuse_generate_fields(req)
    messages = ([{"role": "system", "content": req.system}] if req.system else []) + [
        {"role": "user", "content": with_images(req.prompt or "", req.images, "images")}
    ]
    prompt = ChatPrompt(messages, None, thinking(req.think, model))
    return ChatTurn(
        prompt, request_sampling(req), ID_PREFIX, ToolChoice(), output_format(req.format), stream=req.streamed
    )
