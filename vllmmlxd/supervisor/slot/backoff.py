"""When to restart a crashed worker, and when to give up. Pure."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BackoffPolicy:
    """Exponential backoff; ``max_fast_crashes`` crashes in a row, each within
    ``fast_crash_s`` of its start, mark the worker failed."""

    initial_s: float = 0.5
    factor: float = 2.0
    max_s: float = 30.0
    fast_crash_s: float = 10.0
    max_fast_crashes: int = 5

    def delay(self, consecutive_crashes: int) -> float:
        """Seconds to wait before restart number ``consecutive_crashes`` (1-based)."""
        return min(self.max_s, self.initial_s * self.factor ** max(consecutive_crashes - 1, 0))

    def next_fast_crashes(self, fast_crashes: int, ran_for_s: float) -> int:
        """The run of fast crashes after a crash that came ``ran_for_s`` after the start."""
        return fast_crashes + 1 if ran_for_s < self.fast_crash_s else 1

    def gives_up(self, fast_crashes: int) -> bool:
        return fast_crashes >= self.max_fast_crashes
