"""What the supervisor does next: pure functions over the units, the machine's memory and one event.

The supervisor's task (``supervisor.py``) is the only place that decides; it gathers the
facts (each unit's state, footprint, idle time and whether an operation of its own is on
it), calls one of these, and carries out the actions they return as operations that only
drive units through their commands. Because every decision reads the same facts in the
same task, two decisions about one unit cannot overlap: a unit with an operation on it
(``busy``) is left alone by the idle unloader and by memory admission, whatever its state.

- ``plan(units, capacity, Tick())``: lazy models idle for their ``idle_unload_s`` are unloaded.
- ``plan(units, capacity, LoadWanted(name))``: a request needs ``name``: join a load on its way,
  or admit it, unloading idle lazy models least recently used first to make room, or refuse.
- ``plan_reload(diff, units, entries, swappable, live_push)``: a reload's steps per entry, in
  two waves (removals and moves free their sockets before anything takes them).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from ..config.diff import ReloadPlan
from . import lazy, states

Kind = Literal["model", "upstream", "gateway"]
Busy = Literal["loading", "unloading", "reloading", "stopping", "starting"]


@dataclass(frozen=True)
class UnitFacts:
    """What a decision may know of one unit, as the supervisor's task saw it."""

    name: str
    kind: Kind = "model"
    state: states.Shown = states.STOPPED  # its slot's public state (``unloaded`` for a lazy model not loaded)
    lazy: bool = False
    footprint_mb: int = 0
    idle_s: float | None = None  # a ready worker's time without a request; None: busy or not known
    idle_unload_s: float | None = None
    busy: Busy | None = None  # an operation of the supervisor's is on it
    error: str | None = None  # why it is failed, for refusals


@dataclass(frozen=True)
class Tick:
    """A second went by: idle lazy models may be due."""


@dataclass(frozen=True)
class LoadWanted:
    name: str
    start: bool = False  # `vllmmlxctl start`: a model stopped on purpose loads too


Event = Tick | LoadWanted


@dataclass(frozen=True)
class Unload:
    name: str
    reason: Literal["idle", "memory"]
    for_model: str | None = None  # memory: the model it makes room for


@dataclass(frozen=True)
class Load:
    """Start ``name`` (its memory was admitted)."""

    name: str


@dataclass(frozen=True)
class Join:
    """``name`` is loaded or on its way: wait for its slot to be ready."""

    name: str


@dataclass(frozen=True)
class Answer:
    """Nothing to do: answer now (``ok`` or why not)."""

    name: str
    ok: bool
    message: str


Action = Unload | Load | Join | Answer

# States that hold memory: a worker runs (or is about to).
HOLDING: frozenset[str] = frozenset({states.STARTING, states.READY, states.DRAINING, states.LOADING, states.IDLE})


def plan(units: Mapping[str, UnitFacts], usable_mb: int | None, event: Event) -> list[Action]:
    """The actions for ``event`` (see the module's docstring). Pure."""
    if isinstance(event, Tick):
        return [
            Unload(u.name, "idle")
            for u in units.values()
            if u.kind == "model"
            and u.busy is None
            and u.state in (states.READY, states.IDLE)
            and lazy.should_unload(u.idle_s, u.idle_unload_s)
        ]
    return _load(units, usable_mb, event.name, event.start)


