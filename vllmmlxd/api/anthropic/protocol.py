"""Anthropic Messages wire models. Requests are lenient (unknown fields allowed and ignored, such
as ``cache_control`` or ``service_tier``); values are range-checked here so bad parameters become
400s with the field named. An unknown content block type is a 400 too: dropping it would change
the conversation the model sees."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

MAX_STOP_SEQUENCES = 16  # the engine's limit, as for OpenAI's ``stop``


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="allow")


def _as_blocks(value: Any) -> Any:
    # A plain string means one text block; validating only lists keeps errors naming the real field
    # (a str | list union reports every branch's failure, the str one first).
    return [{"type": "text", "text": value}] if isinstance(value, str) else value


class TextBlock(_Lenient):
    type: Literal["text"]
    text: str


class ImageBlock(_Lenient):
    type: Literal["image"]
    source: dict[str, Any]


class DocumentBlock(_Lenient):
    type: Literal["document"]
    source: dict[str, Any]


ToolResultContentBlock = Annotated[TextBlock | ImageBlock | DocumentBlock, Field(discriminator="type")]


class CallBlock(_Lenient):
    """A tool call in an assistant turn: ``tool_use`` (the client ran it) or ``server_tool_use``."""

    type: str
    id: str
    name: str
    input: dict[str, Any] = Field(default_factory=dict)


class ResultBlock(_Lenient):
    """What a tool call gave back: ``tool_result`` (from the client) or ``mcp_tool_result``."""

    type: str
    tool_use_id: str
    content: list[ToolResultContentBlock] = Field(default_factory=list)
    is_error: bool = False

    _blocks = field_validator("content", mode="before")(_as_blocks)


class ThinkingBlock(_Lenient):
    """An assistant's reasoning, sent back by clients; the signature is accepted, never checked."""

    type: Literal["thinking"]
    thinking: str
    signature: str | None = None


class RedactedThinkingBlock(_Lenient):
    type: Literal["redacted_thinking"]
    data: str = ""


class ToolUseBlock(CallBlock):
    """A tool call the assistant made, sent back in the history."""

    type: Literal["tool_use"]


class ToolResultBlock(ResultBlock):
    """The client's answer to a ``tool_use``, in a user turn."""

    type: Literal["tool_result"]


class ServerToolUseBlock(CallBlock):
    """A call this server ran itself (api.tool_loop), sent back in the history as it was answered."""

    type: Literal["server_tool_use"]


class McpToolResultBlock(ResultBlock):
    """What such a call gave back, beside it in the history."""

    type: Literal["mcp_tool_result"]


ContentBlock = Annotated[
    TextBlock
    | ImageBlock
    | DocumentBlock
    | ToolUseBlock
    | ToolResultBlock
    | ThinkingBlock
    | RedactedThinkingBlock
    | ServerToolUseBlock
    | McpToolResultBlock,
    Field(discriminator="type"),
]


class Message(_Lenient):
    # "system" inside messages: agents (Claude Code) send mid-conversation instructions so.
    role: Literal["user", "assistant", "system"]
    content: list[ContentBlock]

    _blocks = field_validator("content", mode="before")(_as_blocks)


class Tool(_Lenient):
    """A tool the model may call. Only custom tools (``type`` absent or ``custom``) have a schema;
    server tools (``web_search_...``) are refused in translation, with their name."""

    name: str = Field(min_length=1)
    description: str | None = None
    input_schema: dict[str, Any] | None = None
    type: str | None = None


class ToolChoice(_Lenient):
    """``any`` and ``tool`` are enforced while decoding; ``none`` keeps the tools in the prompt."""

    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class ThinkingConfig(_Lenient):
    """The thinking switch. ``budget_tokens`` is accepted and not enforced (``max_tokens`` bounds
    everything); ``adaptive`` and ``between_tools`` leave the model's own default."""

    type: Literal["enabled", "disabled", "adaptive", "between_tools"]
    budget_tokens: int | None = Field(None, ge=1)


class CountTokensRequest(_Lenient):
    """What shapes the prompt: exactly what ``/v1/messages`` renders, so the counts agree."""

    model: str | None = None
    messages: list[Message] = Field(min_length=1)
    system: list[TextBlock] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: ThinkingConfig | None = None

    _blocks = field_validator("system", mode="before")(_as_blocks)


class MessagesRequest(CountTokensRequest):
    """``POST /v1/messages``: the prompt plus sampling. ``max_tokens`` is required, as Anthropic's is."""

    max_tokens: int = Field(ge=1)
    stop_sequences: list[str] | None = Field(None, max_length=MAX_STOP_SEQUENCES)
    temperature: float | None = Field(None, ge=0, le=1)  # Anthropic's range, not OpenAI's 0..2
    top_p: float | None = Field(None, gt=0, le=1)  # 0 would mean "off" to the sampler, not "greedy"
    top_k: int | None = Field(None, ge=0)
    stream: bool = False
    metadata: dict[str, Any] | None = None
    # Anthropic's structured outputs: {"type": "json_schema", "schema": {...}}, enforced while decoding.
    output_format: dict[str, Any] | None = None
    # vllmmlxd's own extensions (the OpenAI fields of the same name), for reproducible runs.
    seed: int | None = None
    logit_bias: dict[str, float] | None = None
    min_p: float | None = Field(None, ge=0, le=1)
    repetition_penalty: float | None = Field(None, gt=0, le=10)
    speculative: bool = True  # false: no speculative decoding for this request
    cache_salt: str | None = Field(None, min_length=1, max_length=256)  # the prefix cache's, as OpenAI's


def error_body(type_: str, message: str) -> dict:
    """Anthropic's error shape, as a body or an SSE ``error`` event's data."""
    return {"type": "error", "error": {"type": type_, "message": message}}
