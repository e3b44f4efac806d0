"""A stand-in for an ``mx.distributed.Group``: its rank and size, for code that only asks those."""

from __future__ import annotations


class StandInGroup:
    def __init__(self, rank: int, size: int):
        self._rank, self._size = rank, size

    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size
