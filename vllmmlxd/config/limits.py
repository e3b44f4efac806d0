"""What a worker admits: queued requests, body sizes, connections, requests and tokens per client."""

from __future__ import annotations

from pydantic import Field

from .base import Strict
from .fields import Rate


class LimitsConfig(Strict):
    """``max_queue``, ``max_body_mb``, ``max_connections``, ``rate_limit``, ``tokens_per_minute``."""

    max_queue: int = Field(64, ge=1, description="requests waiting for the engine before 503")
    max_body_mb: float = Field(16.0, gt=0, description="request bodies above this get 413")
    max_connections: int = Field(256, ge=1, description="open connections at most; more get 503")
    rate_limit: Rate = Field(
        0, description="requests per client (key name, else address): per minute, or text like '120/minute'; 0: off"
    )
    tokens_per_minute: int = Field(0, ge=0, description="generated tokens per minute per client; 0: no limit")
