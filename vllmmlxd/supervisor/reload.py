"""One reload, carried out: the steps ``plan.plan_reload`` chose, in two waves of operations.

The first wave shuts down removed entries and stops those that move, freeing their
listening sockets into a pool (two entries can exchange ports in one reload: a socket is
never bound again while another unit still holds it). Between the waves, in the
supervisor's task, removed units leave the collection and new ones join it, each taking its
address's socket from the pool. The second wave applies changes and starts additions. The
operations drive units through their commands only; the collection is changed only in the
task (``between``), so a reload and an idle unload or a load never write the same thing.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal, Protocol

from ..config.diff import ReloadPlan, diff_models
from ..config.load import LoadedConfig, load_config
from ..config.schema import Config, ModelConfig, Resolved, ResolvedModel, ResolvedUpstream
from ..errors import ConfigError, StoreError
from ..log import log_event
from ..runtime import cpus
from ..store.layout import not_downloaded, pull_hint
from ..store.pulls import Pulls
from ..store.sources import Source
from .files import ModelFiles
from .loads import Loads
from .memory import MemoryPlan, load_memory_plan
from .operations import Operations
from .plan import EntryFacts, ReloadSteps, plan_reload
from .routing import RoutingTable
from .slot.slot import PushSettings, Slot, SlotSettings
from .units import GatewayUnit, ModelUnit, Unit, UpstreamUnit
from .views import ReloadReply

logger = logging.getLogger("vllmmlxd.supervisor")
Address = tuple[str, int]


def address(config: ModelConfig) -> Address:
    return config.host, config.port


GatewayStep = tuple[Literal["remove", "none", "start", "move"], GatewayUnit | None]


@dataclass(frozen=True)
class Membership:
    """What the unit collection becomes between a reload's waves, applied by the supervisor's task."""

    loaded: LoadedConfig
    removed: tuple[str, ...]
    added: tuple[tuple[str, Resolved, socket.socket | None], ...]  # with the listening socket freed for it
    live_upstreams: tuple[tuple[str, ResolvedUpstream], ...]  # upstream entries whose checks take new settings


class Host(Protocol):
    """The supervisor as a reload sees it: what it reads, and the changes the task makes for it."""

    settings: SlotSettings
    push_settings: PushSettings | None
    pulls: Pulls
    ops: Operations
    loads: Loads
    files: ModelFiles  # whether each model's files are here
    routes: RoutingTable  # the gateway's routing table

    @property
    def units(self) -> Mapping[str, Unit]: ...
    @property
    def shares(self) -> Mapping[str, cpus.CpuShare]: ...
    def entry_units(self) -> dict[str, ModelUnit | UpstreamUnit]: ...
    def running_config(self) -> Config: ...
    def record_refusal(self, error: str, plan: str | None) -> None: ...
    def take_daemon_keys(self, plan: ReloadPlan, new: Config) -> None: ...
    def plan_cores(self, shares: dict[str, cpus.CpuShare]) -> None: ...
    def apply_membership(self, change: Membership) -> GatewayStep: ...


async def prepare(sup: Host, path: str, dry_run: bool, previewing: bool) -> ReloadReply | ReloadRun:
    """In the task: read ``path``, plan, check memory. The reply for a dry run or a refusal (nothing
    changes), else the run that applies it."""
    if previewing and not dry_run:
        return ReloadReply(
            ok=False,
            dry_run=False,
            plan="",
            config_path=path,
            error="another file can only be previewed (dry run): a reload reads the daemon's own config",
        )
    try:
        new = await asyncio.to_thread(load_config, path)
    except ConfigError as exc:
        if not dry_run:
            log_event(logger, "reload.invalid", logging.ERROR, error=str(exc))
            sup.record_refusal(str(exc), None)
        return ReloadReply(ok=False, dry_run=dry_run, plan="", error=str(exc))
    diff = diff_models(sup.running_config(), new.config)
    # A changed entry's swap holds its running worker beside the new one.
    swapped = diff.new_worker if sup.push_settings is not None else tuple(diff.changed)
    models = {n: u for n, u in sup.entry_units().items() if isinstance(u, ModelUnit)}
    replacing = {
        n: models[n].config
        for n in swapped
        if n in models and models[n].slot.pid is not None and isinstance(new.config.models[n], ResolvedModel)
    }
    memory = await asyncio.to_thread(load_memory_plan, new.config, sup.settings.state_dir, replacing)
    text = f"{diff.render()}\n{memory.render()}"
    if not memory.fits:  # nothing changes, and the error names each entry with its numbers
        error = memory.refusal()
        if not dry_run:
            log_event(
                logger,
                "reload.refused",
                logging.ERROR,
                **memory.fields(),
                entries=",".join(f"{n}:{f.total_mb}" for n, f in memory.entries.items()),
                error=error,
            )
            sup.record_refusal(error, text)
        return ReloadReply(ok=False, dry_run=dry_run, plan=text, error=error, entries=diff.entries())
    waiting = files_not_here(sup, diff, new.config, dry_run)
    if waiting:  # nothing changes: a model it names is not on this machine (or on its way first)
        error = "\n".join(waiting)
        if not dry_run:
            log_event(logger, "reload.refused", logging.ERROR, reason="models not downloaded", error=error)
            sup.record_refusal(error, text)
        return ReloadReply(ok=False, dry_run=dry_run, plan=text, error=error, entries=diff.entries())
    if dry_run:
        return ReloadReply(ok=True, dry_run=True, plan=text, error=None, entries=diff.entries())
    sup.take_daemon_keys(diff, new.config)
    sup.plan_cores(plan_shares(new.config))
    keep_shares(sup.entry_units(), diff, sup.shares)
    entries = {
        n: EntryFacts("model", (e.host, e.port), e.load == "lazy")
        if isinstance(e, ModelConfig)
        else EntryFacts("upstream", None)
        for n, e in new.config.models.items()
    }
    addresses = {
        n: (u.config.host, u.config.port) if isinstance(u, ModelUnit) else None for n, u in sup.entry_units().items()
    }
    steps = plan_reload(
        diff,
        sup.loads.facts(),
        addresses,
        entries,
        frozenset(n for n in diff.changed if memory.swap(n)),
        sup.push_settings is not None,
    )
    return ReloadRun(sup, new, diff, memory, steps, text)


def files_not_here(sup: Host, diff: ReloadPlan, config: Config, dry_run: bool) -> list[str]:
    """For each added or changed entry whose model is not on this machine, why the reload waits: the
    pull to run, or (``download: true`` on an entry whose worker serves) the download it starts first,
    after which the reload runs again (the running worker serves meanwhile). An entry that runs no
    worker downloads its model itself once the reload applies (``download: true``)."""
    lines = []
    for name in (*diff.added, *diff.changed):
        entry = config.models[name]
        if not isinstance(entry, ModelConfig):
            continue
        repo = not_downloaded(entry.model, sup.settings.state_dir)
        if repo is None:
            continue
        unit = sup.entry_units().get(name)
        if not entry.download:
            lines.append(f"{name}: {pull_hint(repo)} first (or set download: true on {name})")
        elif name in diff.changed and isinstance(unit, ModelUnit) and unit.slot.pid is not None:
            if dry_run:
                lines.append(f"{name}: would download {repo} first; its running worker serves until then")
                continue
            try:
                pull = sup.pulls.start(Source(repo))
            except StoreError as exc:
                lines.append(f"{name}: {exc}")
                continue
            sup.files.reload_when_pulled(pull)
            lines.append(
                f"{name}: downloading {repo} first (vllmmlxctl pull {repo} follows it); its running worker "
                "serves meanwhile, and the reload runs again once the download is done"
            )
    return lines


def plan_shares(config: Config) -> dict[str, cpus.CpuShare]:
    """Each entry's cores (Linux): an even split unless an entry sets ``threads``."""
    if not cpus.can_pin():
        return {}
    local = {name: entry.threads for name, entry in config.models.items() if isinstance(entry, ModelConfig)}
    shares = cpus.plan_shares(local, cpus.available_cpus())
    if any(share.oversubscribed for share in shares.values()):
        log_event(
            logger,
            "cpu.oversubscribed",
            logging.WARNING,
            cores=len(cpus.available_cpus()),
            shares=",".join(f"{n}:{s.render()}" for n, s in shares.items()),
        )
    return shares


