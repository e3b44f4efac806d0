"""How a worker's HTTP server is reached: its address, the names and origins it answers, the
proxies it believes, whether another model's name is an error."""

from __future__ import annotations

from pydantic import Field

from .base import Strict
from .fields import Names, Networks, Port


class ServingConfig(Strict):
    """``host``, ``port``, ``trusted_proxies``, ``allowed_hosts``, ``cors_origins``, ``strict_model_name``."""

    host: str = Field("127.0.0.1", description="the address to bind; 127.0.0.1 is this machine only")
    port: Port = Field(8000, description="the TCP port to listen on")
    trusted_proxies: Networks = Field((), description="proxy addresses/networks whose X-Forwarded-For names the client")
    allowed_hosts: Names = Field(
        (), description="Host names this server answers besides its bind address and localhost"
    )
    cors_origins: Names = Field((), description="web origins allowed to call the API from a browser; none by default")
    strict_model_name: bool = Field(False, description="404 for a request naming another model; default: answer it")


class TelemetryConfig(Strict):
    """``enable_metrics``, ``health_requires_key``, ``metrics_requires_key``: what a worker tells, and to whom."""

    enable_metrics: bool = Field(False, description="serve Prometheus metrics on /metrics")
    health_requires_key: bool = Field(False, description="put /health behind the key check too")
    metrics_requires_key: bool = Field(False, description="put /metrics behind the key check too")
