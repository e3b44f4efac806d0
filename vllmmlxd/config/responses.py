"""The Responses API's store of past responses (``previous_response_id``): how much it keeps."""

from __future__ import annotations

from pydantic import Field

from .base import Strict


class ResponsesConfig(Strict):
    """``stored_responses``, ``stored_responses_mb``."""

    stored_responses: int = Field(
        2048, ge=0, description="Responses API: stored responses kept (oldest out first); 0: none kept"
    )
    stored_responses_mb: float = Field(64.0, gt=0, description="Responses API: the stored responses' size at most")
