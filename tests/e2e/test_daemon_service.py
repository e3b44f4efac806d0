"""The daemon as systemd sees it (sd_notify on a real datagram socket), secrets kept
out of everything it prints, and a model that cannot load ending in `failed`."""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.support.daemon import free_port, make_daemon, model_entry, wait_gone

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def daemon():
    d = make_daemon()
    yield d
    pids = d.worker_pids() if d.proc and d.proc.poll() is None else []
    d.stop()
    assert wait_gone(pids)


class Datagrams:
    """Reads a notify socket all the time, as systemd does (a receiver that stops reading makes
    the daemon drop messages rather than block), and lets the test wait for one."""

    def __init__(self, path):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(0.2)
        self.got: list[str] = []
        self._seen = 0
        self._closed = False
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        while not self._closed:
            try:
                self.got.append(self.sock.recv(4096).decode())
            except (TimeoutError, OSError):
                continue

    def receive(self, want: str, timeout: float = 60) -> list[str]:
        """The datagrams since the last call, up to the first that contains ``want``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for i in range(self._seen, len(self.got)):
                if want in self.got[i]:
                    out, self._seen = self.got[self._seen : i + 1], i + 1
                    return out
            time.sleep(0.02)
        raise AssertionError(f"no {want!r} in {self.got[self._seen :]}")

    def close(self) -> None:
        self._closed = True


def test_sd_notify_ready_status_reloading_watchdog_stopping(daemon):
    sock_path = daemon.dir / "notify.sock"
    notify = Datagrams(sock_path)
    daemon.write({"a": model_entry(free_port())}, daemon={"watch": False})
    daemon.start(env={"NOTIFY_SOCKET": str(sock_path), "WATCHDOG_USEC": "400000"})
    first = notify.receive("READY=1")
    assert any("WATCHDOG=1" in m for m in notify.receive("WATCHDOG=1", 5))
    daemon.wait_ready({"a"})
    assert "STATUS=1/1 models ready" in "".join(notify.receive("STATUS=1/1 models ready", 10))
    os.kill(daemon.proc.pid, signal.SIGHUP)
    msgs = notify.receive("RELOADING=1")
    assert "MONOTONIC_USEC=" in msgs[-1]
    notify.receive("READY=1")
    # workers must not talk to systemd themselves
    logs = daemon.ctl("logs", "a").stdout
    assert "NOTIFY_SOCKET" not in logs
    assert daemon.stop() == 0
    notify.receive("STOPPING=1", 10)
    notify.close()
    assert first


def test_secrets_stay_out_of_status_logs_and_command_lines(daemon):
    secret = "sk-vllmmlxd-never-print-me"
    key_file = daemon.dir / "key"
    key_file.write_text(secret + "\n")
    port = free_port()
    daemon.write({"a": model_entry(port, api_key=f"${{file:{key_file}}}")})
    daemon.start()
    daemon.wait_ready({"a"})
    url = f"http://127.0.0.1:{port}/v1/completions"
    assert httpx.post(url, json={"prompt": "x", "max_tokens": 2}).status_code == 401
    assert (
        httpx.post(
            url, json={"prompt": "x", "max_tokens": 2}, headers={"Authorization": f"Bearer {secret}"}
        ).status_code
        == 200
    )
    pid = daemon.models()["a"]["pid"]
    proc = Path(f"/proc/{pid}/cmdline")
    cmdline = proc.read_bytes().decode(errors="replace") if proc.exists() else ""
    everything = (
        daemon.ctl("status").stdout
        + daemon.ctl("status", "--json").stdout
        + daemon.ctl("logs", "a", "-n", "500").stdout
    )
    assert secret not in everything and secret not in cmdline
    daemon.stop()
    assert secret not in daemon.log()


def test_a_model_that_cannot_load_ends_failed_with_its_error_shown(daemon):
    daemon.write(
        {"good": model_entry(free_port()), "bad": {"model": str(daemon.dir / "missing.gguf"), "port": free_port()}}
    )
    daemon.start()
    daemon.wait_for(lambda ms: ms["good"]["state"] == "ready" and ms["bad"]["state"] == "failed", 120, "bad failed")
    bad = daemon.models()["bad"]
    assert bad["last_exit_code"] not in (None, 0) and "missing.gguf" in bad["last_error"]
    table = daemon.ctl("status")
    assert table.returncode == 3 and "failed" in table.stdout and "missing.gguf" in table.stdout
    # fixing the entry brings it back
    daemon.write({"good": model_entry(daemon.models()["good"]["port"]), "bad": model_entry(bad["port"])})
    daemon.wait_ready({"good", "bad"}, 60)
    assert json.loads(daemon.ctl("status", "--json").stdout)["daemon"]["last_reload"]["ok"] is True


def test_journald_lines_and_following_a_models_log(daemon):
    import subprocess
    import sys

    daemon.write({"a": model_entry(free_port())})
    daemon.start(env={"JOURNAL_STREAM": "8:12345"})
    daemon.wait_ready({"a"})
    lines = [line for line in daemon.log().splitlines() if line]
    assert lines and all(line.startswith("<") and "ts=" not in line for line in lines), lines[:5]
    assert any(line.startswith("<6>level=info event=worker.ready model=a") for line in lines)
    follow = subprocess.Popen(
        [sys.executable, "-m", "vllmmlxd.ctl", "--socket", str(daemon.socket), "logs", "a", "-n", "0", "-f"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert daemon.ctl("restart", "a").returncode == 0
        seen = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not any("event=worker.ready" in s for s in seen):
            seen.append(follow.stdout.readline())
        assert any("event=worker.listening" in s for s in seen) and any("event=worker.ready" in s for s in seen)
    finally:
        follow.terminate()
        follow.wait(10)
