"""The Responses API's request, as the official SDK and Codex send it. Lenient like the other
OpenAI models (unknown fields allowed: Codex adds ``prompt_cache_key`` and ``client_metadata``);
values are range-checked so bad ones are 400s naming the field."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from ..openai.protocol import MAX_STOP_STRINGS, SamplingExtensions, _Lenient


class TextConfig(_Lenient):
    format: dict[str, Any] | None = None


class ReasoningConfig(_Lenient):
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    summary: str | None = None


class ResponsesRequest(SamplingExtensions):
    """OpenAI's fields, plus the sampling extensions chat completions take (``top_k``,
    ``logit_bias``, ...), ``seed`` and ``stop``."""

    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    seed: int | None = None  # an extension, as on chat completions
    stop: str | list[str] | None = Field(None, max_length=MAX_STOP_STRINGS)  # an extension
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    stream: bool = False
    store: bool = True
    metadata: dict[str, str] | None = None
    user: str | None = None
    truncation: Literal["disabled", "auto"] = "disabled"
    include: list[str] | None = None
    previous_response_id: str | None = None
    # Echoed on the response as the spec requires; background is refused (translate).
    top_logprobs: int | None = Field(None, ge=0, le=20)
    background: bool | None = None
    max_tool_calls: int | None = Field(None, ge=1)
    service_tier: str | None = None
    safety_identifier: str | None = Field(None, max_length=64)
    prompt_cache_key: str | None = None
