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
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from .. import states
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


# The transitions, read top down: the first row whose event, phase and condition match decides.
# A kind of event no row takes in a phase is refused ("… while PHASE: why"), changing nothing.
# ``count`` is one more restart in status; ``then`` sets counters; ``AS_START``: decided as a start;
# ``CRASH``: the current worker died (``_crashed``: back off, or fail). ``shutdown`` is a stop that
# also closes the slot (``decide`` sets ``closing`` first), and a closing slot refuses what would start.


@dataclass(frozen=True)
class Go:
    to: Phase | None = None  # None: the phase it is in
    actions: tuple[Action, ...] = ()
    outcome: Outcome | None = None
    then: Mapping[str, bool | int] = field(default_factory=dict)
    count: bool = False


@dataclass(frozen=True)
class Refuse:
    why: str


AS_START: Final = "as_start"
CRASH: Final = "crash"
Rule = Go | Refuse | Literal["as_start", "crash"]
When = Callable[[Event, Counters], bool]


@dataclass(frozen=True)
class Row:
    kinds: frozenset[str]
    phases: frozenset[str]
    rule: Rule
    when: When | None = None


def _row(kinds: str, phases: str, rule: Rule, when: When | None = None) -> Row:
    row = Row(frozenset(kinds.split()), frozenset(PHASES if phases == "*" else phases.split()), rule, when)
    if not row.kinds <= set(EVENTS) or not row.phases <= set(PHASES):  # a typo fails at import, not at run time
        raise ValueError(f"transitions: unknown event or phase in {kinds!r} / {phases!r}")
    return row


def _then_start(_e: Event, c: Counters) -> bool:
    return c.then_start and not c.closing


def _then_unload(_e: Event, c: Counters) -> bool:
    return c.then_unload and not c.closing


def _unloading(_e: Event, c: Counters) -> bool:
    return c.then_unload


def _not_restarting(_e: Event, c: Counters) -> bool:
    return not c.then_start


def _hold_both(e: Event, _c: Counters) -> bool:
    return e.hold_both


_STOP: Mapping[str, bool] = {"then_start": False, "then_unload": False}
_UNLOAD: Mapping[str, bool] = {"then_unload": True, "then_start": False}
_FRESH: Mapping[str, int] = {"fast_crashes": 0}
_BUSY = Refuse("busy: a swap or a stop is in progress")
_NOT_STARTING = Refuse("no worker is starting")

