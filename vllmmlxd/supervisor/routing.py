"""The gateway's routing table as the supervisor keeps it: built from the units at each change,
stamped with its version, and handed to the gateway's slot when its content changed.

Only the supervisor's task calls in here; one hand-over runs at a time, and its end comes back
to the task as a ``Published`` message.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from ..config.gateway import GatewayConfig, GatewaySpec
from ..log import log_event
from . import messages as m
from .gateway import Publication, build_spec
from .operations import Operations
from .units import GatewayUnit, ModelUnit, UpstreamUnit

logger = logging.getLogger("vllmmlxd.supervisor")


class RoutingTable:
    def __init__(
        self,
        entries: Callable[[], dict[str, ModelUnit | UpstreamUnit]],
        gateway: Callable[[], GatewayUnit | None],
        control_socket: Path | None,
        ops: Operations,
        post: Callable[[m.Msg], None],
    ) -> None:
        self._entries, self._gateway, self._control_socket = entries, gateway, control_socket
        self._ops, self._post = ops, post
        self._publication = Publication()
        self._publishing = False

    def spec(self, config: GatewayConfig) -> GatewaySpec:
        """The gateway's routing table as the units stand now, stamped with its version."""
        entries = self._entries()
        spec = build_spec(
            config,
            {n: u.config for n, u in entries.items()},
            {n: u.shown() for n, u in entries.items()},
            self._control_socket,
        )
        return self._publication.stamp(spec)

    def first(self, config: GatewayConfig) -> GatewaySpec:
        """The spec a new gateway process starts with (on its stdin): applied as it starts."""
        spec = self.spec(config)
        self._publication.took(spec.config_hash())
        return spec

    def publish(self) -> None:
        """Hand the gateway a new routing table when its content changed (one hand-over at a time)."""
        gateway = self._gateway()
        if gateway is None or self._publishing:
            return
        if gateway.shown()[0] == "starting":
            # A starting process cannot take a push, and the slot would start another for it (at every
            # daemon start, as models turn ready): it takes the table once ready (its own change).
            return
        spec = self.spec(gateway.config)
        if not self._publication.due(spec):
            return
        self._publishing = True

        async def hand_over() -> None:
            ok, why = await gateway.slot.apply_settings(spec)
            if ok:
                log_event(logger, "gateway.routes", logging.DEBUG, version=spec.version, routes=len(spec.routes))
            else:
                log_event(logger, "gateway.push_failed", logging.WARNING, pid=gateway.slot.pid, error=why)
            self._post(m.Published(spec.config_hash(), ok))

        self._ops.track(hand_over())

    def published(self, content: str, ok: bool) -> None:
        """A hand-over ended (the ``Published`` message, in the task)."""
        self._publishing = False
        if ok:
            self._publication.took(content)
            self.publish()  # a change may have come meanwhile
