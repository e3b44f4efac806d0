"""A vision model's prompts with images left to prefill, as the step's hook: before each pass a
chunk of each (``vision.vision_prefill``), and the prompts done join the batch."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import mlx.core as mx

from ..vision.vision_prefill import EmbeddingPrefill, Staged
from .sequence import Sequence
from .step_hooks import StepHook, StepWork, nbytes


class StagedPrompts(StepHook):
    """The step's part for a vision model: before each pass, a chunk of every staged prompt (the
    step timer's share of a prefilling sequence), or, for one of them at most, an image through
    the vision tower; those done join the batch (``join``), one that fails is ended (``fail``).
    ``staged`` is the scheduler's list, changed here on the engine thread only."""

    def __init__(
        self,
        prefill: EmbeddingPrefill,
        staged: list[Staged],
        stream: Callable[[], Any],
        join: Callable[[Staged], None],
        fail: Callable[[Sequence, Exception], None],
    ):
        self.prefill, self.staged, self._stream = prefill, staged, stream
        self._join, self._fail = join, fail

    def before(self, work: StepWork) -> None:
        tower = False
        with mx.stream(self._stream()):
            for staged in list(self.staged):
                try:
                    done, ran = self.prefill.advance(staged, work.chunk, tower=not tower)
                    tower = tower or ran
                    work.prefilled += done
                    work.progress.append((staged.seq, staged.pos))
                    if staged.pos >= staged.end:
                        self.staged.remove(staged)
                        self._join(staged)
                except Exception as exc:  # one bad image must not take the batch down
                    if staged in self.staged:
                        self.staged.remove(staged)
                    self._fail(staged.seq, exc)
        work.timed = not tower  # a vision tower's step says nothing of what a decode step or a chunk costs
        work.prompts_left = bool(self.staged)

    def kv_bytes(self) -> int:
        return sum(nbytes(staged.cache) for staged in self.staged)
