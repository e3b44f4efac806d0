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
import socket
import time
from dataclasses import dataclass, field
from typing import AsyncIterator, Callable

from .. import __version__
from ..config.diff import ReloadPlan, diff_models
from ..config.load import LoadedConfig, load_config
from ..config.schema import Config, DaemonConfig, ModelConfig
from ..errors import ConfigError
from ..log import log_event
from ..runtime import cpus
from . import states
from .memory import MemoryPlan, load_memory_plan
from .slot import PushSettings, Slot, SlotSettings

logger = logging.getLogger("vllmmlxd.supervisor")


# What the supervisor answers: plain data. The control API maps it to its wire models.


@dataclass(frozen=True)
class ReloadRecord:
    """How the last reload went; ``at`` is unix time."""

    ok: bool
    at: float
    error: str | None = None
    plan: str | None = None


@dataclass(frozen=True)
class ReloadReply:
    ok: bool
    dry_run: bool
    plan: str
    error: str | None = None
    config_path: str | None = None  # the file previewed (``file``); None for the daemon's own
    entries: list[dict] = field(default_factory=list)  # per entry: added, apply live, new worker... (ReloadPlan.entries)


@dataclass(frozen=True)
class ActionReply:
    ok: bool
    name: str
    message: str


@dataclass(frozen=True)
class DaemonView:
    pid: int
    uptime_s: float
    config_path: str
    config_hash: str
    last_reload: ReloadRecord | None
    version: str
    config_missing: bool = False  # the config file is gone: the running config stays


@dataclass(frozen=True)
class ModelView:
    name: str
    state: states.State
    pid: int | None
    host: str
    port: int
    restarts: int
    uptime_s: float | None
    last_exit_code: int | None
    served_model_name: str
    last_error: str | None
    keys: list[str] | None = None  # key names allowed on the entry; None: open
    runtime: dict = field(default_factory=dict)  # blas, threads, cpus and load, as the worker reports them


@dataclass(frozen=True)
class StatusView:
    daemon: DaemonView
    models: list[ModelView]


def address(config: ModelConfig) -> tuple[str, int]:
    return config.host, config.port