def _load(units: Mapping[str, UnitFacts], usable_mb: int | None, name: str, start: bool) -> list[Action]:
    unit = units.get(name)
    if unit is None:
        return [Answer(name, False, f"no model named {name!r}; models: {', '.join(units) or 'none'}")]
    if unit.kind == "upstream":
        ok = unit.state == states.READY
        return [Answer(name, ok, unit.error or unit.state if not ok else "ready")]
    if unit.kind != "model":
        return [Answer(name, False, f"{name} is not a model")]
    if unit.busy == "loading" or (unit.state in HOLDING and unit.busy != "unloading"):
        return [Join(name)]
    if unit.state == states.STOPPED and not start:
        return [Answer(name, False, f"model {name} is stopped (vllmmlxctl start {name})")]
    if unit.state == states.FAILED:
        return [Answer(name, False, f"model {name} failed: {unit.error}")]
    if unit.state == states.DOWNLOADING:  # download: true: it starts once its files are here
        return [Answer(name, False, f"model {name} is not here yet ({unit.error})")]
    if unit.busy is not None and unit.busy != "unloading":  # a reload or a stop is on it: its slot decides after
        return [Join(name)]
    # Unloaded, backing off, or being unloaded: its memory must be admitted again.
    resident = [
        lazy.Resident(u.name, u.footprint_mb, u.idle_s if _evictable(u) else None)
        for u in units.values()
        if u.name != name and u.kind == "model" and _holds_memory(u)
    ]
    room = lazy.make_room(name, unit.footprint_mb, usable_mb, resident)
    if not room.fits:
        return [Answer(name, False, room.message)]
    return [*(Unload(victim, "memory", name) for victim in room.evict), Load(name)]


def _holds_memory(u: UnitFacts) -> bool:
    return u.state in HOLDING or u.busy in ("loading", "starting", "reloading") or u.state == states.BACKOFF


def _evictable(u: UnitFacts) -> bool:
    """An idle lazy model nothing else is doing anything to."""
    return u.lazy and u.busy is None and u.state in (states.READY, states.IDLE) and u.idle_s is not None


# -- reloads ------------------------------------------------------------------

Step = Literal[
    "remove",  # shut the unit down, keep its socket for whoever takes the address
    "move",  # stop it, free its socket; then start it on its new address (second wave)
    "add",  # a new unit; started when eager
    "live",  # push the new settings to the running worker (a new worker if the push fails)
    "swap",  # a new worker beside the old one, which serves until it is ready
    "stop_start",  # not enough memory for both: stop, then start
    "adopt",  # no worker runs (unloaded, stopped, failed): the next start takes the new entry
]


@dataclass(frozen=True)
class EntryFacts:
    """A model entry of the new config, as a reload needs to know it."""

    kind: Kind  # model (served here) or upstream
    address: tuple[str, int] | None  # where it listens here (None: an upstream)
    lazy: bool = False


@dataclass(frozen=True)
class ReloadSteps:
    first: tuple[tuple[str, Step], ...]  # removals and moves' stops: they free sockets
    then: tuple[tuple[str, Step], ...]  # changes, additions, moves' starts

    def names(self) -> frozenset[str]:
        return frozenset(n for n, _ in (*self.first, *self.then))


def plan_reload(
    diff: ReloadPlan,
    units: Mapping[str, UnitFacts],
    addresses: Mapping[str, tuple[str, int] | None],
    entries: Mapping[str, EntryFacts],
    swappable: frozenset[str],
    live_push: bool,
) -> ReloadSteps:
    """Each entry's step for ``diff``: ``units`` as they run, ``addresses`` where they listen now,
    ``entries`` the new config's, ``swappable`` the changed ones whose old and new worker fit together.

    An entry that changes between served here and upstream is removed, then added: they are
    different kinds of unit. Pure."""
    first: list[tuple[str, Step]] = [(n, "remove") for n in diff.removed]
    then: list[tuple[str, Step]] = []
    for name in diff.changed:
        unit, entry = units.get(name), entries[name]
        if unit is None or unit.kind != entry.kind:
            first.append((name, "remove"))
            then.append((name, "add"))
        elif entry.kind == "upstream":
            then.append((name, "live"))  # nothing runs here: the health checks take the new URL
        elif addresses.get(name) != entry.address:
            first.append((name, "move"))
            then.append((name, "move"))
        elif unit.state == states.UNLOADED and unit.busy is None:
            then.append((name, "adopt"))
        elif live_push and diff.change(name).live:
            then.append((name, "live"))
        else:
            then.append((name, "swap" if name in swappable else "stop_start"))
    then += [(n, "add") for n in diff.added]
    return ReloadSteps(tuple(first), tuple(then))
