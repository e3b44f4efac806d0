"""The supervisor: one task, one queue, over every unit the daemon runs.

Everything that changes what runs arrives on the queue: the control API's reload, load,
start, stop and restart, the idle ticker's tick, the units' own news (a state changed), and
the end of the supervisor's operations. The task is the only writer of the unit collection
and of what it knows about operations in flight (``busy``); it decides with the pure ``plan``
functions and carries decisions out as *operations*: tasks that only drive units through
their commands and post their result back. Each unit's state is written by its own actor.

Reloads: unchanged entries are never touched; added ones start; removed ones drain and stop;
changed ones take the new settings live or are swapped with no downtime (or, where the old
and new worker do not fit in memory together, stopped then started). An invalid config, or
one whose models do not fit in memory, changes nothing.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any, assert_never

from ..config.diff import ReloadPlan
from ..config.gateway import GatewayConfig
from ..config.load import LoadedConfig
from ..config.schema import Config, DaemonConfig, Resolved, ResolvedUpstream
from ..log import log_event
from ..runtime.cpus import CpuShare
from ..store.pulls import Pull, Pulls
from . import messages as m
from .clock import REAL_CLOCK, Clock
from .files import ModelFiles
from .gateway import GATEWAY, needs_new_process
from .loads import Loads
from .memory import Capacity, entry_footprints, load_memory_plan, read_capacity
from .operations import Operations, fail, resolve
from .reads import GATEWAY_KEY, SupervisorReads
from .reload import GatewayStep, Membership, plan_shares, prepare, swap_or_say_why
from .routing import RoutingTable
from .slot.slot import PushSettings, Slot, SlotSettings
from .units import GatewayUnit, ModelUnit, Unit, UpstreamUnit
from .upstream import UpstreamChecks
from .views import ActionReply, ReloadRecord, ReloadReply

logger = logging.getLogger("vllmmlxd.supervisor")


class Supervisor(SupervisorReads):
    """Owns the units; the control API and the daemon's signal handlers call into it (see the module)."""

    def __init__(
        self,
        loaded: LoadedConfig,
        settings: SlotSettings,
        on_change: Callable[[], None] = lambda: None,
        push_settings: PushSettings | None = None,
        control_socket: Path | None = None,
        pulls: Pulls | None = None,
        measure: Callable[[], tuple[Capacity, dict[str, int]]] | None = None,
        clock: Clock = REAL_CLOCK,
    ):
        self.clock = clock  # its and its units' timers and stamps (a test's is fake)
        self.loaded = loaded
        self.settings = settings
        self.units: dict[str, Unit] = {}  # entries in the config's order, then the gateway
        self.started = clock.time()
        self.last_reload: ReloadRecord | None = None
        self.config_missing = False
        # How a live change reaches a running worker; None: every change gets a new worker.
        self.push_settings = push_settings
        # The daemon section in force: state_dir and control_socket change only with a restart.
        self.daemon_config = loaded.config.daemon
        self.shares = plan_shares(loaded.config)
        self.control_socket = control_socket  # the daemon's: the gateway asks there for lazy models to load
        # The model store's pulls (the daemon's, shared with the control API): download: true uses them.
        self.pulls = pulls if pulls is not None else Pulls(settings.state_dir)
        self._on_change_outer = on_change
        self._queue: asyncio.Queue[m.Msg] = asyncio.Queue()
        self.ops = Operations(self._post)  # what runs beside the task, and the units it is on
        # How the machine's memory and the entries' footprints are read (a test gives its own).
        self.loads = Loads(self.entry_units, self.ops, measure or self._footprints, clock)
        self._reloading = False
        self._reloads: list[m.Reload] = []  # reloads asked for while one runs: one after the other
        self.files = ModelFiles(settings.state_dir, self.pulls, self.ops, self._post, self._changed)
        self.routes = RoutingTable(self.entry_units, self.gateway, control_socket, self.ops, self._post)
        self._change_queued = False
        self._closing = False
        self._ticker: asyncio.Task | None = None
        self._task: asyncio.Task | None = None  # started by the first message (the daemon is built before its loop)

    # -- the face: each call is a message, answered through its future ------------------------

    async def start_all(self) -> None:
        """Create every unit and start the eager ones (and the gateway); returns when each is ready or
        failed. Lazy entries wait unloaded; upstream entries start their health checks."""
        await self._call(m.StartAll())

    async def reload(self, dry_run: bool = False, file: str | None = None) -> ReloadReply:
        """Re-read the config file and apply the difference (or only show it); ``file``: preview that
        file against what runs instead (dry runs only)."""
        return await self._call(m.Reload(dry_run, file))

    async def load(self, name: str) -> ActionReply:
        """Make ``name`` serve (the gateway asks, for a request that needs it): start a lazy model that is not
        loaded, unloading idle lazy ones first if memory needs it; answers once it is ready, or why not."""
        return await self._call(m.Load(name))

    async def start(self, name: str) -> ActionReply:
        return await self._call(m.Start(name))

    async def stop(self, name: str) -> ActionReply:
        return await self._call(m.Stop(name))

    async def restart(self, name: str) -> ActionReply:
        return await self._call(m.Restart(name))

    def use_daemon_config(self, daemon: DaemonConfig) -> None:
        """Workers started from now on get this drain timeout and log level."""
        self._post(m.UseDaemonConfig(daemon))

    def note_config_missing(self, missing: bool) -> None:
        self._post(m.ConfigMissing(missing))

    async def stop_all(self) -> None:
        """Shut every unit down in parallel: starting workers are killed, ready ones drain; sockets close."""
        if self._task is not None and not self._task.done():
            await self._call(m.Shutdown())

    def kill_all(self) -> list[int]:
        """SIGKILL whatever worker is left, in every unit; their pids."""
        return [pid for unit in self.units.values() for pid in unit.kill_all()]

    async def _call(self, call: m.Calls) -> Any:
        if self._task is not None and self._task.done():
            raise RuntimeError("the supervisor has stopped")
        future = call.future
        assert future is not None  # made with the call
        self._post(call)
        return await future

    def _post(self, msg: m.Msg) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="supervisor")
        self._queue.put_nowait(msg)

    def _changed(self) -> None:
        """A unit's news (its actor calls this): one "changed" message however many come at once."""
        if not self._change_queued:
            self._change_queued = True
            self._post(m.Changed())

    # -- the task --------------------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            msg = await self._queue.get()
            try:
                if isinstance(msg, m.Call):
                    await self._on_call(msg)
                else:
                    await self._on_news(msg)
            except Exception as exc:  # a bug here must not leave the daemon without its supervisor
                kind = type(msg).__name__
                log_event(logger, "supervisor.error", logging.ERROR, kind=kind, error=f"{type(exc).__name__}: {exc}")
                if isinstance(msg, m.Call):
                    fail(msg.future, exc)
            if isinstance(msg, m.Shutdown):
                return

    async def _on_call(self, call: m.Calls) -> None:
        match call:
            case m.StartAll():
                self._start_all(call.future)
            case m.Reload():
                await self._reload(call)
            case m.Load(name):
                await self._load(name, call.future)
            case m.Start(name):
                await self._start(name, call.future)
            case m.Stop(name):
                self._stop(name, call.future)
            case m.Restart(name):
                await self._restart(name, call.future)
            case m.Shutdown():
                await self._shutdown(call.future)
            case _:
                assert_never(call)

    async def _on_news(self, news: m.News) -> None:
        match news:
            case m.Changed():
                self._change_queued = False
                self._on_change_outer()
                self.routes.publish()
            case m.OpDone(op_id, result, error):
                self.ops.finish(op_id, result, error)
                self._changed()
            case m.UseDaemonConfig(daemon):
                self._use_daemon_config(daemon)
            case m.ConfigMissing(missing):
                self.config_missing = missing
            case m.Fetched(name, pull):
                await self._fetched(name, pull)
            case m.PulledForReload(pull_id, done):
                self.files.pulled_for_reload(pull_id, done)
            case m.Published(content, ok):
                self.routes.published(content, ok)
            case m.Demand(name):  # a request on an unloaded model's own port (answered 503): load it
                log_event(logger, "model.demanded", model=name, reason="a request on its port")
                await self._load(name, None)
            case m.IdleTick():
                self.loads.tick()
            case _:
                assert_never(news)

    # -- messages --------------------------------------------------------------------------------

    def _use_daemon_config(self, daemon: DaemonConfig) -> None:
        self.settings = dataclasses.replace(
            self.settings, drain_timeout=daemon.drain_timeout, log_level=daemon.log_level
        )
        for unit in self.units.values():
            if isinstance(unit, (ModelUnit, GatewayUnit)):
                unit.slot.use_settings(self.settings)

    def _start_all(self, future: asyncio.Future[Any] | None) -> None:
        for name, entry in self.loaded.config.models.items():
            self._add_entry(name, entry)
        if self.loaded.config.gateway is not None:
            self._add_gateway(self.loaded.config.gateway)
        self._ticker = asyncio.create_task(self.loads.ticker(self._post), name="idle-ticker")
        starting = [
            u.slot.start()
            for u in self.units.values()
            if isinstance(u, GatewayUnit) or (isinstance(u, ModelUnit) and not u.lazy and u.absent is None)
        ]
        self.ops.start({}, asyncio.gather(*starting), lambda _r, _e: resolve(future, None))
        self._changed()

    def _add_entry(self, name: str, config: Resolved, sock: socket.socket | None = None) -> None:
        """A unit for an entry: a slot for a model served here (a lazy one waits unloaded), checks for an upstream."""
        if isinstance(config, ResolvedUpstream):
            checks = UpstreamChecks(name, config, self.upstream_interval(), self._changed, self.clock)
            self.units[name] = UpstreamUnit(name, checks)
            return
        self.units[name] = ModelUnit(
            name,
            Slot(
                name,
                config,
                self.settings,
                self._changed,
                self.shares.get(name),
                sock=sock,
                push_settings=self.push_settings,
                lazy=config.load == "lazy",
                on_demand=lambda: self._post(m.Demand(name)),
                clock=self.clock,
            ),
        )
        self.files.check(self.units[name])

    def _add_gateway(self, config: GatewayConfig) -> GatewayUnit:
        from .live import push_settings

        spec = self.routes.first(config)  # it starts with it, on stdin
        unit = GatewayUnit(
            Slot(
                GATEWAY,
                spec,
                self.settings,
                self._changed,
                module="vllmmlxd.gateway",
                push_settings=push_settings,
                clock=self.clock,
            ),
            config,
        )
        self.units[GATEWAY_KEY] = unit
        return unit

    def upstream_interval(self) -> float:
        gateway = self.loaded.config.gateway
        return (gateway or GatewayConfig()).upstream_health_interval_s

    # -- loads and idle unloads ------------------------------------------------------------------

    async def _fetched(self, name: str, pull: Pull) -> None:
        """A unit's pull ended: once its model is here an eager model starts (a lazy one waits unloaded),
        through memory admission: the plan that let it in counted a model not downloaded as 0."""
        unit = self.entry_units().get(name)
        done = pull.view().state == "done"
        if not isinstance(unit, ModelUnit) or unit.absent is None or unit.absent.pull is not pull:
            return  # removed or changed meanwhile
        self._changed()
        if done:
            unit.absent = None
            if not unit.lazy:
                await self.loads.admit(name, None, start=True)

    async def _load(self, name: str, future: asyncio.Future[Any] | None) -> None:
        unit = self.entry_units().get(name)
        if isinstance(unit, ModelUnit) and unit.absent is not None:
            self.files.absent_reply(unit)  # pulled since? The plan reads what it finds.
        await self.loads.admit(name, future, start=False)

    def _footprints(self) -> tuple[Capacity, dict[str, int]]:
        """The machine's usable memory and every model unit's footprint (reads model files: off the task)."""
        capacity = read_capacity(self.daemon_config.memory_reserve_mb)
        entries = {n: u.config for n, u in self.entry_units().items() if isinstance(u, ModelUnit)}
        found = entry_footprints(entries, self.settings.state_dir, capacity.physical_mb)
        return capacity, {n: f.total_mb for n, f in found.items()}

    # -- start, stop, restart --------------------------------------------------------------------

    def _model(self, name: str, future: asyncio.Future[Any] | None) -> ModelUnit | None:
        """The model unit a command names, or None after answering why not."""
        unit = self.entry_units().get(name)
        if unit is None:
            fail(future, KeyError(f"no model named {name!r}; models: {', '.join(self.entry_units()) or 'none'}"))
            return None
        if isinstance(unit, UpstreamUnit):
            why = f"{name} is served by {unit.config.upstream}: start, stop and restart it on that host"
            resolve(future, ActionReply(False, name, why))
            return None
        return unit

    async def _start(self, name: str, future: asyncio.Future[Any] | None) -> None:
        unit = self._model(name, future)
        if unit is None:
            return
        if (absent := self.files.absent_reply(unit)) is not None:
            resolve(future, absent)
            return
        if unit.lazy:  # through memory admission, as a request would load it
            await self.loads.admit(name, future, start=True)
            return

        async def work() -> None:
            ok = await unit.slot.start()
            resolve(future, ActionReply(ok, name, "ready" if ok else f"did not become ready: {unit.slot.last_error}"))

        self.ops.track(work())

    def _stop(self, name: str, future: asyncio.Future[Any] | None) -> None:
        unit = self._model(name, future)
        if unit is None:
            return

        async def work() -> None:
            ok = await unit.slot.stop()  # stopped on purpose: no request loads it again until `start`
            resolve(future, ActionReply(ok, name, "stopped" if ok else "could not be stopped"))

        self.ops.start({name: "stopping"}, work())

    async def _restart(self, name: str, future: asyncio.Future[Any] | None) -> None:
        unit = self._model(name, future)
        if unit is None:
            return
        if (absent := self.files.absent_reply(unit)) is not None:
            resolve(future, absent)
            return
        replacing = {name: unit.config} if unit.slot.pid is not None else {}
        memory = await asyncio.to_thread(load_memory_plan, self.running_config(), self.settings.state_dir, replacing)
        swap = swap_or_say_why(memory, name, unit.config)
        distributed = getattr(unit.config, "distributed", None) is not None

        async def work() -> None:
            ok = await unit.slot.restart(hold_both=swap)
            message = (
                (
                    "restarted"
                    if swap
                    else "restarted (every rank stopped first)"
                    if distributed
                    else "restarted (stopped first: not enough memory for both)"
                )
                if ok
                else f"did not become ready: {unit.slot.last_error}"
            )
            resolve(future, ActionReply(ok, name, message))

        self.ops.track(work())

    # -- reload ----------------------------------------------------------------------------------

    async def _reload(self, msg: m.Reload) -> None:
        dry_run, file = msg.dry_run, msg.file
        if self._reloading:  # one at a time, in the order asked
            self._reloads.append(msg)
            return
        run = await prepare(self, file or str(self.loaded.path), dry_run, previewing=file is not None)
        if isinstance(run, ReloadReply):
            self._reply(msg, run, file)
            self._next_reload()
            return
        self._reloading = True
        run.start(lambda reply: self._finish_reload(msg, reply, file))

    def _reply(self, msg: m.Reload, reply: ReloadReply, file: str | None) -> None:
        # config_path names a previewed file only (vllmmlxctl reads it as "this is the file I read").
        resolve(msg.future, dataclasses.replace(reply, config_path=str(file) if file else None))

    def _finish_reload(self, msg: m.Reload, reply: ReloadReply, file: str | None) -> None:
        """In the task, once a reload's operations are done: record it, answer, and take the next one."""
        self.last_reload = ReloadRecord(ok=reply.ok, at=self.clock.time(), error=reply.error, plan=reply.plan)
        self._reply(msg, reply, file)
        self._reloading = False
        self._changed()
        self._next_reload()

    def _next_reload(self) -> None:
        if self._reloads:
            self._post(self._reloads.pop(0))

    def record_refusal(self, error: str, plan: str | None) -> None:
        """A reload refused before anything changed (invalid, or too big for memory)."""
        self.last_reload = ReloadRecord(ok=False, at=self.clock.time(), error=error, plan=plan)
        self._changed()

    def plan_cores(self, shares: dict[str, CpuShare]) -> None:
        """A reload's plan of cores: workers started from now on take theirs from it."""
        self.shares = shares

    def apply_membership(self, change: Membership) -> GatewayStep:
        """In the task, between a reload's waves: the collection takes its new members (reload.py),
        and what happens to the gateway is decided (its unit made or dropped here)."""
        for name in change.removed:
            self.units.pop(name, None)
        self.loaded = change.loaded
        for name, entry, sock in change.added:
            self._add_entry(name, entry, sock=sock)
        for name, upstream in change.live_upstreams:
            if isinstance(unit := self.units[name], UpstreamUnit):
                unit.checks.update(upstream, self.upstream_interval())  # the checks take it at their next round
        for unit in self.units.values():  # the gateway's interval may have changed
            if isinstance(unit, UpstreamUnit):
                unit.checks.update(unit.config, self.upstream_interval())
        order = [*change.loaded.config.models, GATEWAY_KEY]  # the config's order (and the gateway last)
        self.units = dict(
            sorted(self.units.items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else len(order))
        )
        return self._gateway_step(change.loaded.config.gateway)

    def _gateway_step(self, new: GatewayConfig | None) -> GatewayStep:
        unit = self.gateway()
        if new is None and unit is not None:
            self.units.pop(GATEWAY_KEY, None)
            return "remove", unit
        if new is None:
            return "none", None
        if unit is None:
            return "start", self._add_gateway(new)
        old, unit.config = unit.config, new
        return ("move" if needs_new_process(old, new) else "none"), unit

    def take_daemon_keys(self, plan: ReloadPlan, new: Config) -> None:
        """Keep the daemon keys that apply live (the daemon applies them: ``use_daemon_config``)."""
        live = {f: getattr(new.daemon, f) for f in plan.daemon_changed if f not in plan.restart_required}
        if live:
            self.daemon_config = self.daemon_config.model_copy(update=live)

    # -- the end ---------------------------------------------------------------------------------

    async def _shutdown(self, future: asyncio.Future[Any] | None) -> None:
        self._closing = True
        if self._ticker is not None:
            self._ticker.cancel()
        self.ops.cancel_all()
        units = dict(self.units)
        results = await asyncio.gather(*(u.shutdown() for u in units.values()), return_exceptions=True)
        for name, result in zip(units, results):
            if isinstance(result, BaseException):
                log_event(logger, "slot.shutdown_failed", logging.ERROR, model=name.lstrip(":"), error=repr(result))
        resolve(future, None)
