"""Worker states, as ``vllmmlxctl status`` shows them, and the exit codes the daemon reads. Dependency-free."""

from __future__ import annotations

from typing import Literal

State = Literal["starting", "ready", "draining", "backoff", "failed", "stopped"]

STARTING: State = "starting"  # spawned, loading its model, not yet answering /health
READY: State = "ready"  # answered its health check; serving
DRAINING: State = "draining"  # told to stop; finishing in-flight requests
BACKOFF: State = "backoff"  # crashed; waiting before the next start
FAILED: State = "failed"  # crashed too often too fast, or could not load; waits for a reload, start or restart
STOPPED: State = "stopped"  # stopped on purpose

ALL: tuple[State, ...] = (STARTING, READY, DRAINING, BACKOFF, FAILED, STOPPED)

# What status shows beyond a slot's phase. A lazy model: ``loading`` (starting), ``idle`` (ready, no
# request running or waiting: it may be unloaded), ``unloaded`` (stopped until a request needs it).
# An upstream entry: ``ready`` or ``unreachable`` (its host's /health does not answer 200).
# An entry with ``download: true`` whose model is not here yet: ``downloading`` until its pull ends.
Shown = Literal[
    "starting",
    "ready",
    "draining",
    "backoff",
    "failed",
    "stopped",
    "loading",
    "idle",
    "unloaded",
    "unreachable",
    "downloading",
]
LOADING: Shown = "loading"
IDLE: Shown = "idle"
UNLOADED: Shown = "unloaded"
UNREACHABLE: Shown = "unreachable"
DOWNLOADING: Shown = "downloading"
SHOWN: tuple[Shown, ...] = (*ALL, LOADING, IDLE, UNLOADED, UNREACHABLE, DOWNLOADING)

# The worker's exit code when its model cannot be loaded (vllmmlxd/worker/main.py's EXIT_LOAD_FAILED;
# a unit test keeps the two equal). Retrying cannot help, so the model is failed at once.
EXIT_LOAD_FAILED = 3
