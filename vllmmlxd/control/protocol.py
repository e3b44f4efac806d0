"""The control API's wire models, shared by the daemon's server and ``vllmmlxctl``.

Models allow extra keys: a newer daemon may add fields, and an older ``vllmmlxctl``
keeps them in ``--json`` output instead of failing. ``ControlTarget`` is what the
server needs from the supervisor.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol

from pydantic import BaseModel, ConfigDict

from vllmmlxd.config.loading import DEFAULT_LOAD
from vllmmlxd.paths import resolve_state_dir

if TYPE_CHECKING:  # the ctl imports this module: it stays free of the store's code
    from vllmmlxd.store.sources import Source

# A model's state as the supervisor reports it (supervisor/states.py; a test keeps the two equal).
State = Literal[
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

ENV_SOCKET = "VLLMMLXD_SOCKET"
SOCKET_NAME = "control.sock"


class _Wire(BaseModel):
    model_config = ConfigDict(extra="allow")


class ReloadResult(_Wire):
    """How the last reload went; ``at`` is unix time."""

    ok: bool
    at: float
    error: str | None = None
    plan: str | None = None


class DaemonStatus(_Wire):
    pid: int
    uptime_s: float
    config_path: str
    config_hash: str
    last_reload: ReloadResult | None = None
    version: str
    config_missing: bool = False  # the config file was deleted: the running config stays until it is back


class McpServerStatus(_Wire):
    """One MCP server of a model's worker, as the worker reports it."""

    name: str
    transport: str
    state: str  # starting, ready, failed, disabled, stopped
    tools: int = 0
    last_error: str | None = None  # why it last failed (kept after it recovers)
    connects: int = 0  # successful connections: more than one means it was restarted


class RankStatus(_Wire):
    """One rank of a distributed entry."""

    rank: int
    host: str
    pid: int | None = None
    state: str
    share: str | None = None  # the part of the model it holds: "layers 15-29 of 30", "heads 6 of 9"
    step_ms: float | None = None  # its last batch step
    wait_ms: float | None = None  # the others: their last wait for rank 0's frame


class PullStatus(_Wire):
    """One pull of a model into the store (``POST /store/pulls``), as it stands."""

    id: str
    repo: str  # org/name
    revision: str | None = None  # as asked; None: the repo's default branch
    state: str  # queued, resolving, downloading, verifying, installing, then done, failed or cancelled
    commit: str | None = None  # the commit the revision was at
    total_bytes: int | None = None  # of the files it downloads (known once the hub listed them)
    done_bytes: int = 0  # on disk, with what an interrupted pull had finished
    files: int | None = None
    percent: float | None = None
    bytes_per_s: float | None = None  # over the last few seconds
    eta_s: float | None = None
    started_at: float = 0.0  # unix time
    ended_at: float | None = None
    error: str | None = None  # why it failed
    refused: bool = False  # refused before downloading anything (not an MLX folder, not enough disk)
    missing: bool = False  # the hub has no such repo or revision
    path: str | None = None  # the store's folder, once installed
    already: bool = False  # that commit was in the store already: nothing was downloaded


class PullRequest(_Wire):
    """``POST /store/pulls``: a repo id (``org/name``) or a hub URL, and a revision (default branch if none)."""

    source: str
    revision: str | None = None


class PullsResponse(_Wire):
    pulls: list[PullStatus]


class StoredModelStatus(_Wire):
    """One model in the store (``GET /store``)."""

    name: str  # what `vllmmlxctl rm` takes; for a pulled repo or a builtin, what `model:` takes
    kind: str  # pulled, builtin, gguf, partial (an interrupted pull's files), other
    source: str
    path: str
    size_bytes: int
    revision: str | None = None
    commit: str | None = None
    created: str | None = None
    used_by: list[str] = []  # the running config's entries that load it


class StoreResponse(_Wire):
    path: str  # the models dir
    free_bytes: int | None = None  # on its disk
    models: list[StoredModelStatus]
    pulls: list[PullStatus] = []  # running ones


class ModelStatus(_Wire):
    """One model entry's worker as the supervisor sees it."""

    name: str
    state: State
    pid: int | None = None
    host: str
    port: int
    restarts: int = 0
    uptime_s: float | None = None
    last_exit_code: int | None = None
    served_model_name: str
    last_error: str | None = None  # the worker's last stderr lines when it failed
    keys: list[str] | None = None  # names of the keys that may use it (never the keys); None: open to anyone
    # What the running worker reports of itself (None until it is ready).
    blas: str | None = None  # mkl, openblas, bundled, accelerate, or a library's file name
    blas_path: str | None = None
    blas_warning: str | None = None  # why it is not on the BLAS it was asked for
    threads: int | None = None
    cpus: str | None = None  # the cores it runs on, as 0-3,6
    running: int | None = None  # requests being generated
    waiting: int | None = None  # requests queued for the engine
    tokens_per_s: float | None = None  # generated over the last few seconds, all requests together
    cache_mb: float | None = None  # the prefix cache's use...
    cache_budget_mb: float | None = None  # ...against its budget
    # The KV budget of running requests: budget_mb, reserved_mb, held_mb, running, waiting (for room).
    kv: dict | None = None
    cache_disk_mb: float | None = None  # its disk tier's use (None: no disk tier)...
    cache_disk_budget_mb: float | None = None  # ...against its budget
    embedding_model: str | None = None  # the embedding model it serves on /v1/embeddings, if any
    embedding_requests: int | None = None  # embedding requests answered
    embedding_inputs: int | None = None  # inputs embedded
    vision: bool | None = None  # a vision model: it takes images
    speculative: dict | None = None  # speculative decoding: method, drafted and accepted tokens (None: off)
    mcp: list[McpServerStatus] | None = None  # its MCP servers (None: none, or an older daemon)
    load: str = DEFAULT_LOAD  # eager, or lazy: loaded on demand (text: a newer daemon may add a mode)
    idle_unload_s: float | None = None  # a lazy model is unloaded after this long without a request
    idle_s: float | None = None  # how long it has had no request (lazy models)
    upstream: str | None = None  # served by another host's daemon at this URL
    group: str | None = None  # the replica set it belongs to: the gateway answers that name too
    distributed: dict | None = None  # split over ranks: backend, parallel, world
    ranks: list[RankStatus] | None = None
    download: PullStatus | None = None  # state downloading (download: true): the pull it waits for


