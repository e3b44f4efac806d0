"""Pure translation between OpenAI requests/responses and engine types."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ...config.schema import ModelConfig
from ...engine.types import EngineEvent, Finished, SamplingParams, TextDelta, Usage
from ...errors import ContextLengthExceeded, InvalidRequest
from .protocol import ChatCompletionRequest, ChatMessage, CompletionRequest, _SamplingFields

FALLBACK_TEMPERATURE = 0.7
FALLBACK_TOP_P = 1.0


def resolve_sampling(
    req: _SamplingFields,
    cfg: ModelConfig,
    *,
    prompt_len: int,
    context_length: int,
    vocab_size: int,
) -> SamplingParams:
    """Merge the request with the model's defaults and check it fits the context."""
    asked = getattr(req, "max_completion_tokens", None) or req.max_tokens
    if asked is not None and asked > cfg.max_request_tokens:
        raise InvalidRequest(
            f"max_tokens is {asked}, above this server's limit of {cfg.max_request_tokens}", param="max_tokens"
        )
    room = context_length - prompt_len
    if room <= 0:
        raise ContextLengthExceeded(
            f"the prompt is {prompt_len} tokens; this model's context is {context_length} tokens"
        )
    if asked is not None and asked > room:
        raise ContextLengthExceeded(
            f"the prompt ({prompt_len} tokens) plus max_tokens ({asked}) is more than this model's "
            f"context of {context_length} tokens; ask for at most {room} tokens",
            param="max_tokens",
        )
    bias = []
    for key, value in (req.logit_bias or {}).items():
        token = int(key)
        if not 0 <= token < vocab_size:
            raise InvalidRequest(f"logit_bias token id {token} is outside the vocabulary (0..{vocab_size - 1})", param="logit_bias")
        bias.append((token, float(value)))
    stop = (req.stop,) if isinstance(req.stop, str) else tuple(req.stop or ())
    return SamplingParams(
        max_tokens=asked if asked is not None else min(cfg.max_tokens, room),
        temperature=_first(req.temperature, cfg.default_temperature, FALLBACK_TEMPERATURE),
        top_p=_first(req.top_p, cfg.default_top_p, FALLBACK_TOP_P),
        top_k=max(req.top_k or 0, 0),
        min_p=req.min_p or 0.0,
        repetition_penalty=req.repetition_penalty or 1.0,
        presence_penalty=req.presence_penalty or 0.0,
        frequency_penalty=req.frequency_penalty or 0.0,
        seed=req.seed,
        stop=tuple(s for s in stop if s),
        logit_bias=tuple(bias),
        ignore_eos=req.ignore_eos,
    )


def _first(*values):
    return next(v for v in values if v is not None)


def check_chat_supported(req: ChatCompletionRequest) -> None:
    """Reject what this version cannot honour, rather than silently ignoring it."""
    fmt = (req.response_format or {}).get("type", "text")
    if fmt != "text":
        raise InvalidRequest(f"response_format type {fmt!r} is not supported by this server yet", param="response_format")
    if req.logprobs:
        raise InvalidRequest("logprobs are not supported by this server yet", param="logprobs")


def to_template_messages(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """Chat messages as the chat template expects them: text content, known keys only."""
    out = []
    for i, msg in enumerate(messages):
        item: dict[str, Any] = {"role": "system" if msg.role == "developer" else msg.role}
        item["content"] = _text_content(msg.content, f"messages[{i}].content")
        for key in ("name", "tool_calls", "tool_call_id", "reasoning_content"):
            value = getattr(msg, key)
            if value is not None:
                item[key] = _parsed_arguments(value) if key == "tool_calls" else value
        out.append(item)
    return out


def _text_content(content, param: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    parts = []
    for part in content:
        kind = part.get("type")
        if kind == "text":
            parts.append(str(part.get("text", "")))
        else:
            raise InvalidRequest(f"content part type {kind!r} is not supported by this model", param=param)
    return "".join(parts)


def _parsed_arguments(tool_calls: list[dict]) -> list[dict]:
    # Chat templates render arguments as objects; OpenAI clients send them as JSON text.
    out = []
    for call in tool_calls:
        call = dict(call)
        fn = dict(call.get("function") or {})
        args = fn.get("arguments")
        if isinstance(args, str):
            try:
                fn["arguments"] = json.loads(args)
            except json.JSONDecodeError:
                pass
        call["function"] = fn
        out.append(call)
    return out


def completion_prompt(req: CompletionRequest) -> str | list[int]:
    """The single prompt of a completion request: text, or token ids."""
    prompt = req.prompt
    if req.echo or req.suffix is not None or req.logprobs:
        raise InvalidRequest("echo, suffix and logprobs are not supported by this server yet")
    if isinstance(prompt, list):
        if prompt and all(isinstance(p, int) for p in prompt):
            return list(prompt)
        if len(prompt) == 1 and isinstance(prompt[0], str):
            return prompt[0]
        raise InvalidRequest("send one prompt per request", param="prompt")
    if not prompt:
        raise InvalidRequest("prompt must not be empty", param="prompt")
    return prompt


@dataclass
class Folded:
    """A whole response: the fold of its event stream."""

    text: str = ""
    finish: Finished | None = None
    deltas: list[str] = field(default_factory=list)

    def add(self, event: EngineEvent) -> None:
        if isinstance(event, TextDelta):
            self.deltas.append(event.text)
        elif isinstance(event, Finished):
            self.finish = event
            self.text = "".join(self.deltas)


def finish_reason(reason: str) -> str:
    return "length" if reason == "length" else "stop"


def usage_dict(usage: Usage) -> dict[str, int]:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
    }


def _envelope(rid: str, obj: str, created: int, model: str, choices: list[dict], usage: Usage | None = None) -> dict:
    """What every OpenAI response and chunk shares; ``usage`` last, when there is one."""
    body = {"id": rid, "object": obj, "created": created, "model": model, "choices": choices}
    if usage is not None:
        body["usage"] = usage_dict(usage)
    return body


def chat_response(rid: str, created: int, model: str, folded: Folded) -> dict:
    assert folded.finish is not None
    message = {"role": "assistant", "content": folded.text}
    choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish_reason(folded.finish.reason)}
    return _envelope(rid, "chat.completion", created, model, [choice], folded.finish.usage)


def completion_response(rid: str, created: int, model: str, folded: Folded) -> dict:
    assert folded.finish is not None
    choice = {"index": 0, "text": folded.text, "logprobs": None, "finish_reason": finish_reason(folded.finish.reason)}
    return _envelope(rid, "text_completion", created, model, [choice], folded.finish.usage)


def chat_chunk(rid: str, created: int, model: str, delta: dict, finish: str | None = None) -> dict:
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    return _envelope(rid, "chat.completion.chunk", created, model, [choice])


def completion_chunk(rid: str, created: int, model: str, text: str, finish: str | None = None) -> dict:
    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
    return _envelope(rid, "text_completion", created, model, [choice])


def usage_chunk(rid: str, created: int, model: str, obj: str, usage: Usage) -> dict:
    return _envelope(rid, obj, created, model, [], usage)
