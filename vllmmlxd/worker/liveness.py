"""Is the engine thread alive? A pure decision over its stats, and the one place that reads
the threshold.

A worker whose HTTP side answers while its engine thread is stuck (a hung Metal call, a
deadlock) would look healthy to a plain ping; requests would queue forever. So /health says
``degraded`` (503) when there is work but no step has completed for ``stuck_after`` seconds.
"""

from __future__ import annotations

import os

from ..engine.types import EngineStats

ENV_STUCK_AFTER = "VLLMMLXD_STUCK_AFTER_S"
# A step is one decode plus a bounded prefill chunk: well under a second on a served model,
# seconds for a big prompt chunk on a CPU. A minute without one while requests wait is stuck.
DEFAULT_STUCK_AFTER_S = 60.0

OK = "ok"
DEGRADED = "degraded"


def stuck_after_s(environ: dict[str, str] | os._Environ = os.environ) -> float:
    """The threshold: ``$VLLMMLXD_STUCK_AFTER_S`` when set to a positive number, else the default."""
    try:
        value = float(environ.get(ENV_STUCK_AFTER, ""))
    except ValueError:
        return DEFAULT_STUCK_AFTER_S
    return value if value > 0 else DEFAULT_STUCK_AFTER_S


def engine_health(stats: EngineStats, now: float, stuck_after: float) -> tuple[str, float | None]:
    """``(ok, None)``, or ``(degraded, seconds since the last step)`` when work waits on a silent engine.

    ``now`` is ``time.monotonic()``, the clock the engine thread stamps ``last_step_at`` with.
    """
    # ``requests`` holds every admitted request until it ends: it also covers a first step,
    # before the engine thread has counted the request as running.
    busy = stats.num_running > 0 or stats.num_waiting > 0 or len(stats.requests) > 0
    silent = now - stats.last_step_at
    if busy and silent > stuck_after:
        return DEGRADED, round(silent, 1)
    # A distributed entry's rank 0 exchanges a frame every few seconds even when idle: a silence
    # means a rank hangs (a stopped Mac, a blocked link), busy or not.
    if stats.last_frame_at is not None and now - stats.last_frame_at > stuck_after:
        return DEGRADED, round(now - stats.last_frame_at, 1)
    return OK, None