class GatewayStatus(_Wire):
    """The gateway process: one address for every model."""

    state: str
    pid: int | None = None
    host: str
    port: int
    restarts: int = 0
    uptime_s: float | None = None
    last_error: str | None = None
    ui: bool = True
    version: int = 0  # of the routing table it was last given


class GroupMemberStatus(_Wire):
    name: str
    state: str
    running: int | None = None  # requests its worker generates (None: an upstream, or no worker)
    waiting: int | None = None  # requests its worker queues


class GroupStatus(_Wire):
    """A replica set: entries the gateway answers under one name."""

    name: str
    state: str  # ready while a member is
    members: list[GroupMemberStatus]


class StatusResponse(_Wire):
    daemon: DaemonStatus
    models: list[ModelStatus]
    gateway: GatewayStatus | None = None
    groups: list[GroupStatus] = []  # none from an older daemon
    pulls: list[PullStatus] = []  # running and recently ended pulls into the model store


class ReloadResponse(_Wire):
    ok: bool
    dry_run: bool
    plan: str
    error: str | None = None  # a config error names FILE:LINE:COL
    config_path: str | None = None  # the file previewed (``file``); None: the daemon's own config
    entries: list[dict] = []  # per entry: {name, kind (added, apply live, new worker...), keys, forcing}


class ActionResponse(_Wire):
    ok: bool
    name: str
    message: str


class LogsResponse(_Wire):
    lines: list[str]


class ErrorResponse(_Wire):
    error: str


class UsageRow(_Wire):
    """One key's use of one model entry over the asked period (key ``""``: an open entry's callers)."""

    key: str
    model: str
    requests: int
    errors: int
    input_tokens: int  # every prompt token, cached ones included
    cached_tokens: int
    output_tokens: int


class BudgetStatus(_Wire):
    """A key with a budget: its limits (0: none), its use this day and month, and what is left."""

    key: str
    tokens_per_day: int
    tokens_per_month: int
    requests_per_day: int
    day_tokens: int
    month_tokens: int
    day_requests: int
    left: dict[str, int | None]
    day_resets: str  # local time, ISO 8601 with its offset
    month_resets: str


class UsageResponse(_Wire):
    since_s: float  # the period's length, ending now
    rows: list[UsageRow]
    budgets: list[BudgetStatus] = []


class ControlTarget(Protocol):
    """What the control server asks of the supervisor. Unknown names raise ``KeyError(name)``."""

    def status(self) -> StatusResponse: ...

    async def refresh(self) -> None:
        """Update the workers' live figures that ``status`` reports."""
        ...

    async def reload(self, dry_run: bool = False, file: str | None = None) -> ReloadResponse:
        """Apply the config file (or only show what would change); ``file``: preview another file (dry runs)."""
        ...

    async def restart(self, name: str) -> ActionResponse: ...

    async def stop(self, name: str) -> ActionResponse: ...

    async def start(self, name: str) -> ActionResponse: ...

    async def load(self, name: str) -> ActionResponse:
        """Make a model serve (a lazy one loads, idle lazy ones unloaded for room); answered once ready, or why not."""
        ...

    def logs(self, name: str, lines: int) -> list[str]:
        """The last ``lines`` stderr lines of that model's worker(s)."""
        ...

    def follow(self, name: str) -> AsyncIterator[str]:
        """New stderr lines of that model's worker(s) as they come."""
        ...

    async def pull(self, source: Source) -> PullStatus:
        """Start pulling ``source`` into the store, or join the pull of it under way (``StoreError``:
        one under way pulls another revision)."""
        ...

    def pulls(self) -> list[PullStatus]:
        """Running and recently ended pulls."""
        ...

    def pull_status(self, pull_id: str) -> PullStatus:
        """One pull (``KeyError`` when unknown)."""
        ...

    def follow_pull(self, pull_id: str) -> AsyncIterator[PullStatus]:
        """A pull now and at each change, ending with its final state (``KeyError`` when unknown)."""
        ...

    async def cancel_pull(self, pull_id: str) -> PullStatus:
        """Stop a running pull (the files it finished stay for the next); ``KeyError`` when unknown."""
        ...

    async def store(self) -> StoreResponse:
        """What the store holds, with the entries that use each model."""
        ...

    async def usage(self, since_s: float) -> UsageResponse:
        """Each key's use of each model over the last ``since_s`` seconds, and the budgets' state."""
        ...

    async def remove(self, name: str) -> ActionResponse:
        """Delete a model from the store; ``StoreError`` when it is in use or being pulled (``NotInStore``: no such)."""
        ...


def control_socket_path(
    control_socket: str | os.PathLike[str] | None = None,
    state_dir: str | os.PathLike[str] | None = None,
) -> Path:
    """Where the control socket lives: the config's ``daemon.control_socket``, else ``<state dir>/control.sock``.

    The daemon and ``vllmmlxctl`` both call this, so they agree on the default.
    """
    if control_socket:
        return Path(control_socket).expanduser()
    return resolve_state_dir(state_dir) / SOCKET_NAME
