"""What a slot does on each command or event: one pure function over (phase, event).

A slot's actor (``slot.py``) feeds every command (start, stop, a reload's replace...) and
every event about its workers (ready, exited, unhealthy, timers) through ``decide`` and
carries out the actions it returns; nothing else changes a slot's phase. A pair that makes
no sense (a backoff timer firing while ready) is refused with an error and changes nothing.

Phases are the public states plus ``swapping``: a new worker loads while the previous one
(the *held* worker) keeps serving; ``vllmmlxctl status`` shows it as ready. A lazy model's
slot has one more, ``unloaded``: no worker, but a ``load`` (a request needs it) starts one,
where ``stopped`` (on purpose) waits for a ``start``. Unloading is a stop that ends there.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from typing import Final, Literal, TypedDict

from . import states
from .backoff import BackoffPolicy

Phase = Literal["starting", "ready", "swapping", "draining", "backoff", "failed", "stopped", "unloaded"]
SWAPPING: Final = "swapping"
UNLOADED: Final = "unloaded"
PHASES: tuple[Phase, ...] = (*states.ALL, SWAPPING, UNLOADED)


def public_state(phase: Phase) -> states.Shown:
    """What status shows: a swap is invisible, the held worker is still serving."""
    return states.READY if phase == SWAPPING else phase


Command = Literal["start", "stop", "restart", "replace", "apply_settings", "shutdown", "load", "unload"]
WorkerEvent = Literal[
    "worker_ready", "worker_exited", "held_exited", "health_failed", "start_timeout", "backoff_elapsed"
]
# Commands come from the supervisor, the control API and shutdown; worker events from the slot's watches and timers.
EventKind = Literal[Command, WorkerEvent]
COMMANDS: tuple[Command, ...] = typing.get_args(Command)
EVENTS: tuple[EventKind, ...] = (*COMMANDS, *typing.get_args(WorkerEvent))


@dataclass(frozen=True)
class Event:
    kind: EventKind
    code: int | None = None  # worker_exited / held_exited: the exit code (negative: a signal)
    ready_for_s: float | None = None  # worker_exited: how long it had been ready (None: never was)
    hold_both: bool = True  # restart / replace: may the old and new worker run together (memory)


@dataclass(frozen=True)
class Counters:
    """What the decision needs beyond the phase."""

    fast_crashes: int = 0  # crashes in a row, each before or soon after READY
    restarts: int = 0  # shown in status: crash restarts and `vllmmlxctl restart`
    then_start: bool = False  # draining: start a worker (the target config) once this one is gone
    then_unload: bool = False  # draining: end unloaded (a lazy model's idle or memory unload), not stopped
    closing: bool = False  # shut down: nothing starts any more


# Actions, carried out in order by the slot's actor.
Action = Literal[
    "spawn",  # start a worker for the target config; it becomes the current worker
    "hold_and_spawn",  # the current worker becomes the held one (keeps serving); spawn a new current
    "kill",  # SIGKILL the current worker (half-started, hung, or its start timed out); its exit follows
    "drain",  # SIGTERM the current worker: finish in-flight requests, then exit; its exit follows
    "release_held",  # drain the held worker in the background: it no longer belongs to the slot
    "restore_held",  # the new worker is gone: the held one is current again, with its config
    "adopt",  # take the command's config (and cores) as the slot's target
    "push_settings",  # send the target's live settings to the running worker
    "schedule_backoff",  # arm the restart timer (Decision.delay)
    "cancel_backoff",
]

# How waiting callers learn the outcome: a start/restart/replace waits for "serving" outcomes,
# a stop for "stopped" (or "gone": the worker is gone and a start follows).
Outcome = Literal["ready", "restored", "crashed", "failed", "stopped", "gone", "kept"]


class _StopChanges(TypedDict):
    """The counters a stop sets, whatever the phase."""

    closing: bool
    then_start: bool
    then_unload: bool


# "kept": a command done without a worker (a replace of an unloaded model: its next load runs the new config).


@dataclass(frozen=True)
class Decision:
    phase: Phase
    actions: tuple[Action, ...] = ()
    counters: Counters = Counters()
    outcome: Outcome | None = None
    delay: float | None = None  # schedule_backoff: seconds
    reason: str | None = None  # why it failed (or why a command was refused, with ``error``)
    error: str | None = None  # set: the pair is illegal, refused; phase and counters unchanged


def decide(phase: Phase, event: Event, counters: Counters, policy: BackoffPolicy) -> Decision:  # noqa: C901 - until the transitions become a table (issue 38)
    """The next phase, the actions that get there and the outcome callers see. Pure."""
    kind = event.kind
    c = counters

    def go(to: Phase, *actions: Action, outcome: Outcome | None = None, **changes) -> Decision:
        return Decision(to, actions, dataclasses.replace(c, **changes) if changes else c, outcome)

    def refuse(why: str) -> Decision:
        return Decision(phase, (), c, error=f"{event.kind} while {phase}: {why}")

    if c.closing and kind in ("start", "restart", "replace", "backoff_elapsed", "load"):
        return refuse("the daemon is shutting down")

    if kind == "unload":
        return _unload(phase, c, go, refuse)

    if kind == "load":  # a request needs the model: as a start, but a model stopped on purpose stays stopped
        if phase == states.STOPPED:
            return refuse("stopped on purpose (vllmmlxctl start loads it)")
        if phase == states.FAILED:
            return refuse("failed (a reload, start or restart tries again)")
        if phase == states.DRAINING and c.then_unload:  # unloading: load again once that worker is gone
            return go(states.DRAINING, then_start=True, then_unload=False)
        if phase == states.DRAINING and not c.then_start:
            return refuse("stopping")
        kind = "start"

    if kind in ("stop", "shutdown"):
        closing = c.closing or kind == "shutdown"
        if phase in (states.STOPPED, states.FAILED, UNLOADED):
            return go(states.STOPPED, outcome="stopped", closing=closing, then_start=False, then_unload=False)
        stop: _StopChanges = {"closing": closing, "then_start": False, "then_unload": False}
        if phase == states.BACKOFF:
            return go(states.STOPPED, "cancel_backoff", outcome="stopped", **stop)
        if phase == states.STARTING:  # a half-started worker is killed, not waited for
            return go(states.DRAINING, "kill", **stop)
        if phase == states.READY:
            return go(states.DRAINING, "drain", **stop)
        if phase == SWAPPING:
            return go(states.DRAINING, "kill", "release_held", **stop)
        return go(states.DRAINING, **stop)  # draining already

    if kind in ("start", "restart", "replace"):
        adopt: tuple[Action, ...] = ("adopt",) if kind == "replace" else ()
        counted = c.restarts + (kind == "restart")
        if phase in (SWAPPING, states.DRAINING) and kind != "start":
            return refuse("busy: a swap or a stop is in progress")
        if phase == states.DRAINING:  # start after a stop: once the old worker is gone
            return go(states.DRAINING, then_start=True, then_unload=False)
        if phase == UNLOADED and kind == "replace":  # nothing runs: the next load takes the new config
            return go(UNLOADED, "adopt", outcome="kept")
        if phase in (states.STOPPED, states.FAILED, UNLOADED):
            return go(states.STARTING, *adopt, "spawn", fast_crashes=0, restarts=counted)
        if phase == states.BACKOFF:
            return go(states.STARTING, "cancel_backoff", *adopt, "spawn", fast_crashes=0, restarts=counted)
        if kind == "start":  # starting, ready or swapping: already on its way
            return go(phase, outcome="ready" if phase == states.READY else None)
        if phase == states.STARTING:  # replace the half-started worker: kill it, start the target
            return go(states.DRAINING, *adopt, "kill", then_start=True, restarts=counted)
        if event.hold_both:  # ready: zero downtime, the old worker serves until the new one is ready
            return go(SWAPPING, *adopt, "hold_and_spawn", restarts=counted)
        return go(states.DRAINING, *adopt, "drain", then_start=True, restarts=counted)

    if kind == "apply_settings":
        if phase == states.READY:
            return go(states.READY, "adopt", "push_settings")
        if phase in (states.STOPPED, states.FAILED, states.BACKOFF, UNLOADED, states.DRAINING):
            return go(phase, "adopt")  # the next worker starts with them
        if phase == states.STARTING:  # it loaded the old settings: start again with the new
            return go(states.DRAINING, "adopt", "kill", then_start=True)
        return refuse("busy: a swap or a stop is in progress")

    if kind == "worker_ready":
        if phase == states.STARTING:
            return go(states.READY, outcome="ready")
        if phase == SWAPPING:
            return go(states.READY, "release_held", outcome="ready", fast_crashes=0)
        return refuse("no worker is starting")

    if kind == "worker_exited":
        if phase == states.DRAINING:
            if c.then_start and not c.closing:
                return go(states.STARTING, "spawn", outcome="gone", then_start=False, fast_crashes=0)
            if c.then_unload and not c.closing:
                return go(UNLOADED, outcome="stopped", then_unload=False)
            return go(states.STOPPED, outcome="stopped", then_start=False)
        if phase == SWAPPING:  # the new worker failed: the old one keeps serving
            return go(states.READY, "restore_held", outcome="restored")
        if phase in (states.STARTING, states.READY):
            return _crashed(event, c, policy)
        return refuse("no worker is running")

    if kind == "held_exited":
        if phase == SWAPPING:  # nothing serves while the new worker loads
            return go(states.STARTING)
        return refuse("no worker is held")

    if kind == "health_failed":
        if phase == states.READY:  # hung: kill it; its exit restarts it
            return go(states.READY, "kill")
        return refuse("no worker is ready")

    if kind == "start_timeout":
        if phase in (states.STARTING, SWAPPING):  # its exit counts as a crash (or a failed swap)
            return go(phase, "kill")
        return refuse("no worker is starting")

    if kind == "backoff_elapsed":
        if phase == states.BACKOFF:
            return go(states.STARTING, "spawn", restarts=c.restarts + 1)
        return refuse("no restart is pending")

    return refuse("unknown event")


def _unload(phase: Phase, c: Counters, go, refuse) -> Decision:
    """A lazy model gives its memory back (idle, or room for another): it ends unloaded, loading on demand."""
    if c.closing:
        return refuse("the daemon is shutting down")
    if phase == UNLOADED:
        return go(UNLOADED, outcome="stopped")
    if phase == states.BACKOFF:
        return go(UNLOADED, "cancel_backoff", outcome="stopped")
    if phase == states.READY:
        return go(states.DRAINING, "drain", then_unload=True, then_start=False)
    if phase == states.STARTING:
        return go(states.DRAINING, "kill", then_unload=True, then_start=False)
    return refuse(
        "busy: a swap or a stop is in progress"
        if phase in (SWAPPING, states.DRAINING)
        else "stopped or failed: there is nothing to unload"
    )


def _crashed(event: Event, c: Counters, policy: BackoffPolicy) -> Decision:
    """The current worker died: fail at once if it cannot load, else back off, or give up after N fast crashes.

    A crash is fast when the worker was never ready or was ready for less than ``fast_crash_s``:
    measured from READY, so a model that takes minutes to load and then dies still counts.
    """
    if event.code == states.EXIT_LOAD_FAILED:
        return Decision(
            states.FAILED,
            (),
            dataclasses.replace(c, fast_crashes=c.fast_crashes + 1),
            "failed",
            reason="the model could not be loaded",
        )
    ran = event.ready_for_s if event.ready_for_s is not None else 0.0
    fast = policy.next_fast_crashes(c.fast_crashes, ran)
    counters = dataclasses.replace(c, fast_crashes=fast)
    if policy.gives_up(fast):
        return Decision(states.FAILED, (), counters, "failed", reason=f"crashed {fast} times in a row")
    return Decision(states.BACKOFF, ("schedule_backoff",), counters, "crashed", delay=policy.delay(fast))


_KINDS: dict[str, EventKind] = {kind: kind for kind in EVENTS}  # a message's kind, typed as the event it is


def command_kind(kind: str) -> EventKind:
    if kind not in COMMANDS:
        raise ValueError(f"not a slot command: {kind}")
    return _KINDS[kind]


def worker_event_kind(kind: str) -> EventKind:
    if kind not in _KINDS or kind in COMMANDS:
        raise ValueError(f"not a worker event: {kind}")
    return _KINDS[kind]
