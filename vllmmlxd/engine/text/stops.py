"""Stop-string matching across token boundaries. Pure; no mlx.

Text that could be the start of a stop string is held back until the next piece
shows whether it is one, so a stop string never leaks into the output.
"""

from __future__ import annotations


class StopMatcher:
    """Feed decoded text pieces; get back what is safe to emit and whether a stop was hit."""

    def __init__(self, stops: tuple[str, ...] | list[str]):
        self.stops = tuple(s for s in stops if s)
        self._held = ""
        self.stopped = False
        self.matched: str | None = None  # the stop string that ended the text

    def feed(self, piece: str) -> str:
        """Add ``piece``; return the text that can be emitted now.

        After a stop string is found, ``stopped`` is True, the text before it is
        returned, and everything from the stop string on is dropped.
        """
        if self.stopped:
            return ""
        if not self.stops:
            return piece
        buf = self._held + piece
        cut = self._earliest_stop(buf)
        # A longer stop string may still complete and start before the one found: wait for it.
        undecided = len(buf) - self._partial_suffix(buf)
        if cut >= 0 and undecided >= cut:
            self._stop_at(buf, cut)
            self._held = ""
            return buf[:cut]
        self._held = buf[undecided:]
        return buf[:undecided]

    def flush(self) -> str:
        """The held-back text, once generation ends (cut at a stop string it holds)."""
        held, self._held = self._held, ""
        if self.stopped:
            return ""
        cut = self._earliest_stop(held)
        if cut >= 0:
            self._stop_at(held, cut)
            return held[:cut]
        return held

    def _stop_at(self, buf: str, cut: int) -> None:
        self.stopped = True
        # Of the stops found at the cut, the longest is the one the text really holds.
        self.matched = max((s for s in self.stops if buf.startswith(s, cut)), key=len)

    def _earliest_stop(self, buf: str) -> int:
        return min((i for i in (buf.find(s) for s in self.stops) if i >= 0), default=-1)

    def _partial_suffix(self, buf: str) -> int:
        """Length of the longest suffix of ``buf`` that is a proper prefix of a stop string."""
        best = 0
        for stop in self.stops:
            for n in range(min(len(stop) - 1, len(buf)), best, -1):
                if buf.endswith(stop[:n]):
                    best = n
                    break
        return best
