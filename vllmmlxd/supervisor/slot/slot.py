"""One model entry under supervision: its socket, its workers, its phase.

One task, the slot's actor, owns all of it. Commands (start, stop, restart, a reload's
replace or live settings, shutdown) and events about its workers (ready, exited, unhealthy,
start timeout, backoff elapsed) arrive on one queue; each goes through the pure
``transitions.decide`` and the actor carries out the actions it returns. The actor never
waits on a worker: a worker's readiness, health and exit are watched by a task of its own
that posts events, so a stop interrupts a start or a backoff at once. Callers get their
result through a future attached to their command.

The daemon owns the listening socket: a new worker inherits it and starts accepting while
the old one drains, so a swap drops nothing. While no worker serves it, the slot's
``Responder`` answers 503 there instead of leaving clients in the accept queue.

Nothing outside the actor assigns a slot's attributes: the supervisor changes a slot only
through its commands (a lazy model's load and unload, new settings, a planned share too).
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable
from typing import assert_never

from ...log import event_line, log_event
from ...runtime.cpus import CpuShare
from ...sockets import bind_tcp, http_url
from .. import states
from ..clock import REAL_CLOCK, Clock
from ..operations import resolve as _resolve
from .exit_reason import exit_reason
from .log_lines import LogLines
from .process import UnitConfig, WorkerProcess
from .responder import RETRY_SLACK_S, StandIn, Unavailable, unavailable
from .slot_messages import (
    ApplySettings,
    BackoffElapsed,
    Call,
    Close,
    Command,
    FollowUp,
    Listening,
    Open,
    PlanShare,
    ReleaseSocket,
    Replace,
    SlotMsg,
    SlotSettings,
    TurnedAway,
    UseSettings,
    WorkerExited,
    WorkerNews,
)
from .slot_news import Result, Waiter, Waits, announcement, settle, why_not
from .slot_sockets import ExtraListeners
from .slot_workers import PushSettings, SlotWorkers
from .transitions import SWAPPING, UNLOADED, Counters, Decision, Event, Phase, decide, public_state

logger = logging.getLogger("vllmmlxd.supervisor")

__all__ = ["PushSettings", "Result", "Slot", "SlotSettings"]


class Slot:
    """Supervises the workers of one model entry; see the module's docstring."""

    def __init__(
        self,
        name: str,
        config: UnitConfig,
        settings: SlotSettings,
        on_change: Callable[[], None],
        share: CpuShare | None = None,
        *,
        sock: socket.socket | None = None,
        push_settings: PushSettings | None = None,
        module: str = "vllmmlxd.worker",
        lazy: bool = False,
        on_demand: Callable[[], None] = lambda: None,
        clock: Clock = REAL_CLOCK,
    ):
        self.name = name
        self.clock = clock  # its timers (backoff, health checks) and its stamps (ready since, retry window)
        self.config = config  # the target: what the next worker runs (a failed swap restores the old)
        self.share = share  # the cores its worker is pinned to (None: not pinned)
        self.planned_share = share  # where a reload's plan puts it when it next restarts
        self.settings = settings
        # A lazy model waits unloaded: its port answers 503 saying why, and such a request loads it (on_demand).
        self.phase: Phase = UNLOADED if lazy else states.STOPPED
        self.counters = Counters()
        self.worker: WorkerProcess | None = None  # the current one: starting, or serving
        self.held: WorkerProcess | None = None  # swapping: the previous one, serving until the new is ready
        self.last_exit_code: int | None = None
        self.last_error: str | None = None
        self.fail_reason: str | None = None
        self.ready_since: float | None = None
        self.expected_until = 0.0  # monotonic: a client turned away by the stand-in retries until then
        self.log = LogLines()  # its workers' lines and the daemon's about it, for `logs`
        self.sock = sock
        # More listening sockets its config asks for (the gateway's Ollama port): kept like ``sock``.
        self.extra = ExtraListeners()
        self.module = module  # the program its workers run
        self._on_demand = on_demand  # a request came for it while unloaded: the supervisor loads it
        self._on_change = on_change
        self._queue: asyncio.Queue[SlotMsg] = asyncio.Queue()
        self._waiters: list[Waiter] = []
        self._backoff: asyncio.Task | None = None
        self._backoff_token = 0
        self._workers = SlotWorkers(name, self._post, push_settings, clock)
        self._stand_in = StandIn(name, self.unavailable, self._answered)
        self._closed = False
        self._actor = asyncio.create_task(self._run(), name=f"slot-{name}")
        if lazy:  # bound now: clients get a 503 saying why, not a refused connection
            self._post(Open())

    # -- commands: each waits on its future, never on a lock --------------

    async def start(self) -> bool:
        """Start a worker (if none runs); True once it is ready."""
        return (await self._command(Event("start"), "serving"))[0]

    async def stop(self) -> bool:
        """Stop the worker (a starting one is killed at once); the socket stays, answering 503."""
        return (await self._command(Event("stop"), "stopped"))[0]

    async def load(self) -> Result:
        """A lazy model's load (a request needs it): start a worker unless one runs; a model stopped on
        purpose or failed stays so (refused). Once ready, or why not."""
        return await self._command(Event("load"), "serving")

    async def unload(self) -> Result:
        """Give a lazy model's memory back: stop its worker (draining) and wait unloaded, loading on demand."""
        return await self._command(Event("unload"), "stopped")

    async def restart(self, *, hold_both: bool = True) -> bool:
        """A fresh worker of the same config (zero downtime when one is ready and ``hold_both``)."""
        return (await self._command(Event("restart", hold_both=hold_both), "serving"))[0]

    async def replace(
        self,
        config: UnitConfig,
        share: CpuShare | None = None,
        *,
        hold_both: bool = True,
        sock: socket.socket | None = None,
    ) -> Result:
        """Swap in a worker for ``config`` (on ``share``'s cores). With ``hold_both`` the old one serves until
        the new one is ready, and keeps serving if it fails; without, it is stopped first. ``sock``: the
        listening socket for a new address, handed over by the supervisor."""
        event = Event("replace", hold_both=hold_both)
        return await self._ask(
            lambda f: Replace(future=f, event=event, waits="serving", config=config, share=share, sock=sock)
        )

    async def apply_settings(self, config: UnitConfig, sock: socket.socket | None = None) -> Result:
        """Take ``config``'s live settings without a new worker (pushed to the running one). ``sock``: a
        listening socket for its address, handed over by the supervisor (a model that runs no worker)."""
        event = Event("apply_settings")
        return await self._ask(lambda f: ApplySettings(future=f, event=event, waits=None, config=config, sock=sock))

    def use_settings(self, settings: SlotSettings) -> None:
        """Workers started from now on get these settings (drain timeout, log level)."""
        self._post(UseSettings(settings))

    def plan_share(self, share: CpuShare | None) -> None:
        """The cores its next worker gets (a running one keeps its own)."""
        self._post(PlanShare(share))

    async def release_socket(self) -> socket.socket | None:
        """Hand the listening socket over (to another slot); the slot must be stopped."""
        future: asyncio.Future[socket.socket | None] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait(ReleaseSocket(future=future))
        return await future

    async def shutdown(self, *, keep_socket: bool = False) -> socket.socket | None:
        """Stop for good: kill a starting worker, drain a ready one, end the actor. Returns the socket
        when ``keep_socket`` (for another slot to take), else closes it."""
        await self._command(Event("shutdown"), "stopped")
        await self._workers.wait_retired()
        sock = await self.release_socket()
        self._closed = True
        self._queue.put_nowait(Close())
        await asyncio.wait({self._actor})  # not gather: a caller cancelled here must not cancel the actor
        if sock is not None and not keep_socket:
            sock.close()
            return None
        return sock

    async def _command(self, event: Event, waits: Waits) -> Result:
        return await self._ask(lambda f: Command(future=f, event=event, waits=waits))

    async def _ask(self, make: Callable[[asyncio.Future[Result]], Command]) -> Result:
        if self._actor.done():
            return False, f"model {self.name} is shut down"
        future: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait(make(future))
        return await future

    def _post(self, msg: SlotMsg) -> None:
        self._queue.put_nowait(msg)

    # -- the actor ------------------------------------------------------

    async def _run(self) -> None:
        while True:
            msg = await self._queue.get()
            if isinstance(msg, Close):
                self._stand_in.stop()
                self.extra.close()
                return
            try:
                await self._handle(msg)
            except Exception as exc:  # a bug here must not leave the slot without its actor
                log_event(
                    logger,
                    "slot.error",
                    logging.ERROR,
                    model=self.name,
                    kind=type(msg).__name__,
                    error=f"{type(exc).__name__}: {exc}",
                )
                if isinstance(msg, Call):
                    _resolve(msg.future, (False, f"internal error: {exc}"))

    async def _handle(self, msg: SlotMsg) -> None:
        match msg:
            case Open():
                self._bind()
                await self._sync_responder()
            case UseSettings(settings):
                self.settings = settings
            case TurnedAway(until):
                self.expected_until = max(self.expected_until, until)
            case PlanShare(share):
                self.planned_share = share
            case Listening(worker):  # a starting worker is about to accept: the stand-in steps aside
                if worker is self.worker:
                    await self._sync_responder()
            case ReleaseSocket(future=future):
                if self.phase != states.STOPPED:
                    future.set_exception(RuntimeError(f"release_socket while {self.phase}"))
                    return
                self._stand_in.stop()
                sock, self.sock = self.sock, None
                _resolve(future, sock)
            case Command():
                if msg.waits is not None:
                    self._waiters.append((msg.future, msg.waits))
                await self._decide(msg.event, msg)
            case FollowUp(event):
                await self._decide(event, msg)
            case WorkerNews() | WorkerExited() | BackoffElapsed():
                decided = self._event_for(msg)
                if decided is not None:
                    await self._decide(decided, msg)
            case Close():
                pass  # the loop ends on it (_run)
            case _:
                assert_never(msg)

    async def _decide(self, event: Event, msg: SlotMsg) -> None:
        decision = decide(self.phase, event, self.counters, self.settings.tuning.policy)
        if decision.error:
            log_event(logger, "slot.illegal_transition", logging.WARNING, model=self.name, error=decision.error)
            if isinstance(msg, Call):
                self._waiters = [(f, w) for f, w in self._waiters if f is not msg.future]
                _resolve(msg.future, (False, decision.error))
            return
        await self._apply(decision, msg, event)

    def _event_for(self, msg: WorkerNews | WorkerExited | BackoffElapsed) -> Event | None:
        """The event to decide on, or None for news about a worker that is no longer this slot's."""
        match msg:
            case BackoffElapsed(token):
                return Event("backoff_elapsed") if token == self._backoff_token else None
            case WorkerExited(worker):
                return self._exited(worker)
            case WorkerNews(kind, worker):
                if worker is not self.worker:
                    return None
                if kind == "start_timeout":  # kept for when its exit (the kill) is reported
                    worker.failure = f"did not become ready within {self.settings.tuning.ready_timeout_s:g}s"
                return Event(kind)

    def _exited(self, worker: WorkerProcess) -> Event | None:
        if worker is self.held:
            self.held = None
            log_event(
                logger,
                "worker.exited",
                logging.WARNING,
                model=self.name,
                pid=worker.pid,
                exit_code=worker.exit_code,
                reason="it was serving while its replacement loaded",
            )
            return Event("held_exited", code=worker.exit_code)
        if worker is not self.worker:
            return None  # a retired worker, drained after a swap
        self.worker = None
        self.ready_since = None
        if self.phase != states.DRAINING:  # a stop is not a crash
            self.last_exit_code = worker.exit_code
            said = exit_reason(worker.failure, worker.last_lines(40).splitlines())
            self.last_error = said or f"exited with code {worker.exit_code}"
        ready_for = self.clock.monotonic() - worker.ready_at if worker.ready_at is not None else None
        return Event("worker_exited", code=worker.exit_code, ready_for_s=ready_for)

    async def _apply(self, d: Decision, msg: SlotMsg, event: Event) -> None:
        before = (public_state(self.phase), self.pid)
        self.phase, self.counters = d.phase, d.counters
        follow_up: Event | None = None
        for action in d.actions:
            follow_up = await self._do(action, msg, d) or follow_up
        if event.kind == "worker_ready" and self.worker is not None:
            self.worker.ready_at = self.clock.monotonic()
            self.ready_since = self.clock.time()
        if d.phase == states.FAILED:
            self.fail_reason = d.reason or self.fail_reason
        if isinstance(msg, ApplySettings) and "push_settings" not in d.actions:
            _resolve(msg.future, (True, None))
        self._announce(before, d, event)
        if d.outcome == "restored":
            log_event(
                logger,
                "worker.replace_failed",
                logging.ERROR,
                model=self.name,
                exit_code=self.last_exit_code,
                error=self.last_error,
            )
        if d.outcome is not None:
            self._settle(d.outcome)
        await self._sync_responder()
        if follow_up is not None:  # a spawn that failed: a crash, decided like any other
            await self._handle(FollowUp(follow_up))

    async def _do(self, action: str, msg: SlotMsg, d: Decision) -> Event | None:
        if action == "adopt":
            self._adopt(msg)
            if self.phase == UNLOADED:
                self._bind()
        elif action == "spawn":
            return await self._spawn()
        elif action == "hold_and_spawn":
            self.held, self.worker = self.worker, None
            return await self._spawn()
        elif action == "kill" and self.worker is not None:
            self.worker.kill()
        elif action == "drain" and self.worker is not None:
            self._workers.drain(self.worker, self.settings.drain_timeout)
        elif action == "release_held" and self.held is not None:
            held, self.held = self.held, None
            self._workers.retire(held, self.settings.drain_timeout)
        elif action == "restore_held" and self.held is not None:
            self.worker, self.held = self.held, None
            self.config, self.share, self.planned_share = self.worker.config, self.worker.share, self.worker.share
            now = self.clock.monotonic()
            self.ready_since = self.clock.time() - (now - (self.worker.ready_at or now))
        elif action == "push_settings" and self.worker is not None and isinstance(msg, ApplySettings):
            future = msg.future
            self._workers.push(self.worker, self.config, lambda result: _resolve(future, result))
        elif action == "schedule_backoff":
            self._backoff_token += 1
            self._backoff = self._workers.backoff(d.delay or 0.0, self._backoff_token)
        elif action == "cancel_backoff":
            self._backoff_token += 1
            if self._backoff is not None:
                self._backoff.cancel()
        return None

    def _adopt(self, msg: SlotMsg) -> None:
        if not isinstance(msg, Replace | ApplySettings):
            return  # only these carry a config (transitions adopt on them alone)
        new = msg.config
        if isinstance(msg, Replace):
            self.planned_share = msg.share
        if msg.sock is not None and msg.sock is not self.sock:
            self._stand_in.stop()
            if self.sock is not None:
                self.sock.close()
            self.sock = msg.sock
        elif (new.host, new.port) != (self.config.host, self.config.port) and self.sock is not None:
            self._stand_in.stop()  # a new address: bound at the next spawn
            self.sock.close()
            self.sock = None
        self.config = new

    def _bind(self) -> None:
        """Bind the slot's address now if it has no socket (a lazy model's stand-in answers there)."""
        if self.sock is not None:
            return
        try:
            self.sock = bind_tcp(self.config.host, self.config.port)
        except OSError as exc:
            self.last_error = f"cannot listen on {self.config.host}:{self.config.port}: {exc.strerror or exc}"
            log_event(logger, "slot.bind_failed", logging.WARNING, model=self.name, error=self.last_error)

    async def _spawn(self) -> Event | None:
        """Start a worker for the target; a failure is a crash (returned as its exit event), never an exception."""
        s = self.settings
        try:
            if self.sock is None:
                self.sock = bind_tcp(self.config.host, self.config.port)
            self._stand_in.stop()  # the worker inherits the socket; the stand-in restarts if it must
            extra = self.extra.fds_for(self.config)
            worker = await self._workers.spawn(
                self.config,
                self.sock,
                s.tuning,
                state_dir=s.state_dir,
                drain_timeout=s.drain_timeout,
                log_level=s.log_level,
                sink=self.log.forward,
                cpus=self.planned_share.render() if self.planned_share else None,
                module=self.module,
                **({"extra_fds": extra} if extra else {}),
            )
        except OSError as exc:
            where = f"{self.config.host}:{self.config.port}"
            self.last_error = f"cannot listen on {where}: {exc.strerror}" if self.sock is None else str(exc)
            self.last_exit_code = None
            log_event(logger, "worker.spawn_failed", logging.ERROR, model=self.name, error=self.last_error)
            return Event("worker_exited", code=None, ready_for_s=None)
        worker.share = self.share = self.planned_share
        self.worker = worker
        return None

    def kill_all(self) -> list[int]:
        """SIGKILL every worker still alive (the daemon's last resort at exit); their pids."""
        return self._workers.kill_all()

    # -- what callers and clients see -------------------------------------

    def _announce(self, before: tuple, d: Decision, event: Event) -> None:
        state = public_state(self.phase)
        if (state, self.pid) == before and not (d.phase == SWAPPING and event.kind != "held_exited"):
            return
        name, level, fields = announcement(
            self.name,
            state,
            d.phase == SWAPPING,
            pid=self.pid,
            worker_pid=self.worker.pid if self.worker else None,
            held_pid=self.held.pid if self.held else None,
            url=self.url,
            exit_code=self.last_exit_code,
            reason=self.fail_reason,
            retry_in_s=d.delay,
        )
        log_event(logger, name, level, **fields)
        # `vllmmlxctl logs MODEL` shows the daemon's view of the model beside the worker's own lines.
        self.log.keep(event_line(name, logging.getLevelName(level).lower(), **fields))
        self._on_change()

    def _settle(self, outcome: str) -> None:
        """Resolve the callers waiting for this outcome."""
        answered, self._waiters = settle(self._waiters, outcome, why_not(outcome, self.fail_reason, self.last_error))
        for future, result in answered:
            _resolve(future, result)

    def _answered(self, why: Unavailable, retries: bool) -> None:
        if retries and why.status in ("unloaded", "loading"):  # the client was told to come back: expect it then
            self._post(TurnedAway(self.clock.monotonic() + why.retry_after_s + RETRY_SLACK_S))
        if why.status == "unloaded":
            self._on_demand()

    def unavailable(self) -> Unavailable:
        """What the stand-in answers on the port, and why."""
        return unavailable(self.name, self.phase, self.fail_reason, self.last_error)

    async def _sync_responder(self) -> None:
        """Run the stand-in exactly while no worker serves, or is about to, on the slot's socket."""
        idle = self.phase in (states.STARTING, states.BACKOFF, states.FAILED, states.STOPPED, UNLOADED)
        worker_accepts = self.worker is not None and self.worker.listening
        await self._stand_in.sync(self.sock, idle and not worker_accepts and not self._closed)

    @property
    def state(self) -> states.Shown:
        return public_state(self.phase)

    @property
    def restarts(self) -> int:
        return self.counters.restarts

    @property
    def url(self) -> str:
        return http_url(self.config.host, self.config.port)

    @property
    def pid(self) -> int | None:
        """The serving worker's pid: the held one during a swap, else the current one."""
        return self.serving.pid if self.serving is not None else None

    @property
    def serving(self) -> WorkerProcess | None:
        worker = self.held if self.phase == SWAPPING and self.held is not None else self.worker
        return worker if worker is not None and worker.alive else None
