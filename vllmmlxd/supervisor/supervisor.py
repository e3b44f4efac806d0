"""The supervisor: one slot per model entry, reloads applied as a diff.

Unchanged entries are never touched; added ones start; removed ones drain and stop;
changed ones are swapped with no downtime (or, where the old and new worker do not fit in
memory together, stopped then started). An invalid config, or one whose models do not fit
in memory, changes nothing.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import time
from typing import AsyncIterator, Callable

from .. import __version__
from ..config.diff import ReloadPlan, diff_models
from ..config.load import LoadedConfig, load_config
from ..config.schema import Config
from ..control.protocol import (
    ActionResponse,
    DaemonStatus,
    ModelStatus,
    ReloadResponse,
    ReloadResult,
    StatusResponse,
)
from ..errors import ConfigError
from ..log import log_event
from ..runtime import cpus
from . import states
from .memory import MemoryPlan, load_memory_plan
from .slot import Slot, SlotSettings

logger = logging.getLogger("vllmmlxd.supervisor")


class Supervisor:
    """Owns the slots; the control API and the daemon's signal handlers call into it."""

    def __init__(self, loaded: LoadedConfig, settings: SlotSettings, on_change: Callable[[], None] = lambda: None):
        self.loaded = loaded
        self.settings = settings
        self.slots: dict[str, Slot] = {}
        self.started = time.time()
        self.last_reload: ReloadResult | None = None
        # The daemon section in force: state_dir and control_socket change only with a restart.
        self.daemon_config = loaded.config.daemon
        self.shares = self._plan_shares(loaded.config)
        self._reload_lock = asyncio.Lock()
        self._on_change = on_change

    def _slot(self, name: str) -> Slot:
        try:
            return self.slots[name]
        except KeyError:
            raise KeyError(f"no model named {name!r}; models: {', '.join(self.slots) or 'none'}") from None

    def _new_slot(self, name: str) -> Slot:
        slot = Slot(name, self.loaded.config.models[name], self.settings, self._on_change, self.shares.get(name))
        self.slots[name] = slot
        return slot

    @staticmethod
    def _plan_shares(config: Config) -> dict[str, cpus.CpuShare]:
        """Each entry's cores (Linux): an even split unless an entry sets ``threads``."""
        if not cpus.can_pin():
            return {}
        plan = cpus.plan_shares({name: entry.threads for name, entry in config.models.items()}, cpus.available_cpus())
        if any(share.oversubscribed for share in plan.values()):
            log_event(logger, "cpu.oversubscribed", logging.WARNING, cores=len(cpus.available_cpus()),
                      shares=",".join(f"{n}:{s.render()}" for n, s in plan.items()))
        return plan

    async def start_all(self) -> None:
        """Start every entry's worker concurrently; returns when each is ready or has failed."""
        for name in self.loaded.config.models:
            self._new_slot(name)
        await asyncio.gather(*(slot.start() for slot in self.slots.values()))

    def running_config(self) -> Config:
        """What is actually running: a failed swap leaves the old entry in place."""
        return Config(daemon=self.daemon_config, models={n: s.config for n, s in self.slots.items()})

    # -- reload -----------------------------------------------------------

    async def reload(self, dry_run: bool = False) -> ReloadResponse:
        """Re-read the config file and apply the difference (or only show it)."""
        async with self._reload_lock:
            try:
                new = load_config(self.loaded.path)
            except ConfigError as exc:
                if not dry_run:
                    self.last_reload = ReloadResult(ok=False, at=time.time(), error=str(exc), plan=None)
                    log_event(logger, "reload.invalid", logging.ERROR, error=str(exc))
                    self._on_change()
                return ReloadResponse(ok=False, dry_run=dry_run, plan="", error=str(exc))
            shares = self._plan_shares(new.config)
            plan = diff_models(self.running_config(), new.config)
            # A changed entry's swap holds its running worker beside the new one.
            replacing = {n: self.slots[n].config for n in plan.changed if self.slots[n].pid is not None}
            memory = await asyncio.to_thread(load_memory_plan, new.config, self.settings.state_dir, replacing)
            text = f"{plan.render()}\n{memory.render()}"
            if not memory.fits:
                return self._refuse(memory, text, dry_run)
            if dry_run:
                return ReloadResponse(ok=True, dry_run=True, plan=text, error=None)
            self._apply_daemon(plan, new.config)
            self._keep_shares(plan, shares)
            errors = await self._apply(plan, new, memory)
            self.loaded = new
            error = "\n".join(errors) or None
            self.last_reload = ReloadResult(ok=not errors, at=time.time(), error=error, plan=text)
            log_event(
                logger, "reload.done" if not errors else "reload.failed", logging.INFO if not errors else logging.ERROR,
                added=",".join(plan.added), changed=",".join(plan.changed), removed=",".join(plan.removed),
                needed_mb=memory.needed_mb, usable_mb=memory.capacity.usable_mb, error=error,
            )
            self._on_change()
            return ReloadResponse(ok=not errors, dry_run=False, plan=text, error=error)

    def _refuse(self, memory: MemoryPlan, text: str, dry_run: bool) -> ReloadResponse:
        """A config whose models do not fit: nothing changes, and the error names each entry with its numbers."""
        error = memory.refusal()
        if not dry_run:
            self.last_reload = ReloadResult(ok=False, at=time.time(), error=error, plan=text)
            log_event(logger, "reload.refused", logging.ERROR, **memory.fields(),
                      entries=",".join(f"{n}:{f.total_mb}" for n, f in memory.entries.items()), error=error)
            self._on_change()
        return ReloadResponse(ok=False, dry_run=dry_run, plan=text, error=error)

    def _apply_daemon(self, plan: ReloadPlan, new: Config) -> None:
        """Take the daemon keys that apply live; workers see a new log_level when they next start."""
        live = {f: getattr(new.daemon, f) for f in plan.daemon_changed if f not in plan.restart_required}
        if not live:
            return
        self.daemon_config = self.daemon_config.model_copy(update=live)
        self.settings = dataclasses.replace(
            self.settings, drain_timeout=self.daemon_config.drain_timeout, log_level=self.daemon_config.log_level
        )
        for slot in self.slots.values():
            slot.settings = self.settings

    def _keep_shares(self, plan: ReloadPlan, shares: dict[str, cpus.CpuShare]) -> None:
        """Adopt the new plan for the workers about to start; running ones keep their cores.

        Restarting an unchanged model only to move it to other cores would reload its weights
        for nothing: it moves when it next restarts (``vllmmlxctl restart NAME``).
        """
        for name in plan.unchanged:
            held, planned = self.slots[name].share, shares.get(name)
            if held != planned:
                log_event(logger, "cpu.share_kept", model=name, cpus=held and held.render(),
                          planned=planned and planned.render(), applies="at its next restart")
                self.slots[name].planned_share = planned
        self.shares = shares

    async def _apply(self, plan: ReloadPlan, new: LoadedConfig, memory: MemoryPlan) -> list[str]:
        errors: list[str] = []
        if plan.restart_required:
            errors.append(f"daemon.{', daemon.'.join(plan.restart_required)} changed: restart the daemon to apply")

        async def remove(name: str) -> None:
            await self.slots[name].stop()
            del self.slots[name]

        async def change(name: str) -> None:
            swap = _swap_or_say_why(memory, name)
            ok, error = await self.slots[name].replace(new.config.models[name], self.shares.get(name), hold_both=swap)
            if not ok and swap:
                errors.append(f"{name}: the new worker did not become ready; the old one keeps serving: {error}")
            elif not ok:
                errors.append(f"{name}: stopped to make room (not enough memory for both); "
                              f"the new worker did not become ready: {error}")

        async def add(name: str) -> None:
            slot = Slot(name, new.config.models[name], self.settings, self._on_change, self.shares.get(name))
            self.slots[name] = slot
            if not await slot.start():
                errors.append(f"{name}: did not become ready: {slot.last_error}")

        # Removals first, so a port freed by one entry can be taken by another.
        await asyncio.gather(*(remove(n) for n in plan.removed))
        await asyncio.gather(*(change(n) for n in plan.changed), *(add(n) for n in plan.added))
        return errors

    # -- control API ----------------------------------------------------

    def status(self) -> StatusResponse:
        now = time.time()
        return StatusResponse(
            daemon=DaemonStatus(
                pid=os.getpid(), uptime_s=round(now - self.started, 1), config_path=str(self.loaded.path),
                config_hash=self.loaded.short_hash, last_reload=self.last_reload, version=__version__,
            ),
            models=[
                ModelStatus(
                    name=name, state=slot.state, pid=slot.pid, host=slot.config.host, port=slot.config.port,
                    restarts=slot.restarts, uptime_s=round(now - slot.ready_since, 1) if slot.ready_since else None,
                    last_exit_code=slot.last_exit_code, served_model_name=slot.config.display_name(name),
                    last_error=slot.last_error if slot.state in (states.FAILED, states.BACKOFF) else None,
                    **_runtime_fields(slot),
                )
                for name, slot in self.slots.items()
            ],
        )

    async def refresh(self) -> None:
        """Fresh load figures from every running worker, in parallel, before a status is read."""
        workers = [s.worker for s in self.slots.values() if s.worker is not None and s.pid is not None]
        await asyncio.gather(*(w.refresh() for w in workers), return_exceptions=True)

    async def restart(self, name: str) -> ActionResponse:
        slot = self._slot(name)
        replacing = {name: slot.config} if slot.pid is not None else {}
        memory = await asyncio.to_thread(load_memory_plan, self.running_config(), self.settings.state_dir, replacing)
        swap = _swap_or_say_why(memory, name)
        ok = await slot.restart(hold_both=swap)
        if not ok:
            return ActionResponse(ok=False, name=name, message="did not become ready")
        message = "restarted" if swap else "restarted (stopped first: not enough memory for both)"
        return ActionResponse(ok=True, name=name, message=message)

    async def stop(self, name: str) -> ActionResponse:
        await self._slot(name).stop(close_socket=True)
        return ActionResponse(ok=True, name=name, message="stopped")

    async def start(self, name: str) -> ActionResponse:
        ok = await self._slot(name).start()
        return ActionResponse(ok=ok, name=name, message="ready" if ok else "did not become ready")

    def logs(self, name: str, lines: int) -> list[str]:
        return list(self._slot(name).lines)[-lines:] if lines > 0 else []

    def follow(self, name: str) -> AsyncIterator[str]:
        return self._slot(name).follow()

    # -- shutdown -------------------------------------------------------

    async def stop_all(self) -> None:
        """Drain every worker (in parallel) and close the sockets."""
        await asyncio.gather(*(slot.stop() for slot in self.slots.values()), return_exceptions=True)

    def ready_count(self) -> tuple[int, int]:
        return sum(s.state == states.READY for s in self.slots.values()), len(self.slots)


def _swap_or_say_why(memory: MemoryPlan, name: str) -> bool:
    """Whether ``name`` is swapped with no downtime; logs why not when it is stopped first."""
    if memory.swap(name):
        return True
    log_event(logger, "memory.restart", logging.WARNING, model=name, reason="not enough memory for both",
              peak_mb=memory.changes[name].peak_mb, usable_mb=memory.capacity.usable_mb)
    return False


def _runtime_fields(slot: Slot) -> dict:
    """BLAS, threads, cores and load of the slot's running worker, as it reported them."""
    live = slot.worker is not None and slot.pid is not None
    runtime, load = (slot.worker.runtime, slot.worker.load) if live else ({}, {})
    fields = {key: runtime.get(key) for key in ("blas", "blas_path", "blas_warning", "threads", "cpus")}
    return fields | {key: load.get(key) for key in ("running", "waiting", "tokens_per_s", "cache_mb", "cache_budget_mb")}
