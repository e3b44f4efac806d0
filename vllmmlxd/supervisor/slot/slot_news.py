"""What a slot says about itself, as pure functions of what its actor knows: the log line for a
change of state, and the answers its waiting callers get when an outcome settles them."""

from __future__ import annotations

import asyncio
import logging
from typing import Literal

from .. import states

Waits = Literal["serving", "stopped"]
Waiter = tuple[asyncio.Future, Waits]
Result = tuple[bool, "str | None"]  # ok, and why not


def announcement(
    name: str,
    state: states.Shown,
    swapping: bool,
    *,
    pid: int | None,
    worker_pid: int | None,
    held_pid: int | None,
    url: str,
    exit_code: int | None,
    reason: str | None,
    retry_in_s: float | None,
) -> tuple[str, int, dict]:
    """The event name, level and fields for a slot now in ``state`` (``swapping``: a new worker loads
    beside the serving one)."""
    fields: dict = {"model": name}
    if swapping:
        return "worker.replacing", logging.INFO, fields | {"old_pid": held_pid, "pid": worker_pid}
    level = logging.INFO
    if state in (states.STARTING, states.DRAINING):
        fields["pid"] = worker_pid
    elif state == states.READY:
        fields |= {"pid": pid, "url": url}
    elif state == states.BACKOFF:
        fields |= {"exit_code": exit_code, "retry_in_s": retry_in_s}
        level = logging.WARNING
    elif state == states.FAILED:
        fields |= {"exit_code": exit_code, "reason": reason}
        level = logging.ERROR
    return f"worker.{state}", level, fields


def why_not(outcome: str, fail_reason: str | None, last_error: str | None) -> str:
    if outcome == "failed":
        return f"{fail_reason}: {last_error}" if last_error else str(fail_reason)
    return last_error or outcome


def settle(waiters: list[Waiter], outcome: str, why: str) -> tuple[list[tuple[asyncio.Future, Result]], list[Waiter]]:
    """Which waiting callers this outcome answers, with what, and who keeps waiting. ``why``: the
    outcome's reason, for callers waiting to be served that are not."""
    error = None if outcome in ("ready", "stopped", "gone", "kept") else why
    answered: list[tuple[asyncio.Future, Result]] = []
    keep: list[Waiter] = []
    for future, waits in waiters:
        if waits == "serving" and outcome != "gone":
            ok = outcome in ("ready", "kept")
            answered.append((future, (ok, error if outcome != "stopped" else "stopped before it was ready")))
        elif waits == "stopped" and outcome in ("stopped", "gone"):
            answered.append((future, (True, None)))
        else:
            keep.append((future, waits))
    return answered, keep
