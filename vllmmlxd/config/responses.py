"""The Responses API's store of past responses (``previous_response_id``): how much it keeps."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .base import Strict


class ResponsesConfig(Strict):
    """``stored_responses``, ``stored_responses_mb``, ``hosted_tools``."""

    stored_responses: int = Field(
        2048, ge=0, description="Responses API: stored responses kept (oldest out first); 0: none kept"
    )
    stored_responses_mb: float = Field(64.0, gt=0, description="Responses API: the stored responses' size at most")
    hosted_tools: Literal["ignore", "refuse"] = Field(
        "ignore",
        description="tools the provider runs (web_search, code_interpreter, Anthropic's web_search_20250305...) "
        "that a request names: ignore leaves them out of the prompt and names them in the "
        "x-vllmmlxd-ignored-tools header; refuse answers a 400 naming the tool",
    )
