"""Test-only fault injection, armed by an environment variable and off the hot path.

``VLLMMLXD_TEST_STALL_ENGINE_S=N`` makes the engine thread's first step sleep N seconds, so
an integration test can watch a real worker report a stalled engine. Unset (always, outside
tests), nothing is installed: the scheduler's code is untouched.
"""

from __future__ import annotations

import os
import time

ENV_STALL = "VLLMMLXD_TEST_STALL_ENGINE_S"


def install_test_hooks(engine: object) -> None:
    """Wrap the scheduler's step with a one-time sleep when the test variable is set."""
    seconds = float(os.environ.get(ENV_STALL) or 0)
    scheduler = getattr(engine, "_scheduler", None)
    if seconds <= 0 or scheduler is None:
        return
    step = scheduler._step
    stalled: list[bool] = []

    def stalling_step() -> None:
        if not stalled:
            stalled.append(True)
            time.sleep(seconds)
        step()

    scheduler._step = stalling_step
