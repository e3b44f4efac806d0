"""The units the daemon runs, each behind one small protocol: what it is, what it shows, how it ends.

- ``ModelUnit``: a model entry served here (eager or lazy), one ``Slot`` running its workers.
- ``UpstreamUnit``: a model entry served by another host's daemon: health checks, no process.
- ``GatewayUnit``: the gateway process, a ``Slot`` running ``vllmmlxd.gateway`` on its spec.

A replica set (entries sharing a ``group``) is no unit: it runs nothing and has no state of its own
to keep, only a routing of its members' in the gateway; status shows it as its members' views
(``group_views``). A new kind (a sharded model's ranks) is a new class here. Units are created and
dropped only by the supervisor's task; each one's state is written by its own actor (the slot,
or the upstream's checking task), and read here to be shown and to feed ``plan``.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import urlsplit

from ..config.distributed import share_text
from ..config.gateway import GatewayConfig, GatewaySpec
from ..config.groups import set_state
from ..config.schema import ResolvedModel, ResolvedUpstream
from ..http.activity import idle_limit
from ..store.disk import format_bytes
from ..store.pulls import Pull
from . import lazy, states
from .plan import Busy, Kind, UnitFacts
from .slot.log_lines import LogLines
from .slot.ranks import RankGroup
from .slot.slot import Slot
from .upstream import UpstreamChecks
from .views import GatewayView, GroupMemberView, GroupView, ModelView, RankView


class Unit(Protocol):
    """What the supervisor needs of every unit."""

    name: str
    kind: Kind

    @property
    def log(self) -> LogLines:
        """Its processes' lines and the daemon's about it, for `vllmmlxctl logs`."""
        ...

    def shown(self) -> tuple[states.Shown, str | None]:
        """Its state as status and the gateway show it, and why it is not serving."""
        ...

    async def refresh(self) -> None:
        """Fresh load figures from its process, if it has one."""
        ...

    async def shutdown(self, *, keep_socket: bool = False) -> socket.socket | None:
        """Stop for good (drain what runs); its listening socket when ``keep_socket``."""
        ...

    def kill_all(self) -> list[int]:
        """SIGKILL whatever process is left (the daemon's last resort); their pids."""
        ...


@dataclass(frozen=True)
class Absent:
    """Why a model unit starts nothing yet: its model's files are not here. ``pull``: the pull
    bringing them (``download: true``); without one, ``message`` says what to run."""

    repo: str
    message: str
    pull: Pull | None = None

    def shown(self) -> tuple[states.Shown, str | None]:
        """``downloading`` with its progress while its pull runs, else ``failed`` and why."""
        pull = self.pull.view() if self.pull is not None else None
        if pull is None:
            return states.FAILED, self.message
        if not pull.ended:
            done = f"{pull.percent:g}% of {format_bytes(pull.total_bytes)}" if pull.percent is not None else pull.state
            return states.DOWNLOADING, f"downloading {self.repo}: {done}"
        if pull.state == "done":  # until the supervisor's next message starts it
            return states.DOWNLOADING, f"downloaded {self.repo}"
        if pull.state == "cancelled":
            return states.FAILED, f"the download of {self.repo} was cancelled (a start or reload downloads it again)"
        return states.FAILED, f"the download of {self.repo} failed: {pull.error} (a start or reload tries again)"


@dataclass
class ModelUnit:
    """A model entry served here: its slot runs the workers; the entry's ``load`` says when.
    ``absent``: its model is not on this machine yet (not downloaded, or downloading)."""

    name: str
    slot: Slot
    kind: Kind = "model"
    absent: Absent | None = None

    @property
    def config(self) -> ResolvedModel:
        config = self.slot.config
        assert isinstance(config, ResolvedModel)
        return config

    @property
    def log(self) -> LogLines:
        return self.slot.log

    @property
    def lazy(self) -> bool:
        return self.config.load == "lazy"

    def idle_s(self, now: float | None = None, *, for_unload: bool = False) -> float | None:
        """How long its ready worker has gone without a request (None: busy, unknown, or not ready).
        ``for_unload``: None too while a client the stand-in turned away may still retry."""
        worker = self.slot.serving
        if worker is None or self.slot.state != states.READY:
            return None
        now = self.slot.clock.monotonic() if now is None else now
        expected = self.slot.expected_until if for_unload else 0.0
        return lazy.idle_for(worker.load.get("idle_s"), worker.load_at, now, expected)

    def idle_unload_s(self) -> float | None:
        """After how long idle a lazy model is unloaded: the entry's ``idle_unload_s``, unless a request
        its worker served said otherwise (``keep_alive``); an eager model stays (it is not unloaded)."""
        worker = self.slot.serving
        keep = worker.load.get("keep_alive_s") if worker is not None and self.lazy else None
        return idle_limit(self.config.idle_unload_s, keep if isinstance(keep, (int, float)) else None)

    def shown(self) -> tuple[states.Shown, str | None]:
        if self.absent is not None and self.slot.pid is None:
            return self.absent.shown()
        state = self.slot.state
        if self.lazy:
            if state == states.STARTING:
                state = states.LOADING
            elif state == states.READY and self.idle_s() is not None:
                state = states.IDLE
        return state, slot_error(self.slot)

    def facts(self, footprint_mb: int = 0, busy: Busy | None = None) -> UnitFacts:
        absent = self.absent.shown() if self.absent is not None and self.slot.pid is None else None
        return UnitFacts(
            self.name,
            "model",
            absent[0] if absent else self.slot.state,
            self.lazy,
            footprint_mb,
            self.idle_s(for_unload=True),
            self.idle_unload_s(),
            busy,
            absent[1] if absent else slot_error(self.slot),
        )

    def view(self, now: float) -> ModelView:
        slot, config = self.slot, self.config
        idle = self.idle_s()
        return ModelView(
            name=self.name,
            state=self.shown()[0],
            pid=slot.pid,
            host=config.host,
            port=config.port,
            restarts=slot.restarts,
            uptime_s=round(now - slot.ready_since, 1) if slot.ready_since else None,
            last_exit_code=slot.last_exit_code,
            served_model_name=config.display_name(self.name),
            last_error=self.shown()[1] if self.absent is not None else slot_error(slot),
            runtime=runtime_fields(slot),
            keys=None if config.is_open else config.key_names(),
            load=config.load,
            idle_unload_s=self.idle_unload_s(),
            idle_s=round(idle, 1) if idle is not None else None,
            group=config.group,
            download=self.absent.pull.view() if self.absent is not None and self.absent.pull is not None else None,
            **rank_fields(config, slot.worker, self.shown()[0]),
        )

    async def refresh(self) -> None:
        if self.slot.serving is not None:
            await self.slot.serving.refresh()

    async def shutdown(self, *, keep_socket: bool = False) -> socket.socket | None:
        return await self.slot.shutdown(keep_socket=keep_socket)

    def kill_all(self) -> list[int]:
        return self.slot.kill_all()


@dataclass
class UpstreamUnit:
    """A model entry another host serves: the gateway routes to it while its health checks pass."""

    name: str
    checks: UpstreamChecks
    kind: Kind = "upstream"

    def __post_init__(self) -> None:
        self._log = LogLines()  # nothing runs here; `vllmmlxctl logs` shows an empty list

    @property
    def log(self) -> LogLines:
        return self._log

    @property
    def config(self) -> ResolvedUpstream:
        return self.checks.config

    def shown(self) -> tuple[states.Shown, str | None]:
        return self.checks.state, self.checks.last_error

    def facts(self) -> UnitFacts:
        return UnitFacts(self.name, "upstream", self.checks.state, error=self.checks.last_error)

    def view(self, now: float) -> ModelView:
        config, checks = self.config, self.checks
        host, port = host_port(config.upstream)
        return ModelView(
            name=self.name,
            state=checks.state,
            pid=None,
            host=host,
            port=port,
            restarts=0,
            uptime_s=round(now - checks.ready_since, 1) if checks.ready_since else None,
            last_exit_code=None,
            served_model_name=config.display_name(self.name),
            last_error=checks.last_error,
            keys=None if config.is_open else config.key_names(),
            upstream=config.upstream,
            group=config.group,
        )

    async def refresh(self) -> None:
        return None

    async def shutdown(self, *, keep_socket: bool = False) -> socket.socket | None:
        await self.checks.close()
        return None

    def kill_all(self) -> list[int]:
        return []


@dataclass
class GatewayUnit:
    """The gateway process: supervised like a worker, fed the routing table the supervisor builds."""

    slot: Slot
    config: GatewayConfig
    name: str = "gateway"
    kind: Kind = "gateway"

    @property
    def log(self) -> LogLines:
        return self.slot.log

    @property
    def spec(self) -> GatewaySpec:
        spec = self.slot.config
        assert isinstance(spec, GatewaySpec)
        return spec

    def shown(self) -> tuple[states.Shown, str | None]:
        return self.slot.state, slot_error(self.slot)

    def view(self, now: float) -> GatewayView:
        slot, config = self.slot, self.config
        return GatewayView(
            state=slot.state,
            pid=slot.pid,
            host=config.host,
            port=config.port,
            restarts=slot.restarts,
            uptime_s=round(now - slot.ready_since, 1) if slot.ready_since else None,
            last_error=slot_error(slot),
            ui=config.ui,
            version=self.spec.version,
        )

    async def refresh(self) -> None:
        return None

    async def shutdown(self, *, keep_socket: bool = False) -> socket.socket | None:
        return await self.slot.shutdown(keep_socket=keep_socket)

    def kill_all(self) -> list[int]:
        return self.slot.kill_all()


EntryUnit = ModelUnit | UpstreamUnit


def group_views(models: list[ModelView]) -> list[GroupView]:
    """Each replica set, from its members' views: their states and their workers' load (pure)."""
    groups: dict[str, list[ModelView]] = {}
    for view in models:
        if view.group is not None:
            groups.setdefault(view.group, []).append(view)
    return [
        GroupView(
            name=name,
            state=set_state([m.state for m in members]),
            members=[
                GroupMemberView(m.name, m.state, m.runtime.get("running"), m.runtime.get("waiting")) for m in members
            ],
        )
        for name, members in groups.items()
    ]


def slot_error(slot: Slot) -> str | None:
    """Why a slot is not serving: its failure (with the reason it gave up) or its last crash."""
    if slot.state == states.FAILED:
        return f"{slot.fail_reason}: {slot.last_error}" if slot.fail_reason else slot.last_error
    if slot.state == states.BACKOFF:
        return slot.last_error
    return None


def rank_fields(config: ResolvedModel, worker: object, state: str) -> dict:
    """A distributed entry's split and its ranks for status: who runs where, and how it fares."""
    dist = config.distributed
    if dist is None:
        return {}
    reported = {r.get("rank"): r for r in (getattr(worker, "load", {}).get("distributed") or {}).get("ranks", [])}
    procs = worker.ranks if isinstance(worker, RankGroup) else []
    ranks = []
    for rank, host in enumerate(dist.hosts):
        proc = procs[rank] if rank < len(procs) else None
        alive = proc is not None and proc.proc.returncode is None
        shown = "exited" if proc is not None and not alive else (state if state == states.READY else "starting")
        live = reported.get(rank) or {}
        ranks.append(
            RankView(
                rank=rank,
                host=host.host,
                pid=proc.pid if proc is not None and (host.local or rank == 0) else live.get("pid"),
                state=shown if proc is not None else "stopped",
                share=share_text(config.model, dist, rank),
                step_ms=live.get("step_ms"),
                wait_ms=live.get("wait_ms"),
            )
        )
    return {
        "distributed": {"backend": dist.resolved_backend(), "parallel": dist.parallel, "world": dist.world},
        "ranks": ranks,
    }


def runtime_fields(slot: Slot) -> dict:
    """BLAS, threads, cores and load of the slot's serving worker, as it reported them."""
    worker = slot.serving
    runtime, load = (worker.runtime, worker.load) if worker is not None else ({}, {})
    fields = {key: runtime.get(key) for key in ("blas", "blas_path", "blas_warning", "threads", "cpus")}
    return fields | {
        key: load.get(key)
        for key in (
            "running",
            "waiting",
            "tokens_per_s",
            "cache_mb",
            "cache_budget_mb",
            "kv",
            "cache_disk_mb",
            "cache_disk_budget_mb",
            "embedding_model",
            "embedding_requests",
            "embedding_inputs",
            "vision",
            "speculative",
            "mcp",
        )
    }


def host_port(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = None
    return parts.hostname or "", port or (443 if parts.scheme == "https" else 80)
