"""Test-only fault injection, armed by an environment variable and off the hot path.

``VLLMMLXD_TEST_STALL_ENGINE_S=N`` makes the engine thread's first step sleep N seconds, so
an integration test can watch a real worker report a stalled engine. Unset (always, outside
tests), nothing is installed.
"""

from __future__ import annotations

import os
import time

ENV_STALL = "VLLMMLXD_TEST_STALL_ENGINE_S"


def install_test_hooks(engine: object) -> None:
    """A one-time sleep before the engine's first step when the test variable is set."""
    seconds = float(os.environ.get(ENV_STALL) or 0)
    before_each_step = getattr(engine, "before_each_step", None)
    if seconds <= 0 or before_each_step is None:
        return
    stalled: list[bool] = []

    def stall_once() -> None:
        if not stalled:
            stalled.append(True)
            time.sleep(seconds)

    before_each_step(stall_once)
