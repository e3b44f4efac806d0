"""The batch: the one owner of mlx-lm's ``BatchGenerator``. Every change to it (a row joins,
leaves, is copied out) and every pass runs through here, on rank 0 and on a sharded entry's
other ranks alike.

On rank 0 the scheduler decides and calls in; each change is made at once (the prefix cache
needs a leaving row's KV before the next admission) and recorded, and ``advance`` sends the
changes with the pass's chunk as one ``StepPlan`` (``lockstep``) before it runs the pass. The
other ranks ``play`` that plan: the same changes through the same calls, then the same pass,
whose forward runs the model's collectives with rank 0. A single-process engine records
nothing.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
from mlx_lm.generate import BatchGenerator

from .plans import Lockstep
from .step_plan import Change, Drop, Extract, Finish, Join, Keep, Leave, Piece, StepPlan

Kept = dict[int, tuple[list[Any], list[int]]]  # uid -> (its KV, the tokens it holds)
PREFILL_BATCH = 8  # prompts prefilled together at most


def make_generator(model: Any, options: Any) -> BatchGenerator:
    """mlx-lm's generator for ``model`` (``options``: the engine's), the same on every rank."""
    return BatchGenerator(
        model,
        completion_batch_size=options.max_running,
        prefill_batch_size=min(options.max_running, PREFILL_BATCH),
        prefill_step_size=options.prefill_step_size,
    )


@dataclass
class RowSetup:
    """What rank 0 alone knows of a joining row: its sampling and stopping, and its cached KV."""

    segments: list[list[int]]  # the uncached prompt, split where a layered model checkpoints
    caches: list[Any] | None = None  # the KV of its cached start
    all_tokens: list[int] = field(default_factory=list)  # the tokens that KV holds
    sampler: Any = None
    processors: list[Any] | None = None
    stops: Any = None


class Batch:
    def __init__(self, gen: BatchGenerator, lockstep: Lockstep | None = None):
        self.gen = gen
        self.lockstep = lockstep or Lockstep()
        self._recording = self.lockstep.distributed
        self._changes: list[Change] = []

    # -- rank 0: decide, make the change, record it -----------------------------------------------

    def join(self, tokens: list[int], cached: int, source: tuple[int, ...], max_tokens: int, row: RowSetup) -> int:
        """A row joins: its uid."""
        uid = self._insert(row, max_tokens)
        if self._recording:  # the prompt's copy only where another rank reads it
            self._record(Join(uid, tuple(tokens), cached, source, max_tokens))
        return uid

    def leave(self, uids: list[int], *, keep: bool) -> Kept:
        got = self._remove(uids, keep)
        self._record(Leave(tuple(uids), keep))
        return got

    def extract(self, uids: list[int]) -> Kept:
        got = self.gen.extract_cache(uids)
        self._record(Extract(tuple(uids)))
        return got

    def finished(self, uids: list[int]) -> None:
        """Rows that ended in the last pass on a stop token or string (mlx-lm removed them)."""
        if uids:
            self._record(Finish(tuple(uids)))

    def kept(self, uid: int, pieces: list[Piece]) -> None:
        self._record(Keep(uid, tuple(tuple(p) for p in pieces)))  # type: ignore[misc]  # three ints each

    def dropped(self, piece: int) -> None:
        self._record(Drop(piece))

    def advance(self, chunk: int) -> tuple[list[Any], list[Any]]:
        """The pass: prompt chunks of ``chunk`` tokens and a decode step; sent to the other ranks first."""
        self.lockstep.step(self._plan(chunk))
        return self._pass(chunk)

    def idle(self) -> None:
        """Nothing to run: the other ranks hear the changes made meanwhile (and that rank 0 lives)."""
        self.lockstep.idle(self._plan(None))

    def stop(self) -> None:
        self.lockstep.stop(self._plan(None))

    def warm_up(self, chunk: int) -> float:
        """Two tokens of a one-token prompt through a pass, so the first client does not pay for
        compiling it; the seconds it took. Finished by max_tokens (on every rank alike), its KV not kept."""
        started = time.perf_counter()
        self.join([0], 0, (), 2, RowSetup([[0]]))
        while not any(r.finish_reason is not None for r in self.advance(chunk)[1]):
            pass
        mx.clear_cache()
        return time.perf_counter() - started

    def _record(self, change: Change) -> None:
        if self._recording:
            self._changes.append(change)

    def _plan(self, chunk: int | None) -> StepPlan:
        plan, self._changes = StepPlan(tuple(self._changes), chunk), []
        return plan

    # -- the calls into the generator, the same on every rank ---------------------------------------

    def _insert(self, row: RowSetup, max_tokens: int) -> int:
        (uid,) = self.gen.insert_segments(
            [row.segments],
            max_tokens=[max_tokens],
            caches=[row.caches] if row.caches is not None else None,
            all_tokens=[row.all_tokens],
            samplers=[row.sampler] if row.sampler is not None else None,
            logits_processors=[row.processors] if row.processors is not None else None,
            stop_sequences=[row.stops] if row.stops is not None else None,
        )
        return uid

    def _remove(self, uids: list[int], keep: bool) -> Kept:
        return self.gen.remove(uids, return_prompt_caches=keep) or {}

    def _pass(self, chunk: int) -> tuple[list[Any], list[Any]]:
        self.gen.prefill_step_size = chunk
        return self.gen.next()