class Supervisor:
    """Owns the slots; the control API and the daemon's signal handlers call into it."""

    def __init__(
        self, loaded: LoadedConfig, settings: SlotSettings, on_change: Callable[[], None] = lambda: None,
        push_settings: PushSettings | None = None,
    ):
        self.loaded = loaded
        self.settings = settings
        self.slots: dict[str, Slot] = {}
        self.started = time.time()
        self.last_reload: ReloadRecord | None = None
        self.config_missing = False
        # How a live change reaches a running worker; None: every change gets a new worker.
        self.push_settings = push_settings
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

    def _new_slot(self, name: str, config: ModelConfig, sock: socket.socket | None = None) -> Slot:
        slot = Slot(name, config, self.settings, self._on_change, self.shares.get(name), sock=sock,
                    push_settings=self.push_settings)
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
        for name, config in self.loaded.config.models.items():
            self._new_slot(name, config)
        await asyncio.gather(*(slot.start() for slot in self.slots.values()))

    def running_config(self) -> Config:
        """What is actually running: a failed swap leaves the old entry in place."""
        # Built, not validated: each entry is already valid and holds its resolved keys.
        return Config.model_construct(daemon=self.daemon_config, api_keys=self.loaded.config.api_keys,
                                      models={n: s.config for n, s in self.slots.items()})

    # -- reload -----------------------------------------------------------

    async def reload(self, dry_run: bool = False, file: str | None = None) -> ReloadReply:
        """Re-read the config file and apply the difference (or only show it); ``file``: preview that
        file against what runs instead (dry runs only)."""
        path = file or self.loaded.path
        if file and not dry_run:
            return ReloadReply(ok=False, dry_run=False, plan="", config_path=str(path),
                               error="another file can only be previewed (dry run): a reload reads the daemon's own config")
        async with self._reload_lock:
            reply, plan = await self._reload(path, dry_run)
        entries = plan.entries() if plan is not None and hasattr(plan, "entries") else []
        # config_path names a previewed file only (vllmmlxctl reads it as "this is the file I read").
        return dataclasses.replace(reply, config_path=str(path) if file else None, entries=entries)

    async def _reload(self, path: str, dry_run: bool) -> tuple[ReloadReply, ReloadPlan | None]:
        """Under the reload lock: read ``path``, plan, check memory, and apply unless a dry run."""
        try:
            new = load_config(path)
        except ConfigError as exc:
            if not dry_run:
                self.last_reload = ReloadRecord(ok=False, at=time.time(), error=str(exc), plan=None)
                log_event(logger, "reload.invalid", logging.ERROR, error=str(exc))
                self._on_change()
            return ReloadReply(ok=False, dry_run=dry_run, plan="", error=str(exc)), None
        shares = self._plan_shares(new.config)
        plan = diff_models(self.running_config(), new.config)
        # A changed entry's swap holds its running worker beside the new one.
        swapped = _new_worker(plan) if self.push_settings is not None else tuple(plan.changed)
        replacing = {n: self.slots[n].config for n in swapped if self.slots[n].pid is not None}
        memory = await asyncio.to_thread(load_memory_plan, new.config, self.settings.state_dir, replacing)
        text = f"{plan.render()}\n{memory.render()}"
        if not memory.fits:
            return self._refuse(memory, text, dry_run), plan
        if dry_run:
            return ReloadReply(ok=True, dry_run=True, plan=text, error=None), plan
        self._take_daemon_keys(plan, new.config)
        self._keep_shares(plan, shares)
        errors = await self._apply(plan, new, memory)
        self.loaded = new
        error = "\n".join(errors) or None
        self.last_reload = ReloadRecord(ok=not errors, at=time.time(), error=error, plan=text)
        log_event(
            logger, "reload.done" if not errors else "reload.failed", logging.INFO if not errors else logging.ERROR,
            added=",".join(plan.added), changed=",".join(plan.changed), removed=",".join(plan.removed),
            needed_mb=memory.needed_mb, usable_mb=memory.capacity.usable_mb, error=error,
        )
        self._on_change()
        return ReloadReply(ok=not errors, dry_run=False, plan=text, error=error), plan

    def _refuse(self, memory: MemoryPlan, text: str, dry_run: bool) -> ReloadReply:
        """A config whose models do not fit: nothing changes, and the error names each entry with its numbers."""
        error = memory.refusal()
        if not dry_run:
            self.last_reload = ReloadRecord(ok=False, at=time.time(), error=error, plan=text)
            log_event(logger, "reload.refused", logging.ERROR, **memory.fields(),
                      entries=",".join(f"{n}:{f.total_mb}" for n, f in memory.entries.items()), error=error)
            self._on_change()
        return ReloadReply(ok=False, dry_run=dry_run, plan=text, error=error)

    def _take_daemon_keys(self, plan: ReloadPlan, new: Config) -> None:
        """Keep the daemon keys that apply live (the daemon applies them: ``use_daemon_config``)."""
        live = {f: getattr(new.daemon, f) for f in plan.daemon_changed if f not in plan.restart_required}
        if live:
            self.daemon_config = self.daemon_config.model_copy(update=live)

    def use_daemon_config(self, daemon: DaemonConfig) -> None:
        """Workers started from now on get this drain timeout and log level."""
        self.settings = dataclasses.replace(self.settings, drain_timeout=daemon.drain_timeout, log_level=daemon.log_level)
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
        """Removals and moves first, then changes and additions, with the listening sockets handed over.

        An entry that moves to another address is stopped, then started on its new one: its
        old socket may be the one another entry moves to (two entries exchanging ports), so
        sockets freed by removals and moves go to a pool and are taken from it before anything
        binds, never re-bound while another slot still holds them.
        """
        errors: list[str] = []
        if plan.restart_required:
            errors.append(f"daemon.{', daemon.'.join(plan.restart_required)} changed: restart the daemon to apply")
        models = new.config.models
        moving = [n for n in plan.changed if address(self.slots[n].config) != address(models[n])]
        pool: dict[tuple[str, int], socket.socket] = {}

        async def remove(name: str) -> None:
            slot = self.slots[name]
            sock = await slot.shutdown(keep_socket=True)
            del self.slots[name]
            if sock is not None:
                pool[address(slot.config)] = sock

        async def release(name: str) -> None:
            slot = self.slots[name]
            await slot.stop()
            sock = await slot.release_socket()
            if sock is not None:
                pool[address(slot.config)] = sock

        async def change(name: str) -> None:
            slot, config = self.slots[name], models[name]
            if name in moving:
                ok, error = await slot.replace(config, self.shares.get(name), hold_both=False,
                                               sock=pool.pop(address(config), None))
                if not ok:
                    errors.append(f"{name}: moved to {config.host}:{config.port}; the new worker did not become ready: {error}")
                return
            if name not in _new_worker(plan) and self.push_settings is not None:
                ok, error = await slot.apply_settings(config)
                if ok:
                    return
                log_event(logger, "reload.live_failed", logging.WARNING, model=name, error=error, then="new worker")
            swap = _swap_or_say_why(memory, name)
            ok, error = await slot.replace(config, self.shares.get(name), hold_both=swap)
            if not ok and swap:
                errors.append(f"{name}: the new worker did not become ready; the old one keeps serving: {error}")
            elif not ok:
                errors.append(f"{name}: stopped to make room (not enough memory for both); "
                              f"the new worker did not become ready: {error}")

        async def add(name: str) -> None:
            slot = self._new_slot(name, models[name], sock=pool.pop(address(models[name]), None))
            if not await slot.start():
                errors.append(f"{name}: did not become ready: {slot.last_error}")

        await asyncio.gather(*(remove(n) for n in plan.removed), *(release(n) for n in moving))
        await asyncio.gather(*(change(n) for n in plan.changed), *(add(n) for n in plan.added))
        for sock in pool.values():  # freed and not taken
            sock.close()
        return errors

    # -- control API ----------------------------------------------------

    def status(self) -> StatusView:
        now = time.time()
        return StatusView(
            daemon=DaemonView(
                pid=os.getpid(), uptime_s=round(now - self.started, 1), config_path=str(self.loaded.path),
                config_hash=self.loaded.short_hash, last_reload=self.last_reload, version=__version__,
                config_missing=self.config_missing,
            ),
            models=[
                ModelView(
                    name=name, state=slot.state, pid=slot.pid, host=slot.config.host, port=slot.config.port,
                    restarts=slot.restarts, uptime_s=round(now - slot.ready_since, 1) if slot.ready_since else None,
                    last_exit_code=slot.last_exit_code, served_model_name=slot.config.display_name(name),
                    last_error=_shown_error(slot), runtime=_runtime_fields(slot),
                    keys=None if slot.config.is_open else slot.config.key_names(),
                )
                for name, slot in self.slots.items()
            ],
        )

    async def refresh(self) -> None:
        """Fresh load figures from every running worker, in parallel, before a status is read."""
        workers = [s.serving for s in self.slots.values() if s.serving is not None]
        await asyncio.gather(*(w.refresh() for w in workers), return_exceptions=True)

    async def restart(self, name: str) -> ActionReply:
        slot = self._slot(name)
        replacing = {name: slot.config} if slot.pid is not None else {}
        memory = await asyncio.to_thread(load_memory_plan, self.running_config(), self.settings.state_dir, replacing)
        swap = _swap_or_say_why(memory, name)
        ok = await slot.restart(hold_both=swap)
        if not ok:
            return ActionReply(ok=False, name=name, message=f"did not become ready: {slot.last_error}")
        message = "restarted" if swap else "restarted (stopped first: not enough memory for both)"
        return ActionReply(ok=True, name=name, message=message)

    async def stop(self, name: str) -> ActionReply:
        ok = await self._slot(name).stop()
        return ActionReply(ok=ok, name=name, message="stopped" if ok else "could not be stopped")

    async def start(self, name: str) -> ActionReply:
        slot = self._slot(name)
        ok = await slot.start()
        return ActionReply(ok=ok, name=name, message="ready" if ok else f"did not become ready: {slot.last_error}")

    def logs(self, name: str, lines: int) -> list[str]:
        return self._slot(name).log.tail(lines)

    def follow(self, name: str) -> AsyncIterator[str]:
        return self._slot(name).log.follow()

    # -- shutdown -------------------------------------------------------

    async def stop_all(self) -> None:
        """Shut every slot down in parallel: starting workers are killed, ready ones drain; sockets close."""
        results = await asyncio.gather(*(slot.shutdown() for slot in self.slots.values()), return_exceptions=True)
        for name, result in zip(self.slots, results):
            if isinstance(result, BaseException):
                log_event(logger, "slot.shutdown_failed", logging.ERROR, model=name, error=repr(result))

    def kill_all(self) -> list[int]:
        """SIGKILL whatever worker is left, in every slot; their pids."""
        return [pid for slot in self.slots.values() for pid in slot.kill_all()]

    def ready_count(self) -> tuple[int, int]:
        return sum(s.state == states.READY for s in self.slots.values()), len(self.slots)


