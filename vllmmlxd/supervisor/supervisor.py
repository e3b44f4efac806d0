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
from pathlib import Path
from typing import AsyncIterator, Callable

from .. import __version__
from ..config.diff import ReloadPlan, diff_models
from ..config.gateway import GatewayConfig
from ..config.load import LoadedConfig, load_config
from ..config.schema import Config, DaemonConfig, ModelConfig
from ..errors import ConfigError
from ..log import log_event
from ..runtime import cpus
from . import states
from .gateway import GATEWAY, GatewayAndUpstreams, GatewayPublisher
from .lazy_models import LazyModels
from .memory import MemoryPlan, load_memory_plan
from .slot import PushSettings, Slot, SlotSettings
from .upstream import UpstreamSlot
from .views import ActionReply, DaemonView, ModelView, ReloadRecord, ReloadReply, StatusView

logger = logging.getLogger("vllmmlxd.supervisor")


def address(config: ModelConfig) -> tuple[str, int]:
    return config.host, config.port


class Supervisor(LazyModels, GatewayAndUpstreams):
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
        self._on_change_outer = on_change
        self.upstreams: dict[str, UpstreamSlot] = {}  # entries served by another host
        self.gateway_config: GatewayConfig | None = loaded.config.gateway
        self.gateway_slot: Slot | None = None
        self.publisher: GatewayPublisher | None = None
        self.control_socket: Path | None = None  # the daemon's, set by it: the gateway asks there for lazy loads
        self._load_lock = asyncio.Lock()  # one memory admission at a time: loads and idle unloads
        self._loading: set[str] = set()  # admitted, not yet ready: their memory counts
        self._demanded: set[str] = set()  # loads asked for by a request on the model's own port
        self._background: set[asyncio.Task] = set()
        self._idle_task: asyncio.Task | None = None

    def _on_change(self) -> None:
        self._on_change_outer()
        if self.publisher is not None:
            self.publisher.changed()

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

    def _add_entry(self, name: str, config: ModelConfig, sock: socket.socket | None = None) -> Slot | None:
        """A slot for a local entry (a lazy one waits unloaded, its port answering why), or an upstream's checks."""
        if config.is_upstream:
            self.upstreams[name] = UpstreamSlot(name, config, self._upstream_interval(), self._on_change)
            return None
        slot = self._new_slot(name, config, sock)
        if config.load == "lazy":
            self._wait_unloaded(slot)
        return slot

    @staticmethod
    def _plan_shares(config: Config) -> dict[str, cpus.CpuShare]:
        """Each entry's cores (Linux): an even split unless an entry sets ``threads``."""
        if not cpus.can_pin():
            return {}
        local = {name: entry.threads for name, entry in config.models.items() if not entry.is_upstream}
        plan = cpus.plan_shares(local, cpus.available_cpus())
        if any(share.oversubscribed for share in plan.values()):
            log_event(logger, "cpu.oversubscribed", logging.WARNING, cores=len(cpus.available_cpus()),
                      shares=",".join(f"{n}:{s.render()}" for n, s in plan.items()))
        return plan

    async def start_all(self) -> None:
        """Start every eager entry's worker (and the gateway) concurrently; returns when each is ready or has
        failed. Lazy entries wait unloaded; upstream entries start their health checks."""
        for name, config in self.loaded.config.models.items():
            self._add_entry(name, config)
        if self.gateway_config is not None:
            self._start_gateway_slot()
        self._idle_task = asyncio.create_task(self._unload_idle(), name="idle-unloader")
        starting = [slot.start() for slot in self.slots.values() if slot.config.load == "eager"]
        if self.gateway_slot is not None:
            starting.append(self.gateway_slot.start())
        await asyncio.gather(*starting)

    def _entries(self) -> dict[str, ModelConfig]:
        """The entries running, local and upstream, in the config's order."""
        found = {n: s.config for n, s in self.slots.items()} | {n: u.config for n, u in self.upstreams.items()}
        order = list(self.loaded.config.models)
        return dict(sorted(found.items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else len(order)))

    def running_config(self) -> Config:
        """What is actually running: a failed swap leaves the old entry in place."""
        # Built, not validated: each entry is already valid and holds its resolved keys.
        return Config.model_construct(daemon=self.daemon_config, api_keys=self.loaded.config.api_keys,
                                      gateway=self.gateway_config, models=self._entries())

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
        replacing = {n: self.slots[n].config for n in swapped if n in self.slots and self.slots[n].pid is not None
                     and not new.config.models[n].is_upstream}
        memory = await asyncio.to_thread(load_memory_plan, new.config, self.settings.state_dir, replacing)
        text = f"{plan.render()}\n{memory.render()}"
        if not memory.fits:
            return self._refuse(memory, text, dry_run), plan
        if dry_run:
            return ReloadReply(ok=True, dry_run=True, plan=text, error=None), plan
        self._take_daemon_keys(plan, new.config)
        self._keep_shares(plan, shares)
        local, upstream = self._split(plan, new.config)
        errors = await self._apply(local, new, memory)
        self._apply_upstreams(upstream, new.config)
        self.loaded = new
        errors += await self._apply_gateway(new.config.gateway)
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
        for name in (n for n in plan.unchanged if n in self.slots):
            held, planned = self.slots[name].share, shares.get(name)
            if held != planned:
                log_event(logger, "cpu.share_kept", model=name, cpus=held and held.render(),
                          planned=planned and planned.render(), applies="at its next restart")
                self.slots[name].planned_share = planned
        self.shares = shares

    def _track(self, coro) -> asyncio.Task:
        task = asyncio.create_task(coro)
        task.add_done_callback(lambda t: t.exception() if not t.cancelled() else None)
        return task

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
            if slot.unloaded and slot.state == states.STOPPED:  # a lazy model not loaded: its next start takes it
                await slot.apply_settings(config)
                if slot.sock is None:
                    slot.sock = pool.pop(address(config), None)
                if config.load == "lazy":
                    self._wait_unloaded(slot)
                elif not (await self.load(name)).ok:
                    errors.append(f"{name}: did not become ready: {slot.last_error}")
                return
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
            slot = self._add_entry(name, models[name], sock=pool.pop(address(models[name]), None))
            if slot is not None and models[name].load == "eager" and not await slot.start():
                errors.append(f"{name}: did not become ready: {slot.last_error}")

        await asyncio.gather(*(remove(n) for n in plan.removed), *(release(n) for n in moving))
        await asyncio.gather(*(change(n) for n in plan.changed), *(add(n) for n in plan.added))
        for sock in pool.values():  # freed and not taken
            sock.close()
        return errors

    # -- control API ----------------------------------------------------

    def status(self) -> StatusView:
        now = time.time()
        models = []
        for name, entry in self._entries().items():
            state, error = self.shown(name)
            if name in self.upstreams:
                upstream = self.upstreams[name]
                host, port = _host_port(entry.upstream or "")
                models.append(ModelView(
                    name=name, state=state, pid=None, host=host, port=port, restarts=0,
                    uptime_s=round(now - upstream.ready_since, 1) if upstream.ready_since else None, last_exit_code=None,
                    served_model_name=entry.display_name(name), last_error=error,
                    keys=None if entry.is_open else entry.key_names(), upstream=entry.upstream,
                ))
                continue
            slot = self.slots[name]
            idle = self._idle_s(slot)
            models.append(ModelView(
                name=name, state=state, pid=slot.pid, host=slot.config.host, port=slot.config.port,
                restarts=slot.restarts, uptime_s=round(now - slot.ready_since, 1) if slot.ready_since else None,
                last_exit_code=slot.last_exit_code, served_model_name=slot.config.display_name(name),
                last_error=error, runtime=_runtime_fields(slot),
                keys=None if slot.config.is_open else slot.config.key_names(),
                load=slot.config.load, idle_unload_s=slot.config.idle_unload_s,
                idle_s=round(idle, 1) if idle is not None else None,
            ))
        return StatusView(
            daemon=DaemonView(
                pid=os.getpid(), uptime_s=round(now - self.started, 1), config_path=str(self.loaded.path),
                config_hash=self.loaded.short_hash, last_reload=self.last_reload, version=__version__,
                config_missing=self.config_missing,
            ),
            models=models,
            gateway=self._gateway_view(now),
        )

    async def refresh(self) -> None:
        """Fresh load figures from every running worker, in parallel, before a status is read."""
        workers = [s.serving for s in self.slots.values() if s.serving is not None]
        await asyncio.gather(*(w.refresh() for w in workers), return_exceptions=True)

    def _not_here(self, name: str) -> ActionReply | None:
        if name in self.upstreams:
            return ActionReply(ok=False, name=name, message=f"{name} is served by {self.upstreams[name].config.upstream}: "
                                                             "start, stop and restart it on that host")
        return None

    async def restart(self, name: str) -> ActionReply:
        if (upstream := self._not_here(name)) is not None:
            return upstream
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
        if (upstream := self._not_here(name)) is not None:
            return upstream
        slot = self._slot(name)
        slot.unloaded = False  # stopped on purpose: no request loads it again until `start`
        ok = await slot.stop()
        return ActionReply(ok=ok, name=name, message="stopped" if ok else "could not be stopped")

    async def start(self, name: str) -> ActionReply:
        if (upstream := self._not_here(name)) is not None:
            return upstream
        slot = self._slot(name)
        if slot.config.load == "lazy":  # through memory admission, as a request would load it
            slot.unloaded = slot.unloaded or slot.state == states.STOPPED
            return await self.load(name)
        ok = await slot.start()
        return ActionReply(ok=ok, name=name, message="ready" if ok else f"did not become ready: {slot.last_error}")

    def _logs_slot(self, name: str) -> Slot:
        if name == GATEWAY and name not in self.slots and self.gateway_slot is not None:
            return self.gateway_slot
        return self._slot(name)

    def logs(self, name: str, lines: int) -> list[str]:
        return self._logs_slot(name).log.tail(lines)

    def follow(self, name: str) -> AsyncIterator[str]:
        return self._logs_slot(name).log.follow()

    # -- shutdown -------------------------------------------------------

    async def stop_all(self) -> None:
        """Shut every slot down in parallel: starting workers are killed, ready ones drain; sockets close."""
        if self._idle_task is not None:
            self._idle_task.cancel()
        for upstream in self.upstreams.values():
            await upstream.close()
        slots = dict(self.slots)
        if self.gateway_slot is not None:
            slots[f"{GATEWAY}\0"] = self.gateway_slot
        results = await asyncio.gather(*(slot.shutdown() for slot in slots.values()), return_exceptions=True)
        for name, result in zip(slots, results):
            if isinstance(result, BaseException):
                log_event(logger, "slot.shutdown_failed", logging.ERROR, model=name.rstrip("\0"), error=repr(result))

    def kill_all(self) -> list[int]:
        """SIGKILL whatever worker is left, in every slot (and the gateway); their pids."""
        slots = [*self.slots.values(), *([self.gateway_slot] if self.gateway_slot is not None else [])]
        return [pid for slot in slots for pid in slot.kill_all()]

    def ready_count(self) -> tuple[int, int]:
        shown = [self.shown(n)[0] for n in self._entries()]
        return sum(s in (states.READY, states.IDLE) for s in shown), len(shown)


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


def _runtime_fields(slot: Slot) -> dict:
    """BLAS, threads, cores and load of the slot's serving worker, as it reported them."""
    worker = slot.serving
    runtime, load = (worker.runtime, worker.load) if worker is not None else ({}, {})
    fields = {key: runtime.get(key) for key in ("blas", "blas_path", "blas_warning", "threads", "cpus")}
    return fields | {key: load.get(key) for key in ("running", "waiting", "tokens_per_s", "cache_mb", "cache_budget_mb",
                                                    "embedding_model", "embedding_requests", "embedding_inputs", "mcp")}


def _host_port(url: str) -> tuple[str, int]:
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = None
    return parts.hostname or "", port or (443 if parts.scheme == "https" else 80)
