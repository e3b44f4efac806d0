"""The daemon's composition root: config → logging → supervisor → control → watcher → READY.

Never imports mlx: every model runs in its own worker process.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from pathlib import Path

from .config.load import LoadedConfig, load_config
from .control.protocol import control_socket_path
from .errors import ConfigError
from .log import format_fields, log_event, setup_logging
from .paths import resolve_state_dir
from .supervisor.memory import load_memory_plan
from .supervisor.notify import Notifier
from .supervisor.slot import SlotSettings
from .supervisor.supervisor import Supervisor
from .supervisor.watcher import watch_config

logger = logging.getLogger("vllmmlxd.daemon")

EX_OK = 0
EX_SOFTWARE = 70
EX_CONFIG = 78  # systemd's RestartPreventExitStatus=78 stops a restart loop on a bad config


class Daemon:
    def __init__(self, loaded: LoadedConfig, state_dir: Path):
        self.loaded = loaded
        self.state_dir = state_dir
        self.notifier = Notifier.from_env()
        self.stop_event = asyncio.Event()
        daemon_cfg = loaded.config.daemon
        settings = SlotSettings(state_dir=state_dir, drain_timeout=daemon_cfg.drain_timeout, log_level=daemon_cfg.log_level)
        self.supervisor = Supervisor(loaded, settings, on_change=self._report)
        self._tasks: set[asyncio.Task] = set()
        self._watcher: asyncio.Task | None = None

    def _report(self) -> None:
        ready, total = self.supervisor.ready_count()
        self.notifier.status(f"{ready}/{total} models ready")

    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def reload(self, dry_run: bool = False):
        if not dry_run:
            self.notifier.reloading()
        try:
            result = await self.supervisor.reload(dry_run=dry_run)
            applied = self.supervisor.daemon_config
            logging.getLogger().setLevel(applied.log_level.upper())
            self._set_watching(applied.watch)
            return result
        finally:
            if not dry_run:
                self.notifier.ready()
                self._report()

    async def run(self) -> int:
        from .control.server import make_control_app, serve_control

        loop = asyncio.get_running_loop()
        # Signal handlers only set flags or schedule work; the loop does the rest.
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop_event.set)
        loop.add_signal_handler(signal.SIGHUP, lambda: self._spawn(self.reload()))

        sock_path = control_socket_path(self.loaded.config.daemon.control_socket, self.state_dir)
        control = await serve_control(make_control_app(_ControlFacade(self)), sock_path)
        log_event(logger, "daemon.started", pid=os.getpid(), config=str(self.loaded.path), control_socket=str(sock_path),
                  models=len(self.loaded.config.models))
        self._spawn(self.supervisor.start_all())
        self._set_watching(self.loaded.config.daemon.watch)
        interval = self.notifier.watchdog_interval()
        if interval:
            self._spawn(self._watchdog(interval))
        self.notifier.ready()
        self._report()

        await self.stop_event.wait()
        log_event(logger, "daemon.stopping", pid=os.getpid())
        self.notifier.stopping()
        # Starts and reloads in flight hold slot locks: cancel them first, then drain.
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.supervisor.stop_all()
        await control.stop()
        log_event(logger, "daemon.stopped", pid=os.getpid())
        return EX_OK

    def _set_watching(self, on: bool) -> None:
        """Start or stop the config watcher (``daemon.watch`` applies on reload too)."""
        if on and self._watcher is None:
            path = Path(self.loaded.path)
            # Its own event: watchfiles sets the event it is given when the watch ends.
            watch = watch_config(path, lambda: self.supervisor.loaded.text_hash, self.reload, asyncio.Event())
            self._watcher = self._spawn(watch)
        elif not on and self._watcher is not None:
            self._watcher.cancel()
            self._watcher = None

    async def _watchdog(self, interval: float) -> None:
        while True:
            self.notifier.watchdog()
            await asyncio.sleep(interval)


class _ControlFacade:
    """The supervisor as the control API sees it, with reloads going through the daemon."""

    def __init__(self, daemon: Daemon):
        self._daemon = daemon
        self._sup = daemon.supervisor

    def status(self):
        return self._sup.status()

    async def reload(self, dry_run: bool = False):
        return await self._daemon.reload(dry_run=dry_run)

    def __getattr__(self, name):
        return getattr(self._sup, name)


def admit(loaded: LoadedConfig, state_dir: Path) -> bool:
    """Log the memory plan; False (the config is refused) when its models do not fit in memory."""
    plan = load_memory_plan(loaded.config, state_dir)
    for name, fp in plan.entries.items():
        log_event(logger, "memory.entry", model=name, total_mb=fp.total_mb,
                  weights_mb=fp.weights_mb if fp.weights_known else "unknown", cache_mb=fp.cache_mb,
                  worker_mb=fp.worker_mb, weights_from=fp.weights_note, cache_from=fp.cache_note)
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
    state = resolve_state_dir(state_dir or daemon_cfg.state_dir)
    state.mkdir(parents=True, exist_ok=True)
    if not admit(loaded, state):
        return EX_CONFIG
    try:
        return asyncio.run(Daemon(loaded, state).run())
    except OSError as exc:
        log_event(logger, "daemon.failed", logging.ERROR, error=str(exc))
        return EX_SOFTWARE