TABLE: tuple[Row, ...] = (
    # event                      phase                        rule
    _row("stop", "stopped failed unloaded", Go("stopped", outcome="stopped", then=_STOP)),
    _row("stop", "backoff", Go("stopped", ("cancel_backoff",), "stopped", then=_STOP)),
    _row("stop", "starting", Go("draining", ("kill",), then=_STOP)),  # a half-started worker: killed
    _row("stop", "ready", Go("draining", ("drain",), then=_STOP)),
    _row("stop", "swapping", Go("draining", ("kill", "release_held"), then=_STOP)),
    _row("stop", "draining", Go("draining", then=_STOP)),
    # A lazy model gives its memory back (idle, or room for another) and ends unloaded.
    _row("unload", "unloaded", Go("unloaded", outcome="stopped")),
    _row("unload", "backoff", Go("unloaded", ("cancel_backoff",), "stopped")),
    _row("unload", "ready", Go("draining", ("drain",), then=_UNLOAD)),
    _row("unload", "starting", Go("draining", ("kill",), then=_UNLOAD)),
    _row("unload", "swapping draining", _BUSY),
    _row("unload", "stopped failed", Refuse("stopped or failed: there is nothing to unload")),
    # A request needs the model: a start, but a model stopped on purpose (or failed) stays so.
    _row("load", "stopped", Refuse("stopped on purpose (vllmmlxctl start loads it)")),
    _row("load", "failed", Refuse("failed (a reload, start or restart tries again)")),
    _row("load", "draining", Go("draining", then={"then_start": True, "then_unload": False}), _unloading),
    _row("load", "draining", Refuse("stopping"), _not_restarting),
    _row("load", "*", AS_START),
    _row("restart replace", "swapping draining", _BUSY),
    _row("start", "draining", Go("draining", then={"then_start": True, "then_unload": False})),  # once it is gone
    _row("replace", "unloaded", Go("unloaded", ("adopt",), "kept")),  # the next load runs the new config
    _row("start", "stopped failed unloaded", Go("starting", ("spawn",), then=_FRESH)),
    _row("restart", "stopped failed unloaded", Go("starting", ("spawn",), then=_FRESH, count=True)),
    _row("replace", "stopped failed", Go("starting", ("adopt", "spawn"), then=_FRESH)),
    _row("start", "backoff", Go("starting", ("cancel_backoff", "spawn"), then=_FRESH)),
    _row("restart", "backoff", Go("starting", ("cancel_backoff", "spawn"), then=_FRESH, count=True)),
    _row("replace", "backoff", Go("starting", ("cancel_backoff", "adopt", "spawn"), then=_FRESH)),
    _row("start", "ready", Go(outcome="ready")),
    _row("start", "starting swapping", Go()),  # already on its way
    # Replacing a half-started worker: kill it, then start the target.
    _row("restart", "starting", Go("draining", ("kill",), then={"then_start": True}, count=True)),
    _row("replace", "starting", Go("draining", ("adopt", "kill"), then={"then_start": True})),
    # Ready: zero downtime when both may run (the old one serves until the new is ready), else drain first.
    _row("restart", "ready", Go("swapping", ("hold_and_spawn",), count=True), _hold_both),
    _row("replace", "ready", Go("swapping", ("adopt", "hold_and_spawn")), _hold_both),
    _row("restart", "ready", Go("draining", ("drain",), then={"then_start": True}, count=True)),
    _row("replace", "ready", Go("draining", ("adopt", "drain"), then={"then_start": True})),
    _row("apply_settings", "ready", Go("ready", ("adopt", "push_settings"))),
    _row("apply_settings", "stopped failed backoff unloaded draining", Go(actions=("adopt",))),  # the next worker
    _row("apply_settings", "starting", Go("draining", ("adopt", "kill"), then={"then_start": True})),  # loaded old
    _row("apply_settings", "swapping", _BUSY),
    _row("worker_ready", "starting", Go("ready", outcome="ready")),
    _row("worker_ready", "swapping", Go("ready", ("release_held",), "ready", then=_FRESH)),
    _row("worker_ready", "*", _NOT_STARTING),
    _row("worker_exited", "draining", Go("starting", ("spawn",), "gone", {"then_start": False, **_FRESH}), _then_start),
    _row("worker_exited", "draining", Go("unloaded", outcome="stopped", then={"then_unload": False}), _then_unload),
    _row("worker_exited", "draining", Go("stopped", outcome="stopped", then={"then_start": False})),  # never a crash
    _row("worker_exited", "swapping", Go("ready", ("restore_held",), "restored")),  # the old one keeps serving
    _row("worker_exited", "starting ready", CRASH),
    _row("worker_exited", "*", Refuse("no worker is running")),
    _row("held_exited", "swapping", Go("starting")),  # nothing serves while the new worker loads
    _row("held_exited", "*", Refuse("no worker is held")),
    _row("health_failed", "ready", Go(actions=("kill",))),  # hung: killed, and its exit restarts it
    _row("health_failed", "*", Refuse("no worker is ready")),
    _row("start_timeout", "starting swapping", Go(actions=("kill",))),  # its exit: a crash, or a failed swap
    _row("start_timeout", "*", _NOT_STARTING),
    _row("backoff_elapsed", "backoff", Go("starting", ("spawn",), count=True)),
    _row("backoff_elapsed", "*", Refuse("no restart is pending")),
)

_CLOSED_TO = frozenset({"start", "restart", "replace", "backoff_elapsed", "load", "unload"})


def decide(phase: Phase, event: Event, counters: Counters, policy: BackoffPolicy) -> Decision:
    """The next phase, the actions that get there and the outcome callers see: ``TABLE``'s first match. Pure."""
    c = counters
    if c.closing and event.kind in _CLOSED_TO:
        return _refused(phase, event, c, "the daemon is shutting down")
    kind: str = event.kind
    if kind == "shutdown":
        kind, c = "stop", dataclasses.replace(c, closing=True)
    for row in TABLE:
        if kind in row.kinds and phase in row.phases and (row.when is None or row.when(event, c)):
            rule = row.rule
            if rule == AS_START:  # the start rows come after the load rows: the scan goes on as a start
                kind = "start"
                continue
            if rule == CRASH:
                return _crashed(event, c, policy)
            if isinstance(rule, Refuse):
                return _refused(phase, event, counters, rule.why)
            assert isinstance(rule, Go)
            changes: dict[str, Any] = {**rule.then, **({"restarts": c.restarts + 1} if rule.count else {})}
            after = dataclasses.replace(c, **changes) if changes else c
            return Decision(rule.to or phase, rule.actions, after, rule.outcome)
    return _refused(phase, event, counters, "unknown event")


def _refused(phase: Phase, event: Event, counters: Counters, why: str) -> Decision:
    return Decision(phase, (), counters, error=f"{event.kind} while {phase}: {why}")


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
