"""Ollama wire models. Requests are lenient (unknown fields allowed and ignored, as Ollama does);
``options`` stays a plain mapping, read option by option in ``translate`` (unknown options are
ignored, known ones checked with their name), and ``stream`` defaults to true, as Ollama's does.

A worker serves these under ``/ollama/api/...`` (``routes.py``); the gateway's Ollama listener
answers Ollama's own paths and forwards there."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="allow")


def _not_a_bool(value: Any) -> Any:
    # pydantic would read true as 1 second; Ollama takes a duration or a number of seconds.
    if isinstance(value, bool):
        raise ValueError("keep_alive must be a duration (such as 5m) or a number of seconds")
    return value


class CallFunction(_Lenient):
    name: str = Field(min_length=1)
    arguments: dict[str, Any] | str = Field(default_factory=dict)  # an object; JSON text is taken too


class ToolCall(_Lenient):
    function: CallFunction
    id: str | None = None


class Message(_Lenient):
    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = ""
    images: list[str] | None = None  # base64, no media type
    tool_calls: list[ToolCall] | None = None
    thinking: str | None = None
    tool_name: str | None = None  # a tool message's tool (older clients send name)
    name: str | None = None


class _Generating(_Lenient):
    """What chat and generate share: the model, how to answer, sampling options, the model's stay."""

    model: str | None = None
    stream: bool | None = None  # absent: streamed, as Ollama does
    format: str | dict[str, Any] | None = None  # "json" or a JSON schema
    options: dict[str, Any] | None = None
    keep_alive: float | str | None = None
    think: bool | str | None = None  # true/false, or an effort ("low", "medium", "high")
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)

    @property
    def streamed(self) -> bool:
        return self.stream is not False

    _keep_alive = field_validator("keep_alive", mode="before")(_not_a_bool)


class ChatRequest(_Generating):
    """``POST /api/chat``. No messages: the model is loaded (or, with ``keep_alive: 0``, unloaded)."""

    messages: list[Message] = Field(default_factory=list)
    tools: list[dict[str, Any]] | None = None
    # vllmmlxd's extension (Ollama has none): OpenAI's tool_choice, "required" or a named function
    # holding decoding to a call, as on the other families.
    tool_choice: str | dict[str, Any] | None = None


class GenerateRequest(_Generating):
    """``POST /api/generate``. No prompt: the model is loaded (or unloaded), as for chat."""

    prompt: str | None = ""
    system: str | None = None
    raw: bool = False
    suffix: str | None = None
    template: str | None = None
    context: list[int] | None = None
    images: list[str] | None = None


class EmbedRequest(_Lenient):
    """``POST /api/embed``: inputs cut to the model's limit unless ``truncate`` is false, as Ollama does."""

    model: str | None = None
    input: str | list[str]
    truncate: bool = True
    dimensions: int | None = Field(None, ge=1)
    options: dict[str, Any] | None = None
    keep_alive: float | str | None = None

    _keep_alive = field_validator("keep_alive", mode="before")(_not_a_bool)


class EmbeddingsRequest(_Lenient):
    """``POST /api/embeddings``, Ollama's older endpoint: one ``prompt``, one ``embedding``."""

    model: str | None = None
    prompt: str
    options: dict[str, Any] | None = None
    keep_alive: float | str | None = None

    _keep_alive = field_validator("keep_alive", mode="before")(_not_a_bool)


class ShowRequest(_Lenient):
    """``POST /api/show``: ``model`` (older clients send ``name``)."""

    model: str | None = None
    name: str | None = None
    verbose: bool = False
