"""Why a worker ended, from its last stderr lines: what `vllmmlxctl status` and a failed reload show.

Pure. A worker's last lines before it dies are often routine (`event=blas.selected`, the
model's load starting): only warnings, errors and what is not a log line at all (a traceback,
a stray print) say why it ended.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

# A logfmt line as vllmmlxd.log writes it: an optional journald priority, an optional ts, then level.
_LEVEL = re.compile(r"^(?:<\d>)?(?:ts=\S+\s+)?level=(?P<level>\w+)")
ROUTINE_LEVELS = frozenset({"debug", "info"})
KEPT_LINES = 10


def tells_why(line: str) -> bool:
    """Whether ``line`` may say why a worker ended: any line but a debug or info log event."""
    m = _LEVEL.match(line)
    return m is None or m["level"] not in ROUTINE_LEVELS


def exit_reason(failure: str | None, lines: Iterable[str], keep: int = KEPT_LINES) -> str:
    """The supervisor's own reason (``failure``: a start timeout...) and the last ``keep`` lines
    of ``lines`` that tell why; empty when neither says anything."""
    telling = [line for line in lines if line and tells_why(line)][-keep:] if keep > 0 else []
    return "\n".join(x for x in (failure, *telling) if x)
