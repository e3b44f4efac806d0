"""The daemon's composition root: config → logging → supervisor → control → watcher → READY.

Never imports mlx: every model runs in its own worker process.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import sys
import time
from collections.abc import AsyncIterator, Coroutine
from pathlib import Path
from typing import Any

from .config.load import LoadedConfig, load_config
from .config.schema import DaemonConfig
from .control import mapping
from .control.lock import DaemonLock, DaemonRunning
from .control.protocol import (
    ActionResponse,
    PullStatus,
    ReloadResponse,
    StatusResponse,
    StoreResponse,
    UsageResponse,
    control_socket_path,
)
from .errors import ConfigError
from .log import format_fields, log_event, setup_logging
from .paths import ensure_private_dir, models_dir, resolve_state_dir
from .store.catalog import describe_removal, list_models, remove_model
from .store.pulls import Pulls
from .store.sources import Source
from .supervisor.memory import load_memory_plan
from .supervisor.notify import Notifier
from .supervisor.slot.slot import PushSettings, SlotSettings
from .supervisor.slot.tuning import Tuning
from .supervisor.supervisor import Supervisor
from .supervisor.views import ReloadReply
from .supervisor.watcher import watch_config
from .usage import FILE as USAGE_FILE

logger = logging.getLogger("vllmmlxd.daemon")

EX_OK = 0
EX_UNAVAILABLE = 69  # another daemon already runs on this state directory or control socket
EX_SOFTWARE = 70
EX_CONFIG = 78  # systemd's RestartPreventExitStatus=78 stops a restart loop on a bad config

SHUTDOWN_MARGIN_S = 10.0  # past drain_timeout, whatever is left is killed and the daemon exits


def _live_settings_pusher() -> PushSettings | None:
    """How a live change reaches a running worker (supervisor/live.py), when that module is there."""
    try:
        from .supervisor.live import push_settings
    except ImportError:
        return None
    return push_settings


class Daemon:
    def __init__(self, loaded: LoadedConfig, state_dir: Path):
        self.loaded = loaded
        self.state_dir = state_dir
        self.notifier = Notifier.from_env()
        self.stop_event = asyncio.Event()
        daemon_cfg = loaded.config.daemon
        settings = SlotSettings(
            state_dir=state_dir,
            drain_timeout=daemon_cfg.drain_timeout,
            log_level=daemon_cfg.log_level,
            tuning=Tuning.from_env(),
        )
        self.control_socket = control_socket_path(daemon_cfg.control_socket, state_dir)
        # Pulls into the model store: `vllmmlxctl pull`, the gateway's /api/pull and download: true share them.
        self.pulls = Pulls(state_dir, max_running=daemon_cfg.max_pulls, max_queued=daemon_cfg.max_waiting_pulls)
        # The gateway asks the daemon's control socket for lazy models to load.
        self.supervisor = Supervisor(
            loaded,
            settings,
            on_change=self._report,
            push_settings=_live_settings_pusher(),
            control_socket=self.control_socket,
            pulls=self.pulls,
        )
        self._tasks: set[asyncio.Task] = set()
        self._watcher: asyncio.Task | None = None
        self._watchdog_task: asyncio.Task | None = None

    def _report(self) -> None:
        ready, total = self.supervisor.ready_count()
        self.notifier.status(f"{ready}/{total} models ready")

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def reload(self, dry_run: bool = False, file: str | None = None) -> ReloadReply:
        if not dry_run:
            self.notifier.reloading()
        try:
            result = await self.supervisor.reload(dry_run=dry_run, file=file)
            self._apply_daemon(self.supervisor.daemon_config)
            return result
        finally:
            if not dry_run:
                self.notifier.ready()
                self._report()

    def _apply_daemon(self, applied: DaemonConfig) -> None:
        """The daemon section in force, applied in this one place: log level, watching, worker settings."""
        logging.getLogger().setLevel(applied.log_level.upper())
        self.supervisor.use_daemon_config(applied)
        self.pulls.limit(applied.max_pulls, applied.max_waiting_pulls)
        self._set_watching(applied.watch)

    async def run(self) -> int:
        from .control.server import make_control_app, serve_control

        loop = asyncio.get_running_loop()
        # Signal handlers only set flags or schedule work; the loop does the rest.
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop_event.set)
        loop.add_signal_handler(signal.SIGHUP, lambda: self._spawn(self.reload()))

        sock_path = self.control_socket
        control = await serve_control(make_control_app(_ControlFacade(self)), sock_path)
        log_event(
            logger,
            "daemon.started",
            pid=os.getpid(),
            config=str(self.loaded.path),
            control_socket=str(sock_path),
            models=len(self.loaded.config.models),
        )
        interval = self.notifier.watchdog_interval()
        if interval:  # its own task, outside _tasks: it goes on through the drain
            self._watchdog_task = asyncio.create_task(self._watchdog(interval))
        self._spawn(self.supervisor.start_all())
        self._apply_daemon(self.supervisor.daemon_config)
        self.notifier.ready()
        self._report()

        await self.stop_event.wait()
        await self._shutdown()
        await control.stop()
        if self._watchdog_task is not None:
            self._watchdog_task.cancel()
        log_event(logger, "daemon.stopped", pid=os.getpid())
        return EX_OK

    async def _shutdown(self) -> None:
        """Cancel starts and reloads in flight, then shut every slot down, within drain_timeout + a margin.

        Cancelling a caller never leaves a worker behind: the slots carry on with what was
        asked, and their shutdown (queued after it) kills a half-started worker at once.
        """
        log_event(logger, "daemon.stopping", pid=os.getpid())
        self.notifier.stopping()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        limit = self.supervisor.settings.drain_timeout + SHUTDOWN_MARGIN_S
        try:
            await asyncio.wait_for(self.supervisor.stop_all(), limit)
        except TimeoutError:
            log_event(logger, "daemon.shutdown_timeout", logging.ERROR, after_s=limit)
        await self.pulls.close()  # a pull's finished files stay: the next pull resumes them
        killed = self.supervisor.kill_all()  # nothing outlives the daemon
        if killed:
            log_event(logger, "daemon.killed_workers", logging.WARNING, pids=",".join(map(str, killed)))

    def _set_watching(self, on: bool) -> None:
        """Start or stop the config watcher (``daemon.watch`` applies on reload too)."""
        if on and self._watcher is None:
            path = Path(self.loaded.path)
            # Its own event: watchfiles sets the event it is given when the watch ends.
            watch = watch_config(path, self._settled, self.reload, asyncio.Event(), on_missing=self._config_missing)
            self._watcher = self._spawn(watch)
        elif not on and self._watcher is not None:
            self._watcher.cancel()
            self._watcher = None

    def _settled(self, digest: str) -> bool:
        """Whether a file with this content needs no reload: it is what runs, and the last reload did not fail."""
        last = self.supervisor.last_reload
        return digest == self.supervisor.loaded.text_hash and (last is None or last.ok)

    def _config_missing(self, missing: bool) -> None:
        self.supervisor.note_config_missing(missing)
        log_event(
            logger,
            "config.missing" if missing else "config.back",
            logging.WARNING if missing else logging.INFO,
            path=str(self.loaded.path),
            running=self.supervisor.loaded.short_hash,
        )

    async def _watchdog(self, interval: float) -> None:
        while True:
            self.notifier.watchdog()
            await asyncio.sleep(interval)


class _ControlFacade:
    """The supervisor as the control API sees it, with reloads going through the daemon."""

    def __init__(self, daemon: Daemon):
        self._daemon = daemon
        self._sup = daemon.supervisor

    def status(self) -> StatusResponse:
        return mapping.status_response(self._sup.status())

    async def refresh(self) -> None:
        await self._sup.refresh()

    async def reload(self, dry_run: bool = False, file: str | None = None) -> ReloadResponse:
        return mapping.reload_response(await self._daemon.reload(dry_run=dry_run, file=file))

    async def restart(self, name: str) -> ActionResponse:
        return mapping.action_response(await self._sup.restart(name))

    async def stop(self, name: str) -> ActionResponse:
        return mapping.action_response(await self._sup.stop(name))

    async def start(self, name: str) -> ActionResponse:
        return mapping.action_response(await self._sup.start(name))

    async def load(self, name: str) -> ActionResponse:
        return mapping.action_response(await self._sup.load(name))

    def logs(self, name: str, lines: int) -> list[str]:
        return self._sup.logs(name, lines)

    def follow(self, name: str) -> AsyncIterator[str]:
        return self._sup.follow(name)

    # -- the model store ---------------------------------------------------------------------------

    async def pull(self, source: Source) -> PullStatus:
        return mapping.pull_status(self._daemon.pulls.start(source).view())

    def pulls(self) -> list[PullStatus]:
        return [mapping.pull_status(p.view()) for p in self._daemon.pulls.all()]

    def pull_status(self, pull_id: str) -> PullStatus:
        return mapping.pull_status(self._daemon.pulls.get(pull_id).view())

    async def follow_pull(self, pull_id: str) -> AsyncIterator[PullStatus]:
        async for view in self._daemon.pulls.get(pull_id).follow():
            yield mapping.pull_status(view)

    async def cancel_pull(self, pull_id: str) -> PullStatus:
        return mapping.pull_status(await self._daemon.pulls.cancel(pull_id))

    def _pulling(self) -> frozenset[str]:
        return frozenset(p.repo for p in self._daemon.pulls.all() if p.running)

    async def store(self) -> StoreResponse:
        state_dir, running = self._daemon.state_dir, [p.view() for p in self._daemon.pulls.all() if p.running]
        # Sizes are read file by file: off the event loop.
        found = await asyncio.to_thread(list_models, state_dir, self._sup.entry_models(), self._pulling())
        try:
            free = shutil.disk_usage(models_dir(state_dir)).free
        except OSError:
            free = None
        return mapping.store_response(str(models_dir(state_dir)), free, found, running)

    async def usage(self, since_s: float) -> UsageResponse:
        budgets = {name: k.budget.plain() for name, k in self._sup.loaded.config.api_keys.items()}
        path = self._daemon.state_dir / USAGE_FILE
        return await asyncio.to_thread(mapping.usage_response, path, since_s, budgets, time.time())

    async def remove(self, name: str) -> ActionResponse:
        pulling = name in self._pulling()
        removed = await asyncio.to_thread(remove_model, name, self._daemon.state_dir, self._sup.entry_models(), pulling)
        log_event(logger, "store.removed", model=removed[0].name, bytes=sum(m.size_bytes for m in removed))
        return ActionResponse(ok=True, name=removed[0].name, message=describe_removal(removed))


def admit(loaded: LoadedConfig, state_dir: Path) -> bool:
    """Log the memory plan; False (the config is refused) when its models do not fit in memory."""
    plan = load_memory_plan(loaded.config, state_dir)
    for name, fp in plan.entries.items():
        log_event(
            logger,
            "memory.entry",
            model=name,
            total_mb=fp.total_mb,
            weights_mb=fp.weights_mb if fp.weights_known else "unknown",
            cache_mb=fp.cache_mb,
            worker_mb=fp.worker_mb,
            weights_from=fp.weights_note,
            cache_from=fp.cache_note,
        )
    if plan.fits:
        log_event(logger, "memory.plan", **plan.fields())
        return True
    log_event(logger, "memory.refused", logging.ERROR, **plan.fields(), error=plan.refusal())
    return False


def run(config_path: str, state_dir: str | None = None) -> int:
    """Run the daemon until SIGTERM/SIGINT; returns its exit code."""
    try:
        loaded = load_config(Path(config_path).absolute())
    except ConfigError as exc:
        setup_logging("info")
        for line in str(exc).splitlines():
            sys.stderr.write(format_fields({"level": "error", "event": "config.invalid", "error": line}) + "\n")
        return EX_CONFIG
    daemon_cfg = loaded.config.daemon
    setup_logging(daemon_cfg.log_level)
    state = ensure_private_dir(resolve_state_dir(state_dir or daemon_cfg.state_dir))
    try:
        lock = DaemonLock.acquire(state, control_socket_path(daemon_cfg.control_socket, state))
    except DaemonRunning as exc:
        log_event(logger, "daemon.already_running", logging.ERROR, error=str(exc))
        return EX_UNAVAILABLE
    try:
        if not admit(loaded, state):
            return EX_CONFIG
        return asyncio.run(Daemon(loaded, state).run())
    except OSError as exc:
        log_event(logger, "daemon.failed", logging.ERROR, error=str(exc))
        return EX_SOFTWARE
    finally:
        lock.release()
