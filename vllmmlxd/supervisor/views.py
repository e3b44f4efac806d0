"""What the supervisor answers: plain data. The control API maps it to its wire models
(``control/mapping.py``, by attribute: nothing there imports the supervisor)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..store.pulls import PullView
from . import states


@dataclass(frozen=True)
class ReloadRecord:
    """How the last reload went; ``at`` is unix time."""

    ok: bool
    at: float
    error: str | None = None
    plan: str | None = None


@dataclass(frozen=True)
class ReloadReply:
    ok: bool
    dry_run: bool
    plan: str
    error: str | None = None
    config_path: str | None = None  # the file previewed (``file``); None for the daemon's own
    entries: list[dict] = field(
        default_factory=list
    )  # per entry: added, apply live, new worker... (ReloadPlan.entries)


@dataclass(frozen=True)
class ActionReply:
    ok: bool
    name: str
    message: str


@dataclass(frozen=True)
class DaemonView:
    pid: int
    uptime_s: float
    config_path: str
    config_hash: str
    last_reload: ReloadRecord | None
    version: str
    config_missing: bool = False  # the config file is gone: the running config stays


@dataclass(frozen=True)
class RankView:
    """One rank of a distributed entry."""

    rank: int
    host: str
    pid: int | None
    state: str  # ready, starting (joining or loading), exited
    share: str | None = None  # "layers 15-29 of 30", "heads 6 of 9"
    step_ms: float | None = None  # its last batch step, as rank 0 last reported
    wait_ms: float | None = None  # (the others) its last wait for rank 0's frame


@dataclass(frozen=True)
class ModelView:
    name: str
    state: states.Shown
    pid: int | None
    host: str
    port: int
    restarts: int
    uptime_s: float | None
    last_exit_code: int | None
    served_model_name: str
    last_error: str | None
    keys: list[str] | None = None  # key names allowed on the entry; None: open
    runtime: dict = field(default_factory=dict)  # blas, threads, cpus and load, as the worker reports them
    load: str = "eager"  # eager or lazy
    idle_unload_s: float | None = None
    idle_s: float | None = None  # a lazy model's time without a request
    upstream: str | None = None  # served by that host (no worker here)
    group: str | None = None  # the replica set it belongs to (config's group)
    distributed: dict | None = None  # a distributed entry: backend, parallel, world
    ranks: list[RankView] | None = None  # and each of its ranks
    download: PullView | None = None  # download: true and its model not here yet: the pull it waits for


@dataclass(frozen=True)
class GatewayView:
    state: states.Shown
    pid: int | None
    host: str
    port: int
    restarts: int
    uptime_s: float | None
    last_error: str | None
    ui: bool
    version: int  # of the routing table it was last given


@dataclass(frozen=True)
class GroupMemberView:
    name: str
    state: states.Shown
    running: int | None = None  # as its worker last reported (None: upstream, or no worker)
    waiting: int | None = None


@dataclass(frozen=True)
class GroupView:
    """A replica set: the gateway answers its name with one of its members."""

    name: str
    state: str  # ready while a member is
    members: list[GroupMemberView]


@dataclass(frozen=True)
class StatusView:
    daemon: DaemonView
    models: list[ModelView]
    gateway: GatewayView | None = None
    groups: list[GroupView] = field(default_factory=list)
    pulls: list[PullView] = field(default_factory=list)  # into the model store: running and recently ended