def keep_shares(units: Mapping[str, Unit], plan: ReloadPlan, shares: Mapping[str, cpus.CpuShare]) -> None:
    """Running workers keep their cores; the new plan applies to the workers about to start.

    Restarting an unchanged model only to move it to other cores would reload its weights
    for nothing: it moves when it next restarts (``vllmmlxctl restart NAME``).
    """
    for name in plan.unchanged:
        unit = units.get(name)
        if not isinstance(unit, ModelUnit):
            continue
        held, planned = unit.slot.share, shares.get(name)
        if held != planned:
            log_event(
                logger,
                "cpu.share_kept",
                model=name,
                cpus=held and held.render(),
                planned=planned and planned.render(),
                applies="at its next restart",
            )
            unit.slot.plan_share(planned)


class ReloadRun:
    """A reload between its plan and its record; see the module's docstring."""

    def __init__(
        self, sup: Host, new: LoadedConfig, diff: ReloadPlan, memory: MemoryPlan, steps: ReloadSteps, text: str
    ):
        self.sup, self.new, self.diff, self.memory, self.steps, self.text = sup, new, diff, memory, steps, text
        self.errors: list[str] = []
        if diff.restart_required:
            self.errors.append(f"daemon.{', daemon.'.join(diff.restart_required)} changed: restart the daemon to apply")
        self.pool: dict[Address, socket.socket] = {}
        self._done: Callable[[ReloadReply], None] = lambda reply: None

    def start(self, done: Callable[[ReloadReply], None]) -> None:
        """In the task: run the first wave; ``done`` (in the task too) gets the reply at the end."""
        self._done = done
        names = self.steps.names()
        before = self.sup.ops.pending(names)  # an idle unload or a load on one of them finishes first
        self.sup.ops.start({n: "reloading" for n in names}, self._first(before), self._between)

    async def _first(self, before: list[asyncio.Task]) -> None:
        if before:
            await asyncio.wait(before)
        units = self.sup.units

        async def remove(name: str) -> None:
            unit = units[name]
            sock = await unit.shutdown(keep_socket=True)
            if sock is not None and isinstance(unit, ModelUnit):
                self.pool[address(unit.config)] = sock

        async def release(name: str) -> None:
            unit = units[name]
            assert isinstance(unit, ModelUnit)
            await unit.slot.stop()
            sock = await unit.slot.release_socket()
            if sock is not None:
                self.pool[address(unit.config)] = sock

        await asyncio.gather(*(remove(n) if step == "remove" else release(n) for n, step in self.steps.first))

    def _between(self, result: object, error: BaseException | None) -> None:
        """In the task: the collection takes its new members (the supervisor applies them), then the second wave."""
        models = self.new.config.models
        if error is not None:
            self.errors.append(f"reload: {error}")
        added = []
        for name, step in self.steps.then:
            entry = models[name]
            if step == "add":
                added.append(
                    (name, entry, self.pool.pop(address(entry), None) if isinstance(entry, ModelConfig) else None)
                )
        change = Membership(
            loaded=self.new,
            removed=tuple(name for name, step in self.steps.first if step == "remove"),
            added=tuple(added),
            live_upstreams=tuple(
                (name, entry)
                for name, step in self.steps.then
                if step == "live" and isinstance(entry := models[name], ResolvedUpstream)
            ),
        )
        gateway_step = self.sup.apply_membership(change)
        names = self.steps.names()
        self.sup.ops.start({n: "reloading" for n in names}, self._second(gateway_step), self._end)

    async def _second(self, gateway: GatewayStep) -> None:
        units, models = self.sup.units, self.new.config.models
        await asyncio.gather(
            *(self._apply(name, step, units.get(name), models[name]) for name, step in self.steps.then)
        )
        for sock in self.pool.values():  # freed and not taken
            sock.close()
        what, unit = gateway
        if unit is None or what == "none":
            return
        if what == "remove":
            await unit.shutdown()
        elif what == "start" and not await unit.slot.start():
            self.errors.append(f"gateway: did not become ready: {unit.slot.last_error}")
        elif what == "move":
            spec = self.sup.routes.spec(unit.config)
            ok, error = await unit.slot.replace(spec, hold_both=False)
            if not ok:
                self.errors.append(
                    f"gateway: moved to {unit.config.host}:{unit.config.port}; it did not become ready: {error}"
                )

    async def _apply(self, name: str, step: str, unit: Unit | None, config: Resolved) -> None:
        """One entry's step of the second wave (an error is kept for the reply, never raised). An
        upstream unit was added or updated in the task already; the plan gives a unit of one kind
        only an entry of the same kind."""
        if not isinstance(unit, ModelUnit) or not isinstance(config, ResolvedModel):
            return
        slot = unit.slot
        if step == "add":
            if unit.absent is None and config.load == "eager" and not await slot.start():
                self.errors.append(f"{name}: did not become ready: {slot.last_error}")
            return  # (an absent model starts once it is here: download: true)
        if step == "move":
            ok, error = await slot.replace(config, self.sup.shares.get(name), hold_both=False, sock=self._sock(config))
            if not ok:
                self.errors.append(
                    f"{name}: moved to {config.host}:{config.port}; the new worker did not become ready: {error}"
                )
            return
        if slot.pid is None and not_downloaded(config.model, self.sup.settings.state_dir) is not None:
            # It runs no worker and its new model is not here: it takes the entry, and its download
            # starts at the reload's end (a serving one was refused in `prepare`).
            await slot.apply_settings(config, sock=self._sock(config))
        elif step == "adopt":  # not loaded: its next load takes the entry (an eager one loads now)
            await slot.apply_settings(config, sock=self._sock(config))
            ok, error = await slot.load() if config.load == "eager" else (True, None)
            if not ok:
                self.errors.append(f"{name}: did not become ready: {error}")
        else:
            await self._change(name, slot, config, live=step == "live")

    def _sock(self, config: ResolvedModel) -> socket.socket | None:
        """The listening socket the first wave freed at this entry's address, if any."""
        return self.pool.pop(address(config), None)

    async def _change(self, name: str, slot: Slot, config: ResolvedModel, *, live: bool) -> None:
        """A running entry's new settings: live when they can be, else a new worker (swapped when memory allows)."""
        if live:
            ok, error = await slot.apply_settings(config)
            if ok:
                return
            log_event(logger, "reload.live_failed", logging.WARNING, model=name, error=error, then="new worker")
        swap = swap_or_say_why(self.memory, name, slot.config, config)
        ok, error = await slot.replace(config, self.sup.shares.get(name), hold_both=swap)
        if not ok and swap:
            self.errors.append(f"{name}: the new worker did not become ready; the old one keeps serving: {error}")
        elif not ok:
            self.errors.append(
                f"{name}: stopped to make room (not enough memory for both); "
                f"the new worker did not become ready: {error}"
            )

    def _look_for_files(self) -> None:
        """In the task, at the reload's end: models pulled since their entry was refused start now;
        entries that took a model not here yet start its download (``download: true``)."""
        for unit in _files_arrived(self.sup):
            self.sup.ops.start({unit.name: "starting"}, unit.slot.start())

    def _end(self, result: object, error: BaseException | None) -> None:
        if error is not None:
            self.errors.append(f"reload: {error}")
        self._look_for_files()
        plan, memory = self.diff, self.memory
        error_text = "\n".join(self.errors) or None
        log_event(
            logger,
            "reload.done" if not self.errors else "reload.failed",
            logging.INFO if not self.errors else logging.ERROR,
            added=",".join(plan.added),
            changed=",".join(plan.changed),
            removed=",".join(plan.removed),
            needed_mb=memory.needed_mb,
            usable_mb=memory.capacity.usable_mb,
            error=error_text,
        )
        self._done(
            ReloadReply(ok=not self.errors, dry_run=False, plan=self.text, error=error_text, entries=plan.entries())
        )


