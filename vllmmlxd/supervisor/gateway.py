"""The gateway process as the daemon runs it: its spec (the routing table) and its publication.

The gateway is supervised like a worker (a slot running ``python -m vllmmlxd.gateway`` on a
socket the daemon owns, ``units.GatewayUnit``), so a crash restarts it with a backoff and never
touches the models. Its spec is built here (pure) from the running config and each model's
state, and handed to its slot whenever either changes (coalesced): pushed whole to the
running gateway's private socket, or on stdin to the next one. The daemon never carries
request traffic.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path

from ..config.gateway import GatewayConfig, GatewaySpec, Route, embedding_display_name
from ..config.schema import Resolved, ResolvedUpstream
from ..sockets import http_url

GATEWAY = "gateway"  # its name in logs and `vllmmlxctl logs gateway`


def connect_url(host: str, port: int) -> str:
    """Where the gateway reaches a worker: a wildcard bind is reached over loopback."""
    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
    return http_url(host, port, path="")


def build_route(name: str, entry: Resolved, state: str, last_error: str | None) -> Route:
    """One entry as the gateway routes to it (pure)."""
    common = dict(
        name=name,
        served_model_name=entry.display_name(name),
        aliases=entry.aliases,
        embedding_model=embedding_display_name(entry.embedding_model),
        state=state,
        owned_by=entry.owned_by,
        timeout=entry.timeout,
        api_key=entry.api_key,
        api_keys=entry.api_keys,
        key_grants=entry.key_grants,
        last_error=last_error,
        group=entry.group,
    )
    if isinstance(entry, ResolvedUpstream):
        return Route(kind="upstream", url=entry.upstream, upstream_api_key=entry.upstream_api_key, **common)
    # The daemon binds "localhost" as IPv4 (sockets.bind_tcp); dialled by name it may resolve to ::1 first,
    # a port another program may hold.
    host = "127.0.0.1" if entry.host == "localhost" else entry.host
    return Route(
        kind="local",
        url=connect_url(host, entry.port),
        load=entry.load,
        gateway_token=entry.gateway_token,
        max_audio_mb=entry.max_audio_mb,
        **common,
    )


def build_spec(
    gateway: GatewayConfig,
    entries: Mapping[str, Resolved],
    shown: Mapping[str, tuple[str, str | None]],
    control_socket: Path | None,
) -> GatewaySpec:
    """The gateway's spec: its settings and a route per entry with its shown state (pure, version 0)."""
    routes = tuple(build_route(name, entry, *shown.get(name, ("unknown", None))) for name, entry in entries.items())
    # The telemetry section is daemon-wide; every entry carries it (config/schema.py).
    telemetry = next((e.telemetry for e in entries.values() if e.telemetry is not None), None)
    return GatewaySpec(
        gateway=gateway,
        routes=routes,
        control_socket=str(control_socket) if control_socket else None,
        telemetry=telemetry,
    )


@dataclasses.dataclass
class Publication:
    """The routing table's versions: the supervisor's task builds a spec at each change and hands the
    gateway's slot each new one (``apply_settings``: pushed when it runs, else its next start's)."""

    version: int = 0
    _content: str = ""  # hash of the latest spec's content (without its version)
    applied: str = ""  # the content its slot took last

    def stamp(self, spec: GatewaySpec) -> GatewaySpec:
        """``spec`` with its version, bumped when its content changed."""
        content = spec.config_hash()
        if content != self._content:
            self._content, self.version = content, self.version + 1
        return spec.model_copy(update={"version": self.version})

    def took(self, content: str) -> None:
        """The gateway's slot took the spec whose content hash is ``content``."""
        self.applied = content

    def due(self, spec: GatewaySpec) -> bool:
        """Whether ``spec`` (stamped) is news for the gateway."""
        return spec.config_hash() != self.applied


def needs_new_process(old: GatewayConfig, new: GatewayConfig) -> bool:
    """The gateway's sockets and uvicorn's connection bound are set when its process starts."""
    return (old.listeners(), old.max_connections) != (new.listeners(), new.max_connections)
