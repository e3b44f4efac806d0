"""sd_notify with no dependency: tell systemd we are ready, reloading, stopping or alive.

``Notifier.from_env()`` reads ``NOTIFY_SOCKET``; without it (launchd, a terminal, tests)
every call is a no-op. Messages are datagrams of ``KEY=value`` lines on an AF_UNIX socket,
as in gunicorn's ``systemd.py``; nothing here ever raises into the daemon.

The variables stay in our environment. Workers must not inherit them: with
``NotifyAccess=main`` systemd would log their messages as stray, and under a looser
setting a worker could mark the whole service ready or feed its watchdog. The supervisor
therefore starts workers with ``strip_notify_env(os.environ)``.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Mapping

from ..log import log_event

logger = logging.getLogger("vllmmlxd.notify")

# Meant for the main process only: never passed on to workers.
NOTIFY_ENV = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")


def strip_notify_env(env: Mapping[str, str]) -> dict[str, str]:
    """A copy of ``env`` without NOTIFY_SOCKET and WATCHDOG_*, for a child process."""
    return {k: v for k, v in env.items() if k not in NOTIFY_ENV}


def socket_address(value: str) -> str:
    """The AF_UNIX address for a NOTIFY_SOCKET value: ``@name`` is the abstract ``\\0name``."""
    return "\0" + value[1:] if value.startswith("@") else value


def watchdog_interval_from(env: Mapping[str, str], pid: int) -> float | None:
    """Seconds between WATCHDOG=1 pings (half of WATCHDOG_USEC), or None when no watchdog is ours."""
    owner = env.get("WATCHDOG_PID")
    if owner and owner.strip() != str(pid):
        return None
    try:
        usec = int(env.get("WATCHDOG_USEC", ""))
    except ValueError:
        return None
    # Half the timeout, as sd_watchdog_enabled(3) advises, so one late ping is not fatal.
    return usec / 2 / 1_000_000 if usec > 0 else None


class Notifier:
    """Sends sd_notify messages to ``address``; a no-op when ``address`` is None."""

    def __init__(self, address: str | None, watchdog: float | None = None):
        self.address = address or None
        self._watchdog = watchdog
        self._sock: socket.socket | None = None
        self._warned = False

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Notifier:
        """A notifier for NOTIFY_SOCKET and WATCHDOG_USEC/WATCHDOG_PID in ``env`` (default os.environ)."""
        env = os.environ if env is None else env
        return cls(env.get("NOTIFY_SOCKET"), watchdog_interval_from(env, os.getpid()))

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def ready(self, status: str | None = None) -> bool:
        """READY=1: startup is done (and, after a reload, the reload is)."""
        return self.send("READY=1", *([_status(status)] if status is not None else []))

    def reloading(self) -> bool:
        """RELOADING=1 with MONOTONIC_USEC, which Type=notify-reload requires; follow with ready()."""
        usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        return self.send("RELOADING=1", f"MONOTONIC_USEC={usec}")

    def stopping(self) -> bool:
        """STOPPING=1: shutdown has begun (draining requests, stopping workers)."""
        return self.send("STOPPING=1")

    def status(self, text: str) -> bool:
        """STATUS=text: the one-line state `systemctl status` shows."""
        return self.send(_status(text))

    def watchdog(self) -> bool:
        """WATCHDOG=1: the event loop is alive; send every watchdog_interval() seconds."""
        return self.send("WATCHDOG=1")

    def watchdog_interval(self) -> float | None:
        """Seconds between watchdog() calls, or None when systemd runs no watchdog for us."""
        return self._watchdog if self.enabled else None

    def send(self, *lines: str) -> bool:
        """Send one datagram of ``lines``; True when it was sent, False on no-op or error."""
        if self.address is None:
            return False
        try:
            if self._sock is None:
                # Non-inheritable by default in Python, so workers never get this socket either.
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                # A receiver that stops reading (a full queue) must drop pings, never stall the daemon.
                self._sock.setblocking(False)
            self._sock.sendto("\n".join(lines).encode(), socket_address(self.address))
            return True
        except (OSError, ValueError) as exc:
            # systemd being gone must never take the daemon down; say so once, not every ping.
            if not self._warned:
                self._warned = True
                log_event(logger, "notify.failed", logging.WARNING, socket=self.address, error=exc)
            return False

    def close(self) -> None:
        """Close the socket (a later send opens a new one)."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def _status(text: str) -> str:
    # A newline would start another KEY=value assignment in the datagram.
    return "STATUS=" + " ".join(str(text).splitlines())