def _files_arrived(sup: Host) -> list[ModelUnit]:
    """In the task: every model unit without a worker looks for its files again (its entry may have
    changed, or its model been pulled since); those whose model just arrived, eager, are returned."""
    arrived = []
    for unit in sup.entry_units().values():
        if isinstance(unit, ModelUnit) and unit.slot.pid is None:
            was = unit.absent
            sup.files.check(unit)
            if was is not None and unit.absent is None and not unit.lazy:
                arrived.append(unit)
    return arrived


def swap_or_say_why(memory: MemoryPlan, name: str, *configs: object) -> bool:
    """Whether ``name`` is swapped with no downtime; logs why not when it is stopped first.

    A distributed entry (among ``configs``: the running one, the next) is never run twice: a
    second set of ranks would need every host's memory twice over and the same ring ports."""
    if any(getattr(c, "distributed", None) is not None for c in configs):
        log_event(logger, "ranks.restart", model=name, reason="a distributed entry's ranks stop before new ones start")
        return False
    if memory.swap(name):
        return True
    log_event(
        logger,
        "memory.restart",
        logging.WARNING,
        model=name,
        reason="not enough memory for both",
        peak_mb=memory.changes[name].peak_mb,
        usable_mb=memory.capacity.usable_mb,
    )
    return False
