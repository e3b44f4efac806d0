"""The supervisor's operations in flight.

An operation is a task beside the supervisor's task that only drives units through their
commands; it is marked on the units it works on (``busy``) so that every later decision sees
it, and its end comes back to the task as an ``OpDone`` message. Only the supervisor's task
calls ``Operations``' methods, so ``busy`` has one writer.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from typing import Any

from ..log import log_event
from .messages import Msg, OpDone
from .plan import Busy

logger = logging.getLogger("vllmmlxd.supervisor")

Done = Callable[[Any, "BaseException | None"], None]  # runs in the task once an operation ends


@dataclasses.dataclass
class _Op:
    task: asyncio.Task
    names: tuple[str, ...]
    done: Done | None


class Operations:
    """What runs beside the supervisor's task: operations on units, and short tracked tasks."""

    def __init__(self, post: Callable[[Msg], None]):
        self.busy: dict[str, tuple[Busy, int]] = {}  # unit name -> what an operation does to it, and which
        self._ops: dict[int, _Op] = {}
        self._ids = itertools.count(1)
        self._post = post
        self._tasks: set[asyncio.Task] = set()  # joins and publications: short, tracked

    def on(self, name: str) -> Busy | None:
        """What an operation is doing to ``name``, if one is."""
        return self.busy[name][0] if name in self.busy else None

    def start(self, busy: dict[str, Busy], work: Awaitable[Any], done: Done | None = None) -> None:
        """Run ``work`` with ``busy`` marked on its units; ``done`` runs in the task after it."""
        op_id = next(self._ids)
        self.busy.update({name: (what, op_id) for name, what in busy.items()})

        async def run() -> None:
            result, error = None, None
            try:
                result = await work
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                error = exc
            self._post(OpDone(op_id, result, error))

        self._ops[op_id] = _Op(asyncio.create_task(run(), name=f"op-{op_id}"), tuple(busy), done)

    def finish(self, op_id: int, result: Any, error: BaseException | None) -> None:
        """An ``OpDone`` message: unmark its units (unless a later operation took them over) and run ``done``."""
        op = self._ops.pop(op_id, None)
        if op is None:
            return
        for name in op.names:
            if self.busy.get(name, (None, None))[1] == op_id:
                del self.busy[name]
        if error is not None:
            log_event(
                logger,
                "supervisor.operation_failed",
                logging.ERROR,
                units=",".join(op.names),
                error=f"{type(error).__name__}: {error}",
            )
        if op.done is not None:
            op.done(result, error)

    def pending(self, names: Iterable[str]) -> list[asyncio.Task]:
        """The operations on these units still running: a new one on them waits for them first."""
        ids = {self.busy[n][1] for n in names if n in self.busy}
        return [self._ops[i].task for i in ids if i in self._ops]

    def track(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def cancel_all(self) -> None:
        """At shutdown: the units carry on with what was asked; their own shutdown follows it."""
        for op in list(self._ops.values()):
            op.task.cancel()
        for task in list(self._tasks):
            task.cancel()


def resolve(future: asyncio.Future | None, value: Any) -> None:
    if future is not None and not future.done():
        future.set_result(value)


def fail(future: asyncio.Future | None, exc: BaseException) -> None:
    if future is not None and not future.done():
        future.set_exception(exc)
