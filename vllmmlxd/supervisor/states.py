"""Worker states, as ``vllmmlxctl status`` shows them. Dependency-free."""

from __future__ import annotations

from typing import Literal

State = Literal["starting", "ready", "draining", "backoff", "failed", "stopped"]

STARTING: State = "starting"  # spawned, loading its model, not yet answering /health
READY: State = "ready"  # answered its health check; serving
DRAINING: State = "draining"  # told to stop; finishing in-flight requests
BACKOFF: State = "backoff"  # crashed; waiting before the next start
FAILED: State = "failed"  # crashed too often too fast; waits for a reload, start or restart
STOPPED: State = "stopped"  # stopped on purpose

ALL: tuple[State, ...] = (STARTING, READY, DRAINING, BACKOFF, FAILED, STOPPED)
