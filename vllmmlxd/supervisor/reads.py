"""What the supervisor answers from any task: its units, the running config, the status, logs.

Plain reads of what the supervisor's task writes (``Supervisor`` inherits them); nothing here
changes anything.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator

from .. import __version__
from ..config.load import LoadedConfig
from ..config.schema import Config, DaemonConfig
from ..store.pulls import Pulls
from . import states
from .clock import Clock
from .gateway import GATEWAY
from .units import GatewayUnit, ModelUnit, Unit, UpstreamUnit, group_views
from .views import DaemonView, ReloadRecord, StatusView

GATEWAY_KEY = ":gateway"  # the gateway's key among the units: no entry name starts with ':'


class SupervisorReads:
    # Written by the supervisor's task (supervisor.py), read here.
    units: dict[str, Unit]
    loaded: LoadedConfig
    daemon_config: DaemonConfig
    started: float
    last_reload: ReloadRecord | None
    config_missing: bool
    pulls: Pulls
    clock: Clock

    def entry_units(self) -> dict[str, ModelUnit | UpstreamUnit]:
        return {n: u for n, u in self.units.items() if isinstance(u, (ModelUnit, UpstreamUnit))}

    def gateway(self) -> GatewayUnit | None:
        unit = self.units.get(GATEWAY_KEY)
        return unit if isinstance(unit, GatewayUnit) else None

    def shown(self, name: str) -> tuple[states.Shown, str | None]:
        return self.units[name].shown()

    def running_config(self) -> Config:
        """What is actually running: a failed swap leaves the old entry in place."""
        gateway = self.gateway()
        # Built, not validated: each entry is already valid and holds its resolved keys.
        return Config.model_construct(
            daemon=self.daemon_config,
            api_keys=self.loaded.config.api_keys,
            gateway=gateway.config if gateway else None,
            models={n: u.config for n, u in self.entry_units().items()},
        )

    def status(self) -> StatusView:
        now = self.clock.time()
        gateway = self.gateway()
        models = [u.view(now) for u in self.entry_units().values()]
        return StatusView(
            daemon=DaemonView(
                pid=os.getpid(),
                uptime_s=round(now - self.started, 1),
                config_path=str(self.loaded.path),
                config_hash=self.loaded.short_hash,
                last_reload=self.last_reload,
                version=__version__,
                config_missing=self.config_missing,
            ),
            models=models,
            gateway=gateway.view(now) if gateway else None,
            groups=group_views(models),
            pulls=[p.view() for p in self.pulls.all()],
        )

    async def refresh(self) -> None:
        """Fresh load figures from every running worker, in parallel, before a status is read."""
        await asyncio.gather(*(u.refresh() for u in list(self.units.values())), return_exceptions=True)

    def entry_models(self) -> dict[str, tuple[str, ...]]:
        """Each model entry served here and the model specs it loads (its model, its embedding model)."""
        return {
            name: tuple(m for m in (u.config.model, u.config.embedding_model) if m)
            for name, u in self.entry_units().items()
            if isinstance(u, ModelUnit)
        }

    def ready_count(self) -> tuple[int, int]:
        shown = [u.shown()[0] for u in self.entry_units().values()]
        return sum(s in (states.READY, states.IDLE) for s in shown), len(shown)

    def _log_unit(self, name: str) -> Unit:
        unit = self.entry_units().get(name) or (self.gateway() if name == GATEWAY else None)
        if unit is None:
            raise KeyError(f"no model named {name!r}; models: {', '.join(self.entry_units()) or 'none'}")
        return unit

    def logs(self, name: str, lines: int) -> list[str]:
        return self._log_unit(name).log.tail(lines)

    def follow(self, name: str) -> AsyncIterator[str]:
        return self._log_unit(name).log.follow()
