"""sd_notify against a real AF_UNIX datagram socket standing in for systemd."""

from __future__ import annotations

import logging
import os
import re
import socket
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from vllmmlxd.supervisor.notify import Notifier, strip_notify_env, watchdog_interval_from


@pytest.fixture
def listener(monkeypatch):
    """A bound datagram socket with NOTIFY_SOCKET pointing at it."""
    # A short directory: AF_UNIX paths are capped near 104-108 bytes, pytest's tmp_path can be longer.
    with tempfile.TemporaryDirectory(prefix="vmx-") as tmp:
        path = os.path.join(tmp, "notify")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(path)
        sock.settimeout(2)
        monkeypatch.setenv("NOTIFY_SOCKET", path)
        try:
            yield sock
        finally:
            sock.close()


def receive(sock: socket.socket) -> str:
    return sock.recv(4096).decode()


def test_each_message_is_one_exact_datagram(listener):
    notifier = Notifier.from_env()
    assert notifier.enabled
    assert notifier.ready()
    assert receive(listener) == "READY=1"
    notifier.ready("serving 2 models")
    assert receive(listener) == "READY=1\nSTATUS=serving 2 models"
    notifier.status("loading llama")
    assert receive(listener) == "STATUS=loading llama"
    notifier.stopping()
    assert receive(listener) == "STOPPING=1"
    notifier.watchdog()
    assert receive(listener) == "WATCHDOG=1"
    notifier.close()


def test_reloading_carries_the_monotonic_clock(listener):
    notifier = Notifier.from_env()
    before = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    notifier.reloading()
    after = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    match = re.fullmatch(r"RELOADING=1\nMONOTONIC_USEC=(\d+)", receive(listener))
    assert match and before <= int(match.group(1)) <= after
    notifier.close()


def test_status_newlines_cannot_inject_assignments(listener):
    notifier = Notifier.from_env()
    notifier.status("ok\nREADY=1")
    assert receive(listener) == "STATUS=ok READY=1"
    notifier.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="abstract AF_UNIX sockets are Linux-only")
def test_abstract_socket(monkeypatch):
    name = f"vllmmlxd-test-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(2)
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        notifier = Notifier.from_env()
        notifier.ready("up")
        assert receive(sock) == "READY=1\nSTATUS=up"
        notifier.close()


def test_without_notify_socket_everything_is_a_no_op(monkeypatch):
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    monkeypatch.setenv("WATCHDOG_USEC", "30000000")
    notifier = Notifier.from_env()
    assert not notifier.enabled
    assert notifier.ready("x") is False
    assert notifier.reloading() is False
    assert notifier.stopping() is False
    assert notifier.status("x") is False
    assert notifier.watchdog() is False
    assert notifier.watchdog_interval() is None
    notifier.close()


def test_missing_socket_warns_once_and_never_raises(monkeypatch, caplog, tmp_path):
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "gone"))
    notifier = Notifier.from_env()
    with caplog.at_level(logging.WARNING, logger="vllmmlxd.notify"):
        assert notifier.ready() is False
        assert notifier.watchdog() is False
        assert notifier.stopping() is False
    failures = [r for r in caplog.records if getattr(r, "event", None) == "notify.failed"]
    assert len(failures) == 1 and failures[0].levelno == logging.WARNING
    notifier.close()


def test_overlong_socket_path_never_raises(monkeypatch):
    monkeypatch.setenv("NOTIFY_SOCKET", "/" + "x" * 300)
    notifier = Notifier.from_env()
    assert notifier.ready() is False
    notifier.close()


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"WATCHDOG_USEC": "30000000"}, 15.0),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "4242"}, 15.0),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "1"}, None),
        ({"WATCHDOG_USEC": "0"}, None),
        ({"WATCHDOG_USEC": "soon"}, None),
        ({"WATCHDOG_USEC": "-5"}, None),
        ({}, None),
    ],
)
def test_watchdog_interval_from(env, expected):
    assert watchdog_interval_from(env, pid=4242) == expected


def test_watchdog_interval_from_env_checks_our_pid(listener, monkeypatch):
    monkeypatch.setenv("WATCHDOG_USEC", "20000000")
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    assert Notifier.from_env().watchdog_interval() == 10.0
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid() + 1))
    assert Notifier.from_env().watchdog_interval() is None


def test_strip_notify_env_leaves_the_rest_and_the_original():
    env = {"NOTIFY_SOCKET": "/run/x", "WATCHDOG_USEC": "1", "WATCHDOG_PID": "2", "PATH": "/bin", "HOME": "/root"}
    assert strip_notify_env(env) == {"PATH": "/bin", "HOME": "/root"}
    assert "NOTIFY_SOCKET" in env


def test_from_env_leaves_the_environment_alone(listener):
    before = os.environ["NOTIFY_SOCKET"]
    notifier = Notifier.from_env()
    notifier.ready()
    notifier.close()
    assert os.environ["NOTIFY_SOCKET"] == before
    assert Path(before).exists()
    receive(listener)


def test_a_receiver_that_stops_reading_never_blocks_the_sender(tmp_path):
    path = tmp_path / "n.sock"
    receiver = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    receiver.bind(str(path))
    notifier = Notifier(str(path))
    started = time.monotonic()
    sent = [notifier.watchdog() for _ in range(2000)]  # far more than a datagram queue holds
    assert time.monotonic() - started < 2
    assert sent[0] is True and sent[-1] is False
    receiver.close()
