"""A chat request in no family's words: what each family's ``translate.to_turn`` makes of its
wire request, once, and all that ``api.chat.serve_chat`` needs to serve it. Pure.

``ChatPrompt`` is what shapes the prompt (the conversation, the client's tools, the template's
switches); a ``ChatTurn`` adds how to answer (tool choice, output format, sampling, streaming).
Anthropic's ``count_tokens`` takes a ``ChatPrompt`` alone and renders it as a turn's is rendered.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..errors import InvalidRequest
from .hosted_tools import HostedTool
from .sampling import SamplingRequest
from .structured import OutputFormat
from .tooling import ToolChoice


@dataclass(frozen=True)
class ChatPrompt:
    """The conversation as the chat template takes it (OpenAI-style messages and functions)."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None  # the client's own tools; None: none
    template_kwargs: dict[str, Any] | None = None  # the template's switches (``enable_thinking``...)


@dataclass(frozen=True)
class ChatTurn:
    """One chat request: its prompt and how to answer it."""

    prompt: ChatPrompt
    sampling: SamplingRequest
    id_prefix: str  # the family's response id prefix (``chatcmpl-``, ``msg_``)
    tool_choice: ToolChoice = field(default_factory=ToolChoice)
    output: OutputFormat | None = None  # the answer held to a JSON schema
    stream: bool = False
    truncate: bool = False  # too long for the context: drop the oldest turns (Responses' truncation: auto)
    hosted: tuple[HostedTool, ...] = ()  # provider-run tools the request named, left out of the prompt
    n: int = 1  # choices (OpenAI's n): each its own engine request of the same prompt (api.choices)
    prediction: str | None = None  # a predicted output (OpenAI's prediction): drafts for the answer


def turn_starts(messages: list[dict[str, Any]]) -> list[int]:
    """Where each turn of a conversation begins: its user messages after the leading system ones.
    Cutting there keeps every tool call with its result."""
    lead = next((i for i, m in enumerate(messages) if m.get("role") not in ("system", "developer")), len(messages))
    return [i for i in range(lead, len(messages)) if messages[i].get("role") == "user"]


def without_oldest(messages: list[dict[str, Any]], starts: list[int], k: int) -> list[dict[str, Any]]:
    """The conversation without its ``k`` oldest turns (``starts``: ``turn_starts``); the leading
    system messages stay."""
    lead = [m for m in messages[: starts[0]] if m.get("role") in ("system", "developer")] if starts else []
    return lead + messages[starts[k] :] if k else messages


def content_of(parts: list[str | dict[str, Any]], separator: str) -> str | list[dict[str, Any]]:
    """A message's content from its pieces in order (texts, and image parts): one string when it
    is all text (so a text conversation renders as it always has), else chat-template parts,
    adjacent texts joined by ``separator``."""
    if all(isinstance(p, str) for p in parts):
        return separator.join(p for p in parts if isinstance(p, str))
    out: list[dict[str, Any]] = []
    texts: list[str] = []
    for part in [*parts, None]:
        if isinstance(part, str):
            texts.append(part)
            continue
        if texts:
            out.append({"type": "text", "text": separator.join(texts)})
            texts = []
        if part is not None:
            out.append(part)
    return out


def tool_result_text(text: str, is_error: bool) -> str:
    """A tool's result as the model is shown it. Templates have no error flag: the text is all the
    model sees, so a failed call's text must say it failed (``Error: ...``)."""
    if not is_error or text.lower().startswith("error"):
        return text
    return f"Error: {text}" if text else "Error"


def refuse_client_template(fields: dict[str, Any]) -> None:
    """A request's own ``chat_template`` is a 400 naming it: the worker renders with the model's
    template (or the entry's), never with one a client sends, which would run client code in the
    renderer and change what the entry's settings promise."""
    if fields.get("chat_template") is not None:
        raise InvalidRequest(
            "chat_template is not supported by this server: prompts are rendered with the model's own chat template",
            param="chat_template",
        )
