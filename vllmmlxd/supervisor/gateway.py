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

from ..config.diff import ReloadPlan
from ..config.gateway import GatewayConfig, GatewaySpec, Route, embedding_display_name
from ..config.schema import Config, ModelConfig
from ..log import log_event
from ..sockets import http_url
from . import states
from .lazy_models import shown_error
from .slot import Slot
from .views import GatewayView

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
    # The daemon binds "localhost" as IPv4 (sockets.bind_tcp); dialled by name it may resolve to ::1 first,
    # a port another program may hold.
    host = "127.0.0.1" if entry.host == "localhost" else entry.host
    return Route(
        name=name, served_model_name=entry.display_name(name), aliases=entry.aliases,
        embedding_model=embedding_display_name(entry.embedding_model),
        kind="upstream" if upstream else "local",
        url=entry.upstream if upstream else connect_url(host, entry.port),  # type: ignore[arg-type]
        load=entry.load, state=state, owned_by=entry.owned_by, timeout=entry.timeout,
        api_key=entry.api_key, api_keys=entry.api_keys, key_grants=entry.key_grants,
        upstream_api_key=entry.upstream_api_key, last_error=last_error,
        gateway_token=None if upstream else entry.gateway_token,
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


class GatewayAndUpstreams:
    """The supervisor's gateway and upstream entries: started, changed on reload, shown in status.
    Mixed into ``Supervisor``; needs ``gateway_config``, ``gateway_slot``, ``publisher``, ``upstreams``,
    ``slots``, ``settings``, ``control_socket``, ``_entries``, ``shown``, ``_add_entry``, ``_on_change``."""

    def _upstream_interval(self) -> float:
        return self.gateway_config.upstream_health_interval_s if self.gateway_config else GatewayConfig().upstream_health_interval_s

    def _start_gateway_slot(self) -> None:
        slot = Slot(GATEWAY, None, self.settings, self._on_change, module="vllmmlxd.gateway")  # type: ignore[arg-type]
        from .live import push_settings

        self.gateway_slot = slot
        self.publisher = GatewayPublisher(slot, self._gateway_spec, push_settings)
        slot.config = self.publisher.current()  # type: ignore[assignment]

    def _gateway_spec(self):
        assert self.gateway_config is not None
        entries = self._entries()
        return build_spec(self.gateway_config, entries, {n: self.shown(n) for n in entries}, self.control_socket)

    def _split(self, plan: ReloadPlan, new: Config) -> tuple[ReloadPlan, dict[str, str]]:
        """The plan for entries served here, and what happens to upstream ones (added, removed, changed).

        An entry that switches between served here and upstream is removed, then added."""
        old_up = set(self.upstreams)
        new_up = {n for n, e in new.models.items() if e.is_upstream}
        switched = {n for n in plan.changed if (n in old_up) != (n in new_up)}
        upstream = {n: "added" for n in plan.added if n in new_up} | {n: "removed" for n in plan.removed if n in old_up}
        upstream |= {n: "changed" for n in plan.changed if n in old_up and n in new_up}
        upstream |= {n: ("added" if n in new_up else "removed") for n in switched}
        local = dataclasses.replace(
            plan,
            added=tuple(n for n in plan.added if n not in new_up) + tuple(sorted(n for n in switched if n not in new_up)),
            removed=tuple(n for n in plan.removed if n not in old_up) + tuple(sorted(n for n in switched if n not in old_up)),
            changed={n: f for n, f in plan.changed.items() if n not in switched and n not in old_up},
            changes={n: c for n, c in plan.changes.items() if n not in switched and n not in old_up},
        )
        return local, upstream

    def _apply_upstreams(self, upstream: dict[str, str], new: Config) -> None:
        for name, what in upstream.items():
            if what == "removed" and name in self.upstreams:
                self._track(self.upstreams.pop(name).close())
            elif what == "added":
                self._add_entry(name, new.models[name])
            elif what == "changed":
                self.upstreams[name].update(new.models[name], self._upstream_interval())
        for name, slot in self.upstreams.items():  # the gateway's interval may have changed
            slot.interval_s = self._upstream_interval()

    async def _apply_gateway(self, new: GatewayConfig | None) -> list[str]:
        """Start, stop or update the gateway: a new address or connection bound needs a new process, the rest
        is pushed."""
        old, self.gateway_config = self.gateway_config, new
        if new is None and self.gateway_slot is not None:
            slot, self.gateway_slot, self.publisher = self.gateway_slot, None, None
            await slot.shutdown()
            return []
        if new is None:
            return []
        if self.gateway_slot is None:
            self._start_gateway_slot()
            assert self.gateway_slot is not None
            ok = await self.gateway_slot.start()
            return [] if ok else [f"gateway: did not become ready: {self.gateway_slot.last_error}"]
        assert self.publisher is not None
        if old is not None and _needs_new_process(old, new):
            ok, error = await self.gateway_slot.replace(self.publisher.current(), hold_both=False)  # type: ignore[arg-type]
            return [] if ok else [f"gateway: moved to {new.host}:{new.port}; it did not become ready: {error}"]
        await self.publisher.publish()
        return []

    def _gateway_view(self, now: float) -> GatewayView | None:
        slot, config = self.gateway_slot, self.gateway_config
        if slot is None or config is None:
            return None
        return GatewayView(
            state=slot.state, pid=slot.pid, host=config.host, port=config.port, restarts=slot.restarts,
            uptime_s=round(now - slot.ready_since, 1) if slot.ready_since else None, last_error=shown_error(slot),
            ui=config.ui, version=self.publisher.version if self.publisher else 0,
        )


def _needs_new_process(old: GatewayConfig, new: GatewayConfig) -> bool:
    """The gateway's socket and uvicorn's connection bound are set when its process starts."""
    return (old.host, old.port, old.max_connections) != (new.host, new.port, new.max_connections)
