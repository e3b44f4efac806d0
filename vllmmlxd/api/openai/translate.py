"""Pure translation of OpenAI requests: sampling in neutral terms, messages for the chat template."""

from __future__ import annotations

import contextlib
import json
from dataclasses import replace
from typing import Any

from ...errors import InvalidRequest
from ...parsers.fim import fim_prompt
from ..files import file_text
from ..hosted_tools import HostedTool
from ..images import ImageRef, image_part
from ..sampling import SamplingRequest
from ..structured import openai_output_format
from ..tooling import openai_tool_choice
from ..turn import ChatPrompt, ChatTurn, content_of, refuse_client_template, tool_result_text
from .protocol import ChatCompletionRequest, ChatMessage, CompletionRequest, _SamplingFields

CHAT_ID_PREFIX = "chatcmpl-"


def to_turn(req: ChatCompletionRequest) -> ChatTurn:
    """A chat completion request as the neutral turn ``api.chat.serve_chat`` serves, computed once;
    fields this server would not honour are a 400 first."""
    refuse_unhonoured(req)
    prompt = ChatPrompt(to_template_messages(req.messages), req.tools, req.chat_template_kwargs)
    return ChatTurn(
        prompt,
        sampling_request(req),
        CHAT_ID_PREFIX,
        tool_choice=openai_tool_choice(req.tool_choice, req.parallel_tool_calls),
        output=openai_output_format(req.response_format),
        stream=req.stream,
        n=req.n,
        prediction=predicted_text(req.prediction),
        # OpenAI's search on chat completions runs at OpenAI: a hosted tool (api.hosted_tools).
        hosted=(HostedTool("web_search_options", "web_search_options"),)
        if (req.model_extra or {}).get("web_search_options") is not None
        else (),
    )


def include_usage(req: _SamplingFields) -> bool:
    """Does a streamed response end with a usage chunk (``stream_options.include_usage``)?"""
    return bool(req.stream_options and req.stream_options.include_usage)


def sampling_request(req: _SamplingFields) -> SamplingRequest:
    """The request's sampling fields, in no family's words."""
    sampling = extended_sampling(req, getattr(req, "max_completion_tokens", None) or req.max_tokens)
    return replace(sampling, logprobs=asked_logprobs(req))


def asked_logprobs(req: _SamplingFields) -> int | None:
    """How many top candidates each written token comes with, or None for no log-probabilities:
    chat's ``logprobs: true`` with ``top_logprobs``, completions' ``logprobs: N``."""
    if isinstance(req, ChatCompletionRequest):
        if req.top_logprobs is not None and not req.logprobs:
            raise InvalidRequest("top_logprobs needs logprobs: true", param="top_logprobs")
        return (req.top_logprobs or 0) if req.logprobs else None
    return getattr(req, "logprobs", None)


def extended_sampling(req: Any, max_tokens: int | None) -> SamplingRequest:
    """Sampling from a request with OpenAI's ``temperature``, ``top_p``, ``seed`` and ``stop`` and
    the extensions (:class:`SamplingExtensions`): chat, text completions and Responses."""
    stop = (req.stop,) if isinstance(req.stop, str) else tuple(req.stop or ())
    return SamplingRequest(
        max_tokens=max_tokens,
        temperature=req.temperature,
        top_p=req.top_p,
        top_k=req.top_k,
        min_p=req.min_p,
        repetition_penalty=req.repetition_penalty,
        presence_penalty=req.presence_penalty,
        frequency_penalty=req.frequency_penalty,
        seed=req.seed,
        stop=stop,
        logit_bias=dict(req.logit_bias or {}),
        ignore_eos=req.ignore_eos,
        speculative=req.speculative,
        cache_salt=req.cache_salt,
    )


# Fields OpenAI defines that this server does not act on, with the values that ask for nothing.
UNHONOURED = {
    "best_of": lambda v: v in (None, 1),
    "modalities": lambda v: v in (None, ["text"]),
    "audio": lambda v: v is None,
    "chat_template": lambda v: v is None,  # vLLM's per-request template (see turn.refuse_client_template)
    # The deprecated forms of tools and tool_choice: refused rather than dropped (the model would lose its tools).
    "functions": lambda v: v is None,
    "function_call": lambda v: v is None,
}


def refuse_unhonoured(req: _SamplingFields) -> None:
    """A field this server would not honour is a 400 naming it, never silently dropped."""
    refuse_fields({**(req.model_extra or {}), **req.model_dump(exclude_unset=True)}, UNHONOURED)


def refuse_fields(data: dict[str, Any], unhonoured: dict[str, Any]) -> None:
    """The first field of ``data`` that ``unhonoured`` (name → accepts the value) refuses, as a 400
    naming it; a client's ``chat_template`` always."""
    refuse_client_template(data)
    for name, honoured in unhonoured.items():
        if name in data and not honoured(data[name]):
            raise InvalidRequest(f"{name} is not supported by this server (got {data[name]!r})", param=name)


