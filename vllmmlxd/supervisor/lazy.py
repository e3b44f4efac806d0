"""Lazy models: when an idle one is unloaded, and which idle ones go to make room for a load. Pure.

A lazy model starts on the first request that needs it. Loading one must not push the
machine past the daemon's memory admission: the models holding memory (ready, loading,
swapping) plus the new one must fit in the usable memory. If they do not, idle lazy models
(ready, nothing running or waiting) are unloaded, the least recently used first, until it
fits; if it still does not, the load is refused with the numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

from .memory import mb


@dataclass(frozen=True)
class Resident:
    """A model holding memory: ``idle_s`` is how long it has had no request, None when it may not be
    unloaded for room (an eager model, a busy one, one loading)."""

    name: str
    total_mb: int
    idle_s: float | None = None


@dataclass(frozen=True)
class Room:
    fits: bool
    evict: tuple[str, ...] = ()  # unload these first, in this order
    message: str = ""


def make_room(name: str, need_mb: int, usable_mb: int | None, resident: list[Resident]) -> Room:
    """Which idle lazy models to unload (least recently used first) so that ``name`` fits."""
    if usable_mb is None:  # memory unknown: not checked, as at start-up
        return Room(True)
    in_use = sum(r.total_mb for r in resident)
    free = usable_mb - in_use
    evict: list[str] = []
    for victim in sorted((r for r in resident if r.idle_s is not None), key=lambda r: -(r.idle_s or 0.0)):
        if free >= need_mb:
            break
        evict.append(victim.name)
        free += victim.total_mb
    if free >= need_mb:
        return Room(True, tuple(evict))
    held = ", ".join(f"{r.name} {mb(r.total_mb)}{'' if r.idle_s is not None else ' (busy or eager)'}" for r in resident)
    return Room(
        False,
        message=(
            f"not enough memory to load {name}: it needs {mb(need_mb)}, {mb(max(usable_mb - in_use, 0))} of "
            f"{mb(usable_mb)} usable are free (in use: {held or 'nothing'}) and no idle lazy model is left to unload; "
            "retry when a model is idle, or stop one (vllmmlxctl stop NAME)"
        ),
    )


def idle_for(
    reported_idle_s: float | None, reported_at: float | None, now: float, expected_until: float = 0.0
) -> float | None:
    """How long a worker has been idle now, from its last report (None: unknown or busy).

    ``expected_until``: a client turned away while the model loaded was told to retry by then
    (Retry-After); until it has had that chance the model is not idle, so neither the idle
    unloader nor another model's load takes it away from under the request that asked for it.
    """
    if reported_idle_s is None or reported_at is None or reported_idle_s <= 0 or now < expected_until:
        return None
    return reported_idle_s + max(now - reported_at, 0.0)


def should_unload(idle_s: float | None, idle_unload_s: float | None) -> bool:
    return idle_s is not None and idle_unload_s is not None and idle_s >= idle_unload_s
