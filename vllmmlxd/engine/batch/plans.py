"""Where rank 0's step plans go: nowhere for a single-process engine (``Lockstep``, this base),
to the other ranks of a sharded entry (``lockstep.Leader``)."""

from __future__ import annotations

from typing import Any

from .step_plan import StepPlan

# While idle, rank 0 sends a frame this often (a lost rank is noticed while idle too), and the
# others sleep until just before the next one: MLX's ring waits for data by polling, so a rank
# waiting in a collective uses a whole core. A request arriving meanwhile waits for them to wake
# (at most this long).
IDLE_FRAME_S = 0.25


class Lockstep:
    """How rank 0's plans reach the other ranks; a single-process engine sends nothing."""

    last_frame_at: float | None = None  # monotonic: the last frame sent (liveness watches it)

    def wrap(self, model: Any) -> Any:
        return model

    def step(self, plan: StepPlan) -> None: ...
    def idle(self, plan: StepPlan) -> None: ...
    def stop(self, plan: StepPlan) -> None: ...

    @property
    def distributed(self) -> bool:
        return False

    def describe(self) -> dict | None:
        return None
