"""What a request gets when it does not say: the token default and its cap, sampling, streaming."""

from __future__ import annotations

from typing import Annotated, Any, Self

from pydantic import Field, TypeAdapter, ValidationError, model_validator

from .base import Strict

TokenCount = Annotated[int, Field(ge=1)]
DEFAULT_MAX_TOKENS = 32768
_TOKENS: TypeAdapter[int] = TypeAdapter(TokenCount)


class GenerationConfig(Strict):
    """``max_tokens`` (the default) and ``max_request_tokens`` (the cap), sampling defaults, ``stream_interval``."""

    max_tokens: TokenCount = Field(
        DEFAULT_MAX_TOKENS, description="max_tokens when a request gives none (at most max_request_tokens)"
    )
    max_request_tokens: TokenCount = Field(
        DEFAULT_MAX_TOKENS, description="the cap on max_tokens: a request asking more gets this many"
    )
    default_temperature: float | None = Field(None, ge=0, le=2, description="temperature when a request gives none")
    default_top_p: float | None = Field(None, gt=0, le=1, description="top_p when a request gives none")
    stream_interval: int = Field(1, ge=1, description="tokens per streamed chunk")

    @model_validator(mode="before")
    @classmethod
    def _one_follows_the_other(cls, data: Any) -> Any:
        # The default follows the cap and the cap the default when only one of them is written
        # (a cap of 16 alone lowers the default to 16); set here, so the entry is built once.
        if not isinstance(data, dict) or ("max_tokens" in data) == ("max_request_tokens" in data):
            return data
        written = "max_tokens" if "max_tokens" in data else "max_request_tokens"
        try:
            value = _TOKENS.validate_python(data[written])
        except ValidationError:
            return data  # refused at its own key
        if written == "max_request_tokens" and value < DEFAULT_MAX_TOKENS:
            return {**data, "max_tokens": value}
        if written == "max_tokens" and value > DEFAULT_MAX_TOKENS:
            return {**data, "max_request_tokens": value}
        return data

    @model_validator(mode="after")
    def _default_within_cap(self) -> Self:
        # Only a written default above a written cap is left to refuse.
        if self.max_tokens > self.max_request_tokens:
            raise ValueError(
                f"max_tokens ({self.max_tokens}), the default, is larger than max_request_tokens "
                f"({self.max_request_tokens}), the cap: lower max_tokens or leave it out"
            )
        return self
