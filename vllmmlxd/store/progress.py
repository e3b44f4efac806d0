"""A download's speed and time left, from its recent progress. Pure.

The rate is measured over the last few seconds only: a pull that resumed with most of its bytes
already on disk, or a connection that stalled a minute ago, must not skew what it shows now.
"""

from __future__ import annotations

from collections import deque

WINDOW_S = 10.0


class Rate:
    """Bytes per second over the last ``window_s`` seconds of (time, bytes done) samples."""

    def __init__(self, window_s: float = WINDOW_S):
        self.window_s = window_s
        self._samples: deque[tuple[float, int]] = deque()

    def add(self, at: float, done: int) -> None:
        """A sample: ``done`` bytes at monotonic time ``at``."""
        if self._samples and (done < self._samples[-1][1] or at < self._samples[-1][0]):
            self._samples.clear()  # a file restarted from zero, or a new child's clock: earlier samples say nothing now
        self._samples.append((at, done))
        while len(self._samples) > 2 and at - self._samples[1][0] >= self.window_s:
            self._samples.popleft()

    def per_s(self) -> float | None:
        """The rate, or None before two samples half a second apart."""
        if len(self._samples) < 2:
            return None
        (t0, b0), (t1, b1) = self._samples[0], self._samples[-1]
        return (b1 - b0) / (t1 - t0) if t1 - t0 >= 0.5 else None


def eta_s(done: int, total: int | None, per_s: float | None) -> float | None:
    """Seconds left at ``per_s``, or None when the total or a rate is not known yet."""
    if total is None or per_s is None or per_s <= 0:
        return None
    return max(total - done, 0) / per_s


def percent(done: int, total: int | None) -> float | None:
    """``done`` of ``total`` in percent, one decimal (None when the total is not known)."""
    if not total:
        return None if total is None else 100.0
    return round(min(done, total) * 100 / total, 1)
