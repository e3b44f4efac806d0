"""What an engine step did, and the features that take part in it through one small interface.

The scheduler's step (``Scheduler._step``) is the same for every model: size the prompt chunk,
let each hook do its part before the pass, run the pass (``batch.Batch.advance``), let each hook
read the results, hand the tokens out, let each hook see where the rows stand. The optional
features are hooks, present only where the entry has them: speculation's step costs and
counts, prompt chunks riding on the decode pass, a layered model's captures for the prefix
cache, a vision model's staged prompts (``staged_prompts.StagedPrompts``). The step itself
never asks which are there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from mlx_lm.generate import BatchGenerator

from ..batch.batch_rows import row_layers
from ..batch.mlxlm import prompt_batch
from ..batch.row_groups import GroupedModel, RidingPrompts
from ..speculation.speculative import RowDrafting, SpeculativeBatch
from .sequence import Sequence


@dataclass
class StepWork:
    """One step, filled in as it goes: the hooks read it and add to it."""

    chunk: int  # the prompt chunk of this step's pass
    started: float
    prompt_responses: list[Any] = field(default_factory=list)
    responses: list[Any] = field(default_factory=list)
    prefilled: int = 0  # prompt tokens whose progress shows after this step
    ran: int = 0  # prompt tokens this step's pass computed (what the step timer learns from)
    timed: bool = True  # whether the step says what a pass costs (a vision tower's step does not)
    prompts_left: bool = False  # prompts still staged outside the batch after it
    progress: list[tuple[Sequence, int]] = field(default_factory=list)  # staged prompts' new positions

    @property
    def alone(self) -> bool:
        """A plain decode step: no prompt work, no row finished."""
        finished = any(r.finish_reason is not None for r in self.responses)
        return not (self.prefilled or self.prompt_responses or self.prompts_left or finished)


class StepHook:
    """A feature's part in each step (each method a no-op unless the feature has work there)."""

    def before(self, work: StepWork) -> None:
        """Before the pass, on the engine's stream."""

    def after(self, work: StepWork) -> None:
        """The pass's results are in; its tokens are not handed out yet."""

    def settled(self, running: dict[int, Sequence]) -> None:
        """The tokens are handed out; ``running``: the rows still in the batch."""

    def joined(self, uid: int, seq: Sequence) -> None:
        """``seq`` joined the batch as row ``uid``."""

    def left(self, seq: Sequence) -> None:
        """``seq`` is done (finished, cancelled or failed)."""

    def kv_bytes(self) -> int:
        """KV this feature holds outside the batch's own caches."""
        return 0


def nbytes(cache: list[Any] | None) -> int:
    return sum(c.nbytes for c in cache or ())


class DraftCounts(StepHook):
    """Speculation: each step's cost, timed from one step's start to the next (``StepCosts``), and
    each request's drafted and accepted tokens for /v1/status."""

    def __init__(self, spec: Any):
        self.spec = spec

    def before(self, work: StepWork) -> None:
        self.spec.costs.lap(work.started)

    def after(self, work: StepWork) -> None:
        self.spec.costs.ended(alone=work.alone)

    def settled(self, running: dict[int, Sequence]) -> None:
        for uid, seq in running.items():
            row = self.spec.rows.get(uid)
            if row is not None:
                seq.progress.drafted_tokens, seq.progress.accepted_tokens = row.drafted, row.accepted

    def joined(self, uid: int, seq: Sequence) -> None:
        predicted = seq.request.prediction
        self.spec.rows[uid] = RowDrafting(
            enabled=seq.request.sampling.speculative or predicted is not None,
            prediction=np.asarray(predicted, np.int64) if predicted else None,
            prompt_len=len(seq.prompt),
        )

    def left(self, seq: Sequence) -> None:
        row = self.spec.rows.pop(seq.uid, None) if seq.uid is not None else None
        if row is not None:
            seq.progress.drafted_tokens, seq.progress.accepted_tokens = row.drafted, row.accepted

    def kv_bytes(self) -> int:
        return sum(nbytes(row.draft_cache) for row in self.spec.rows.values())  # a draft model's own KV


class RidingChunks(StepHook):
    """A prompt chunk riding on the decode pass runs one step after its progress shows: the step
    timer is told what each pass really computed."""

    def __init__(self, gen: Callable[[], BatchGenerator]):
        self._gen = gen

    def _parts(self) -> tuple[GroupedModel, RidingPrompts] | None:
        gen = self._gen()
        model, prompts = gen.model, prompt_batch(gen)
        if isinstance(model, GroupedModel) and isinstance(prompts, RidingPrompts):
            return model, prompts
        return None

    def before(self, work: StepWork) -> None:
        parts = self._parts()
        if parts is not None:
            parts[0].rode = parts[1].deferred = 0

    def after(self, work: StepWork) -> None:
        parts = self._parts()
        if parts is not None:
            work.ran += parts[0].rode - parts[1].deferred


class LayeredCaptures(StepHook):
    """A layered model's prefix cache keeps what windowed and recurrent layers held on a
    sequence's way (``checkpoints.Captures``): read from the rows after each prefill chunk, and
    from a long answer's windowed layers every so often: at most the window less a block apart
    (so each block is whole in the window at one of these reads), less what one step may add
    beyond a token (a speculating step keeps up to its drafts and one more)."""

    def __init__(
        self,
        layered: Any,
        gen: Callable[[], BatchGenerator],
        running: dict[int, Sequence],
        spec: SpeculativeBatch | None,
    ):
        step_tokens = spec.step_tokens if spec is not None else 1
        self.layered, self._gen, self._running = layered, gen, running
        windows = [layered.cache_layout.layers[i].window or 0 for i in layered.windows]
        block = layered.block
        self._every = max(1, min(windows) - block - (step_tokens - 1)) if windows else 0

    def after(self, work: StepWork) -> None:
        layered = self.layered
        for response in work.prompt_responses:
            seq = self._running.get(response.uid)
            if seq is None or seq.captures is None:
                continue
            got = row_layers(self._gen(), response.uid, (*layered.windows, *layered.states))
            if got is not None:
                layered.capture(got[1], got[0], seq.captures)

    def settled(self, running: dict[int, Sequence]) -> None:
        if not self._every:
            return
        for uid, seq in running.items():
            captures = seq.captures
            if captures is None or seq.produced - captures.windows_at < self._every:
                continue
            if seq.progress.first_token_at is None:
                continue
            got = row_layers(self._gen(), uid, self.layered.windows)
            if got is not None:
                captures.windows_at = seq.produced
                self.layered.capture_windows(got[1], seq.captures)
