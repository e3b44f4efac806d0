"""Durations, clock times and aligned tables, as vllmmlxctl prints them. Pure functions."""

from __future__ import annotations

import time
from collections.abc import Sequence


def format_duration(seconds: float | None) -> str:
    """``45s``, ``3m12s``, ``2h05m``, ``3d04h``; ``-`` for None."""
    if seconds is None:
        return "-"
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def format_clock(at: float, now: float | None = None) -> str:
    """Local ``HH:MM:SS`` for a time today, with the date in front for any other day."""
    when = time.localtime(at)
    today = time.localtime(time.time() if now is None else now)
    if when[:3] == today[:3]:
        return time.strftime("%H:%M:%S", when)
    return time.strftime("%Y-%m-%d %H:%M:%S", when)


def render_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Left-aligned columns two spaces apart, with no trailing spaces."""
    widths = [max(len(str(row[i])) for row in (headers, *rows)) for i in range(len(headers))]
    return "\n".join("  ".join(str(cell).ljust(w) for cell, w in zip(row, widths)).rstrip() for row in (headers, *rows))
