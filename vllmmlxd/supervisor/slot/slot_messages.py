"""What a slot's actor receives: one frozen dataclass per message, handled by ``match``.

Calls carry their caller's future. Commands (start, stop, a reload's replace, live settings...)
are decided by ``transitions.decide`` as the event they carry; news about a worker (ready,
exited, start timeout...) is turned into an event by the actor, which knows whether that
worker is still its own.
"""

from __future__ import annotations

import asyncio
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ...runtime.cpus import CpuShare
from .process import UnitConfig, WorkerProcess
from .slot_news import Waits
from .transitions import Event
from .tuning import Tuning


@dataclass(frozen=True, kw_only=True)
class Call:
    """A message whose sender waits for the answer."""

    future: asyncio.Future[Any]


@dataclass(frozen=True, kw_only=True)
class Command(Call):
    """start, stop, restart, load, unload, shutdown: the caller waits for the outcome ``waits`` names."""

    event: Event
    waits: Waits | None


@dataclass(frozen=True, kw_only=True)
class Replace(Command):
    """A reload's swap to ``config`` on ``share``'s cores; ``sock``: a listening socket handed over."""

    config: UnitConfig
    share: CpuShare | None
    sock: socket.socket | None


@dataclass(frozen=True, kw_only=True)
class ApplySettings(Command):
    """Live settings: pushed to the running worker, or kept for the next one."""

    config: UnitConfig
    sock: socket.socket | None


@dataclass(frozen=True, kw_only=True)
class ReleaseSocket(Call):
    """Hand the listening socket over (the slot is stopped)."""


@dataclass(frozen=True)
class Open:
    """A lazy model's slot binds its address now, so its stand-in answers there."""


@dataclass(frozen=True)
class Close:
    """The actor ends (after a shutdown)."""


@dataclass(frozen=True)
class SlotSettings:
    """What the slot's workers start with, beside their config (a reload may change them)."""

    state_dir: Path
    drain_timeout: float
    log_level: str
    tuning: Tuning = field(default_factory=Tuning)


@dataclass(frozen=True)
class UseSettings:
    settings: SlotSettings


@dataclass(frozen=True)
class PlanShare:
    share: CpuShare | None


@dataclass(frozen=True)
class TurnedAway:
    """The stand-in told a client to come back: a request is expected until ``until`` (monotonic)."""

    until: float


@dataclass(frozen=True)
class Listening:
    """A starting worker is about to accept on the socket: the stand-in steps aside."""

    worker: WorkerProcess


@dataclass(frozen=True)
class WorkerNews:
    kind: Literal["worker_ready", "start_timeout", "health_failed"]
    worker: WorkerProcess


@dataclass(frozen=True)
class WorkerExited:
    worker: WorkerProcess


@dataclass(frozen=True)
class BackoffElapsed:
    token: int  # the timer's: a later command's token makes an older timer moot


@dataclass(frozen=True)
class FollowUp:
    """An event the actor raised itself (a spawn that failed: decided as a crash)."""

    event: Event


News = (
    Open
    | Close
    | UseSettings
    | PlanShare
    | TurnedAway
    | Listening
    | WorkerNews
    | WorkerExited
    | BackoffElapsed
    | FollowUp
)
SlotMsg = Command | ReleaseSocket | News