def _swap_or_say_why(memory: MemoryPlan, name: str) -> bool:
    """Whether ``name`` is swapped with no downtime; logs why not when it is stopped first."""
    if memory.swap(name):
        return True
    log_event(logger, "memory.restart", logging.WARNING, model=name, reason="not enough memory for both",
              peak_mb=memory.changes[name].peak_mb, usable_mb=memory.capacity.usable_mb)
    return False


def _new_worker(plan: ReloadPlan) -> tuple[str, ...]:
    """Changed entries that need a new worker (all of them with a plan that does not say)."""
    return tuple(getattr(plan, "new_worker", plan.changed))


def _shown_error(slot: Slot) -> str | None:
    if slot.state in (states.FAILED, states.BACKOFF):
        return f"{slot.fail_reason}: {slot.last_error}" if slot.state == states.FAILED and slot.fail_reason else slot.last_error
    return None


def _runtime_fields(slot: Slot) -> dict:
    """BLAS, threads, cores and load of the slot's serving worker, as it reported them."""
    worker = slot.serving
    runtime, load = (worker.runtime, worker.load) if worker is not None else ({}, {})
    fields = {key: runtime.get(key) for key in ("blas", "blas_path", "blas_warning", "threads", "cpus")}
    return fields | {key: load.get(key) for key in ("running", "waiting", "tokens_per_s", "cache_mb", "cache_budget_mb",
                                                    "embedding_model", "embedding_requests", "embedding_inputs", "mcp")}
