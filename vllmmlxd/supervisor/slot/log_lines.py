"""One model's recent log lines: its workers' stderr and the daemon's own lines about it, kept
for `vllmmlxctl logs` and streamed to `logs -f` followers."""

from __future__ import annotations

import asyncio
import sys
from collections import deque
from collections.abc import AsyncIterator

KEPT_LINES = 1000


class LogLines:
    def __init__(self) -> None:
        self.lines: deque[str] = deque(maxlen=KEPT_LINES)
        self._followers: set[asyncio.Queue[str]] = set()

    def forward(self, line: str) -> None:
        """A worker's stderr line: written to the daemon's stderr and kept."""
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
        self.keep(line)

    def keep(self, line: str) -> None:
        self.lines.append(line)
        for q in self._followers:
            q.put_nowait(line)

    def tail(self, n: int) -> list[str]:
        return list(self.lines)[-n:] if n > 0 else []

    async def follow(self) -> AsyncIterator[str]:
        q: asyncio.Queue[str] = asyncio.Queue()
        self._followers.add(q)
        try:
            while True:
                yield await q.get()
        finally:
            self._followers.discard(q)
