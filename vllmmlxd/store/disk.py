"""Disk admission for a pull, and bytes as people read them. Pure: the free space is read by the caller.

A pull is refused before it downloads anything when what it still has to fetch does not fit the
free space of the disk it writes to, less a reserve kept free for everything else on it.
"""

from __future__ import annotations

from dataclasses import dataclass

GB = 1000**3
# Kept free beside a pull: a full disk breaks more than the download (logs, the state dir's sockets).
DISK_RESERVE_BYTES = 1 * GB


def format_bytes(n: int | float | None) -> str:
    """``512 B``, ``3.4 kB``, ``12.5 MB``, ``4.27 GB``: decimal units, as the hub shows sizes."""
    if n is None:
        return "?"
    n = float(n)
    for unit, size in (("TB", 1000**4), ("GB", GB), ("MB", 1000**2), ("kB", 1000)):
        if abs(n) >= size:
            value = n / size
            return f"{value:.2f} {unit}" if value < 10 else f"{value:.1f} {unit}"
    return f"{int(n)} B"


@dataclass(frozen=True)
class DiskNeed:
    """What a pull still has to write, and where."""

    need_bytes: int  # the files not downloaded yet
    files: int  # how many files that is
    have_bytes: int  # finished by an earlier, interrupted pull (kept)
    free_bytes: int  # free on the disk it writes to
    where: str  # that folder
    reserved_bytes: int = 0  # what other pulls running now still have to write there


def refusal(repo: str, disk: DiskNeed, reserve: int = DISK_RESERVE_BYTES) -> str | None:
    """Why ``repo``'s pull does not fit (with the numbers), or None when it does."""
    room = disk.free_bytes - reserve - disk.reserved_bytes
    if disk.need_bytes <= room:
        return None
    others = f", {format_bytes(disk.reserved_bytes)} is promised to pulls running now" if disk.reserved_bytes else ""
    have = f" ({format_bytes(disk.have_bytes)} already downloaded)" if disk.have_bytes else ""
    short = disk.need_bytes - max(room, 0)
    return (
        f"not enough disk space to pull {repo}: it needs {format_bytes(disk.need_bytes)} more in "
        f"{disk.files} file{'' if disk.files == 1 else 's'}{have}; {disk.where} has "
        f"{format_bytes(disk.free_bytes)} free, of which {format_bytes(reserve)} is kept free{others}: "
        f"free {format_bytes(short)} or more and pull again"
    )
