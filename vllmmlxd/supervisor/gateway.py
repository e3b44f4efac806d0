"""The gateway process as the daemon runs it: its spec (the routing table) and its publication.

The gateway is supervised like a worker (a slot running ``python -m vllmmlxd.gateway`` on a
socket the daemon owns), so a crash restarts it with a backoff and never touches the models.
Its spec is built here from the running config and each model's state, and pushed whole to
its private socket whenever either changes (coalesced); a gateway that starts gets the latest
on its stdin. The daemon never carries request traffic.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from pathlib import Path
from typing import Awaitable, Callable, Mapping

from ..config.gateway import GatewayConfig, GatewaySpec, Route, embedding_display_name
from ..config.schema import ModelConfig
from ..log import log_event
from ..sockets import http_url
from . import states
from .slot import Slot

logger = logging.getLogger("vllmmlxd.supervisor")

GATEWAY = "gateway"  # its name in logs and `vllmmlxctl logs gateway`
Push = Callable[[Path, GatewaySpec], Awaitable["tuple[bool, str | None]"]]


def connect_url(host: str, port: int) -> str:
    """Where the gateway reaches a worker: a wildcard bind is reached over loopback."""
    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
    return http_url(host, port, path="")


def build_route(name: str, entry: ModelConfig, state: str, last_error: str | None) -> Route:
    """One entry as the gateway routes to it (pure)."""
    upstream = entry.is_upstream
    return Route(
        name=name, served_model_name=entry.display_name(name), aliases=entry.aliases,
        embedding_model=embedding_display_name(entry.embedding_model),
        kind="upstream" if upstream else "local",
        url=entry.upstream if upstream else connect_url(entry.host, entry.port),  # type: ignore[arg-type]
        load=entry.load, state=state, owned_by=entry.owned_by, timeout=entry.timeout,
        api_key=entry.api_key, api_keys=entry.api_keys, key_grants=entry.key_grants,
        upstream_api_key=entry.upstream_api_key, last_error=last_error,
    )


def build_spec(gateway: GatewayConfig, entries: Mapping[str, ModelConfig], shown: Mapping[str, tuple[str, str | None]],
               control_socket: Path | None) -> GatewaySpec:
    """The gateway's spec: its settings and a route per entry with its shown state (pure, version 0)."""
    routes = tuple(build_route(name, entry, *shown.get(name, ("unknown", None))) for name, entry in entries.items())
    return GatewaySpec(gateway=gateway, routes=routes, control_socket=str(control_socket) if control_socket else None)


@dataclasses.dataclass
class GatewayPublisher:
    """Keeps the gateway slot's spec current and pushes each new one to the running gateway."""

    slot: Slot
    build: Callable[[], GatewaySpec]  # the spec for the current config and states (version 0)
    push: Push
    version: int = 0
    _content: str = ""  # hash of the last spec's content (without its version)
    _pushed: dict = dataclasses.field(default_factory=dict)  # pid -> the hash pushed to that process
    _pending: asyncio.Task | None = None

    def changed(self) -> None:
        """Something the routes show changed: publish soon (changes in one burst go as one push)."""
        if self._pending is None or self._pending.done():
            self._pending = asyncio.get_running_loop().create_task(self._publish_soon())

    def current(self) -> GatewaySpec:
        """The latest spec, its version bumped when its content changed."""
        spec = self.build()
        content = spec.config_hash()
        if content != self._content:
            self._content, self.version = content, self.version + 1
        return spec.model_copy(update={"version": self.version})

    async def _publish_soon(self) -> None:
        await asyncio.sleep(0.02)
        await self.publish()

    async def publish(self) -> None:
        spec = self.current()
        self.slot.config = spec  # what its next process starts with  # type: ignore[assignment]
        worker = self.slot.serving
        if worker is None or self.slot.state != states.READY or self._pushed.get(worker.pid) == spec.config_hash():
            return
        try:
            ok, why = await self.push(worker.health_socket, spec)
        except Exception as exc:  # a push must never take the daemon down
            ok, why = False, f"{type(exc).__name__}: {exc}"
        if ok:
            self._pushed = {worker.pid: spec.config_hash()}
            log_event(logger, "gateway.routes", logging.DEBUG, version=spec.version, routes=len(spec.routes))
        else:
            log_event(logger, "gateway.push_failed", logging.WARNING, pid=worker.pid, error=why)
