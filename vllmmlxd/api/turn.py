"""A chat request in no family's words: what each family's ``translate.to_turn`` makes of its
wire request, once, and all that ``api.chat.serve_chat`` needs to serve it. Pure.

``ChatPrompt`` is what shapes the prompt (the conversation, the client's tools, the template's
switches); a ``ChatTurn`` adds how to answer (tool choice, output format, sampling, streaming).
Anthropic's ``count_tokens`` takes a ``ChatPrompt`` alone and renders it as a turn's is rendered.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

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
    tool_choice: ToolChoice = ToolChoice()
    output: OutputFormat | None = None  # the answer held to a JSON schema
    stream: bool = False


def tool_result_text(text: str, is_error: bool) -> str:
    """A tool's result as the model is shown it. Templates have no error flag: the text is all the
    model sees, so a failed call's text must say it failed (``Error: ...``)."""
    if not is_error or text.lower().startswith("error"):
        return text
    return f"Error: {text}" if text else "Error"

