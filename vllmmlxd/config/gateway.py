"""The ``gateway`` section, and the routing table the daemon publishes to the gateway process.

The gateway is one address for every model: it routes each request by its ``model`` to
the entry's worker (or, for an ``upstream:`` entry, to another host's daemon). The daemon
never carries request traffic; it owns the table (built here from the config and the slots'
states, ``GatewaySpec``) and pushes it to the gateway whenever it changes.
"""

from __future__ import annotations

import hashlib
import json
from typing import Literal

from pydantic import Field, SecretStr, model_validator

from .base import Strict as _Strict
from .fields import Names, Networks, Port, Rate
from .keys import KeyGrant
from .tracing import TracingConfig

# A route's state, as the gateway shows it (`/v1/models`, `/api/health`, the web page):
# a local model's supervisor state, `idle` (a lazy model ready with nothing running),
# `unloaded` (a lazy model not started), `downloading` (download: true, its model on its way),
# and for an upstream `ready` or `unreachable`.
RouteState = str
ROUTE_STATES = (
    "starting",
    "loading",
    "ready",
    "idle",
    "unloaded",
    "draining",
    "backoff",
    "failed",
    "stopped",
    "unreachable",
    "downloading",
    "unknown",
)


class GroupLimits(_Strict):
    """``gateway.groups.NAME``: a replica set's request limits, counted by the gateway for the whole set
    (each member's own limits count per member, so without these a set multiplies them)."""

    rate_limit: Rate = Field(
        0,
        description="requests per client (key name, else address) to the set, all members together: per minute, "
        "or text like '120/minute'; 0: none",
    )
    key_limits: bool = Field(True, description="also count each named key's own rate_limit for the set as a whole")


class GatewayConfig(_Strict):
    """``gateway:``: one origin for every model (its own supervised process)."""

    host: str = "127.0.0.1"
    port: Port = 8080
    ui: bool = Field(True, description="serve the chat / playground / status page at /")
    load_timeout: float = Field(300.0, gt=0, description="seconds a request waits for a lazy model to load")
    upstream_health_interval_s: float = Field(5.0, gt=0, description="seconds between health checks of upstream hosts")
    trusted_proxies: Networks = Field((), description="proxy addresses/networks whose X-Forwarded-For names the client")
    allowed_hosts: Names = Field(
        (), description="Host names the gateway answers besides its bind address and localhost"
    )
    cors_origins: Names = Field((), description="web origins allowed to call the gateway from a browser")
    max_connections: int = Field(1024, ge=1, description="open connections at most; more get 503")
    max_body_mb: float = Field(16.0, gt=0, description="request bodies above this get 413")
    groups: dict[str, GroupLimits] = Field(
        default_factory=dict, description="replica sets' request limits, counted here for the whole set"
    )
    ollama_port: Port | None = Field(
        None, description="also serve Ollama's API on this port of the same host (11434 is Ollama's)"
    )

    @model_validator(mode="after")
    def _ports_apart(self) -> GatewayConfig:
        if self.ollama_port == self.port:
            raise ValueError(f"ollama_port and port are both {self.port}: Ollama's API needs a port of its own")
        return self

    def listeners(self) -> tuple[tuple[str, int], ...]:
        """Every address the gateway listens on: its own, then Ollama's when set."""
        ollama = ((self.host, self.ollama_port),) if self.ollama_port is not None else ()
        return ((self.host, self.port), *ollama)


class Route(_Strict):
    """One model entry as the gateway routes to it."""

    name: str  # the entry's key in `models:`
    served_model_name: str  # the name clients see (served_model_name, else the key)
    aliases: tuple[str, ...] = ()
    embedding_model: str | None = None  # the entry's embedding model, by the name its worker serves it under
    kind: Literal["local", "upstream"] = "local"
    url: str  # where to send requests: http://127.0.0.1:8001 (a worker) or the upstream's base URL (no /v1)
    load: Literal["eager", "lazy"] = "eager"
    state: RouteState = "unknown"
    owned_by: str = "vllmmlxd"
    timeout: float = 300.0  # seconds a proxied request may take (the entry's own timeout)
    # Keys, as the workers hold them (digests): the gateway answers 401/403 before proxying.
    api_key: SecretStr | None = None  # "sha256:HEX" of the entry's own key
    api_keys: tuple[str, ...] | None = None
    key_grants: tuple[KeyGrant, ...] = ()
    upstream_api_key: SecretStr | None = None  # sent to an upstream as its Bearer key (never shown)
    gateway_token: SecretStr | None = None  # the daemon's token its worker believes (never shown, never to an upstream)
    last_error: str | None = None  # why it is failed / unreachable
    group: str | None = None  # the replica set it belongs to: the gateway answers that name too
    max_audio_mb: float = 25.0  # the entry's upload limit: the gateway reads an audio form up to it

    @property
    def is_open(self) -> bool:
        return self.api_key is None and self.api_keys is None

    def names(self) -> tuple[str, ...]:
        """Every name a request may give for this route: served name, entry key, aliases."""
        return tuple(dict.fromkeys((self.served_model_name, self.name, *self.aliases)))


class GatewaySpec(_Strict):
    """What the gateway process runs: its settings, the routes, and where the daemon's control socket is.

    Sent as one JSON line on the gateway's stdin, then pushed whole (``POST /internal/settings``
    on its private socket) at each change of the config or of a model's state."""

    gateway: GatewayConfig = GatewayConfig()
    routes: tuple[Route, ...] = ()
    control_socket: str | None = None  # the daemon's control API: the gateway asks it to load lazy models
    telemetry: TracingConfig | None = None  # the telemetry section: where the gateway's spans go
    version: int = 0  # bumped at each publication

    # What a slot needs of its config (the gateway process is supervised like a worker).
    @property
    def host(self) -> str:
        return self.gateway.host

    @property
    def port(self) -> int:
        return self.gateway.port

    def display_name(self, key: str) -> str:
        return key

    def extra_listeners(self) -> dict[str, tuple[str, int]]:
        """The gateway's listeners beside its own address, by the flag that hands each one's socket
        to its process (``python -m vllmmlxd.gateway --ollama-fd N``)."""
        port = self.gateway.ollama_port
        return {"--ollama-fd": (self.gateway.host, port)} if port is not None else {}

    def to_worker_json(self) -> str:
        """The spec with secrets revealed: only ever sent down the gateway's stdin or private socket."""
        data = self.model_dump(mode="json")
        for route, raw in zip(self.routes, data["routes"]):
            for secret in ("api_key", "upstream_api_key", "gateway_token"):
                value = getattr(route, secret)
                raw[secret] = value.get_secret_value() if value is not None else None
        if self.telemetry is not None:
            data["telemetry"]["headers"] = {k: v.get_secret_value() for k, v in self.telemetry.headers.items()}
        return json.dumps(data)

    def config_hash(self) -> str:
        canonical = json.dumps(json.loads(self.to_worker_json()), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def embedding_display_name(spec: str | None) -> str | None:
    """The name a worker serves its embedding model under: ``builtin:NAME`` → NAME, a folder → its name."""
    if not spec:
        return None
    if spec.startswith("builtin:"):
        return spec[len("builtin:") :]
    return spec.rstrip("/").rsplit("/", 1)[-1]
