"""The ``telemetry:`` section: where every request's trace goes (OpenTelemetry, over OTLP).
Daemon-wide and live; each worker receives it with its entry (``ResolvedModel.telemetry``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr

from .base import Strict


class TracingConfig(Strict):
    """``telemetry: {endpoint: http://127.0.0.1:4318, protocol: http/protobuf, sampling_ratio: 1.0}``."""

    endpoint: str = Field(
        description="the OTLP collector: http://HOST:4318 for http/protobuf (/v1/traces is added), HOST:4317 for grpc"
    )
    protocol: Literal["http/protobuf", "grpc"] = Field("http/protobuf", description="how spans are exported")
    service_name: str = Field("vllmmlxd", min_length=1, description="the service.name of every span")
    sampling_ratio: float = Field(
        1.0, ge=0.0, le=1.0, description="traces kept (a client's sampled traceparent is always followed)"
    )
    headers: dict[str, SecretStr] = Field(
        default_factory=dict, description="sent with each export (secrets: ${env:NAME}, ${file:/path})"
    )
    capture_content: bool = Field(
        False, description="put prompts and answers in spans (gen_ai.input.messages, gen_ai.output.messages)"
    )
    timeout_s: float = Field(5.0, gt=0, le=60, description="seconds an export may take before its spans are dropped")
