"""A pull's progress as ``vllmmlxctl pull`` shows it: one bar redrawn in place on a terminal; plain
lines elsewhere (a pipe, a log), one at each change of step and at most one every few seconds between."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TextIO

from vllmmlxd.control.protocol import PullStatus
from vllmmlxd.ctl.render import pull_progress, render_pull_bar

PLAIN_EVERY_S = 5.0


class PullProgress:
    """Shows each status of a pull it is given; ``close()`` once the pull has ended (or on Ctrl-C)."""

    def __init__(self, out: TextIO, tty: bool, width: int = 80, clock: Callable[[], float] = time.monotonic):
        self.out, self.tty, self.width, self.clock = out, tty, width, clock
        self._drawn = 0  # the bar's length on the terminal now
        self._last: tuple[str, float] | None = None  # the plain line's step, and when it was written

    def show(self, p: PullStatus) -> None:
        if p.state in ("done", "failed", "cancelled"):
            return  # the end is said by the caller, in words
        if self.tty:
            line = render_pull_bar(p, self.width - 1)
            self.out.write("\r" + line.ljust(self._drawn))
            self._drawn = len(line)
        else:
            now = self.clock()
            if self._last is not None and self._last[0] == p.state and now - self._last[1] < PLAIN_EVERY_S:
                return
            self._last = (p.state, now)
            self.out.write(f"{p.repo}: {pull_progress(p)}\n")
        self.out.flush()

    def close(self) -> None:
        """End the bar's line, so what follows starts on its own."""
        if self.tty and self._drawn:
            self.out.write("\n")
            self.out.flush()
            self._drawn = 0