def to_template_messages(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """Chat messages as the chat template expects them: text content, known keys only."""
    out = []
    for i, msg in enumerate(messages):
        if msg.role == "assistant":
            out += _ran_by_server((msg.model_extra or {}).get("mcp_calls"))
        item: dict[str, Any] = {"role": "system" if msg.role == "developer" else msg.role}
        item["content"] = _text_content(msg.content, f"messages[{i}].content")
        for key in ("name", "tool_calls", "tool_call_id", "reasoning_content"):
            value = getattr(msg, key)
            if value is not None:
                item[key] = _parsed_arguments(value) if key == "tool_calls" else value
        out.append(item)
    return out


def _ran_by_server(mcp_calls: object) -> list[dict[str, Any]]:
    """The calls this server ran in an answer (its ``mcp_calls``, sent back as history) as the turns
    the model saw before the answer's text: the calls, then their results. Malformed entries are skipped."""
    calls = [c for c in mcp_calls if _is_call(c)] if isinstance(mcp_calls, list) else []
    if not calls:
        return []
    turns: list[dict[str, Any]] = [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": _parsed_arguments(
                [{"id": c.get("id"), "type": "function", "function": c["function"]} for c in calls]
            ),
        }
    ]
    for c in calls:
        result = c.get("result") if isinstance(c.get("result"), dict) else {}
        content = result.get("content")
        blocks = content if isinstance(content, list) else []
        text = "\n\n".join(str(b.get("text", "")) for b in blocks if isinstance(b, dict) and b.get("type") == "text")
        text = tool_result_text(text, bool(result.get("is_error")))
        turns.append({"role": "tool", "tool_call_id": c.get("id"), "name": c["function"]["name"], "content": text})
    return turns


def _is_call(call: object) -> bool:
    function = call.get("function") if isinstance(call, dict) else None
    return isinstance(function, dict) and isinstance(function.get("name"), str)


def _text_content(content: str | list[dict[str, Any]] | None, param: str) -> str | list[dict[str, Any]]:
    """A message's content: its text, or (with images) text and image parts in their order."""
    if content is None or isinstance(content, str):
        return content or ""
    parts: list[str | dict[str, Any]] = []
    for j, part in enumerate(content):
        kind = part.get("type")
        if kind == "text":
            parts.append(str(part.get("text", "")))
        elif kind == "image_url":
            parts.append(image_part(_image_ref(part.get("image_url"), f"{param}[{j}]")))
        elif kind == "image" and isinstance(part.get("image"), ImageRef):  # made by the Responses translator
            parts.append(part)
        elif kind == "file":  # {"type": "file", "file": {"file_data", "filename"}}: its text
            inner = part.get("file")
            parts.append(file_text(inner if isinstance(inner, dict) else {}, f"{param}[{j}].file"))
        else:
            raise InvalidRequest(f"content part type {kind!r} is not supported by this model", param=param)
    return content_of(parts, "")


def _image_ref(value: object, where: str) -> ImageRef:
    """An ``image_url`` part's ``{"url": ...}`` (some clients send the URL as a plain string)."""
    url = value.get("url") if isinstance(value, dict) else value
    if not isinstance(url, str) or not url:
        raise InvalidRequest(f"{where}.image_url.url must be a data: or http(s):// URL", param=where)
    return ImageRef(where, url=url)


def _parsed_arguments(tool_calls: list[dict]) -> list[dict]:
    # Chat templates render arguments as objects; OpenAI clients send them as JSON text.
    out = []
    for call in tool_calls:
        call = dict(call)
        fn = dict(call.get("function") or {})
        args = fn.get("arguments")
        if isinstance(args, str):
            with contextlib.suppress(
                ValueError, RecursionError
            ):  # not JSON (or too deep, too long a number): kept as text
                fn["arguments"] = json.loads(args)
        call["function"] = fn
        out.append(call)
    return out


def completion_prompt(req: CompletionRequest) -> str | list[int]:
    """The single prompt of a completion request: text, or token ids (also as a batch of one, as
    lm-evaluation-harness sends them)."""
    if req.max_tokens == 0 and not req.echo:
        raise InvalidRequest("max_tokens must be at least 1 (0 only with echo)", param="max_tokens")
    prompt: Any = req.prompt
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], list):
        prompt = prompt[0]
    if isinstance(prompt, list):
        ids = [p for p in prompt if isinstance(p, int)]
        if prompt and len(ids) == len(prompt):
            return ids
        if len(prompt) != 1 or not isinstance(prompt[0], str):
            raise InvalidRequest("send one prompt per request", param="prompt")
        prompt = prompt[0]
    if not prompt:  # [""] too: the engine cannot start a sequence from no tokens
        raise InvalidRequest("prompt must not be empty", param="prompt")
    return prompt


def completion_text(
    req: CompletionRequest, prompt: str | list[int], setting: str, detected: str | None
) -> str | list[int]:
    """The prompt as the model reads it: with a ``suffix``, the model's fill-in-the-middle form
    around the prompt (the prefix) and the suffix (``setting``: the entry's ``fim``; ``detected``:
    the form its tokenizer carries); without, the prompt as sent."""
    if req.suffix is None:
        return prompt
    if not isinstance(prompt, str):
        raise InvalidRequest("suffix needs a text prompt (not token ids)", param="suffix")
    form = detected if setting == "auto" else None if setting == "off" else setting
    if form is None:
        why = (
            "the entry turns it off (fim: off)"
            if setting == "off"
            else "its tokenizer has no fill-in-the-middle tokens"
        )
        raise InvalidRequest(f"suffix needs a fill-in-the-middle model: {why}", param="suffix")
    return fim_prompt(form, prompt, req.suffix)


def predicted_text(prediction: dict[str, Any] | None) -> str | None:
    """A predicted output's text: ``{type: content, content: str | [text parts]}``; anything else a 400."""
    if prediction is None:
        return None
    content = prediction.get("content") if prediction.get("type") == "content" else None
    if isinstance(content, list) and all(isinstance(p, dict) and isinstance(p.get("text"), str) for p in content):
        content = "".join(p["text"] for p in content)
    if not isinstance(content, str):
        raise InvalidRequest("prediction must be {type: content, content: a string or text parts}", param="prediction")
    return content
