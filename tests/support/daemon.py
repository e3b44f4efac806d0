"""Run the real daemon (`vllmmlxd run`) on a temporary config, and drive it as a user would."""

from __future__ import annotations

import atexit
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from tests.support.servers import free_port
from vllmmlxd.ctl.client import ControlClient, ControlRequestError, DaemonUnreachable

# Every daemon a test started: one that failed between its start and its own stop (a fixture whose
# readiness wait timed out before its yield) is stopped when the test process exits, never left running.
_SPAWNED: list[subprocess.Popen] = []


def _stop_leftovers() -> None:
    for proc in _SPAWNED:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()


atexit.register(_stop_leftovers)


def model_entry(port: int, **extra) -> dict:
    return {"model": "builtin:tiny", "port": port, **extra}


@dataclass
class Daemon:
    dir: Path
    config_path: Path
    socket: Path
    proc: subprocess.Popen | None = None
    log_path: Path = field(default=None)  # type: ignore[assignment]
    state_dir: Path = field(default=None)  # type: ignore[assignment]
    # An installed package's bin folder: run its `vllmmlxd` and `vllmmlxctl` there, from outside the clone.
    bin: Path | None = None

    def _command(self, script: str, module: str) -> list[str]:
        return [str(self.bin / script)] if self.bin else [sys.executable, "-m", module]

    def _env(self, env: dict | None = None) -> dict:
        base = {k: v for k, v in os.environ.items() if not (self.bin and k == "PYTHONPATH")}
        return {**base, **(env or {})}

    def write(
        self, models: dict, daemon: dict | None = None, api_keys: dict | None = None, gateway: dict | None = None
    ) -> None:
        """Replace the config file the way editors do: write a temp file, rename it over."""
        own = {"control_socket": str(self.socket), "drain_timeout": 10}
        if self.state_dir is not None:
            own["state_dir"] = str(self.state_dir)
        body = {
            "daemon": {**own, **(daemon or {})},
            **({"api_keys": api_keys} if api_keys else {}),
            **({"gateway": gateway} if gateway else {}),
            "models": models,
        }
        tmp = self.config_path.with_suffix(".tmp")
        tmp.write_text(yaml.safe_dump(body, sort_keys=False))
        os.replace(tmp, self.config_path)

    def write_text(self, text: str) -> None:
        tmp = self.config_path.with_suffix(".tmp")
        tmp.write_text(text)
        os.replace(tmp, self.config_path)

    def start(self, env: dict | None = None) -> None:
        self.log_path = self.dir / "daemon.log"
        self.proc = self.spawn(env, self.log_path)

    def spawn(self, env: dict | None, log_path: Path) -> subprocess.Popen:
        """Another `vllmmlxd run` on this config (a second daemon, in a test that wants one)."""
        proc = subprocess.Popen(
            [*self._command("vllmmlxd", "vllmmlxd.cli"), "run", "--config", str(self.config_path)],
            stdout=subprocess.DEVNULL,
            stderr=log_path.open("wb"),
            env=self._env(env),
            cwd=self.dir if self.bin else None,
        )
        _SPAWNED.append(proc)
        return proc

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path else ""

    def ctl(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(
            [*self._command("vllmmlxctl", "vllmmlxd.ctl"), "--socket", str(self.socket), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=self._env(),
            cwd=self.dir if self.bin else None,
        )

    def status(self) -> dict | None:
        """What `vllmmlxctl status --json` prints, asked in this process: tests poll it many times a
        second, and a new interpreter for each poll would take the cores the workers start on."""
        try:
            with ControlClient(self.socket) as client:
                return client.status().model_dump(mode="json")
        except (DaemonUnreachable, ControlRequestError):
            return None

    def models(self) -> dict[str, dict]:
        s = self.status()
        return {m["name"]: m for m in s["models"]} if s else {}

    def wait_for(self, predicate, timeout: float = 120, what: str = "condition") -> float:
        """Poll ``predicate(models)`` until true; returns the seconds it took."""
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"daemon exited with {self.proc.returncode}:\n{self.log()[-4000:]}")
            try:
                if predicate(self.models()):
                    return time.monotonic() - started
            except (KeyError, TypeError, json.JSONDecodeError):
                pass
            time.sleep(0.1)
        raise TimeoutError(f"{what} not reached in {timeout}s: {self.models()}\n{self.log()[-4000:]}")

    def wait_ready(self, names, timeout: float = 180) -> float:
        names = set(names)
        return self.wait_for(
            lambda ms: set(ms) == names and all(m["state"] == "ready" for m in ms.values()), timeout, f"{names} ready"
        )

    def worker_pids(self) -> list[int]:
        return [m["pid"] for m in self.models().values() if m.get("pid")]

    def stop(self, timeout: float = 60) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


def make_daemon() -> Daemon:
    """A daemon with a state directory of its own (one daemon per state directory: it is locked),
    sharing the suite's converted models, downloads and BLAS measurements through links."""
    d = Path(tempfile.mkdtemp(prefix="vd-"))
    state = d / "state"
    state.mkdir(mode=0o700)
    shared = Path(os.environ.get("VLLMMLXD_STATE_DIR", ""))
    if shared.is_dir():
        for name in ("models", "downloads", "blas"):
            (shared / name).mkdir(exist_ok=True)
            (state / name).symlink_to(shared / name)
    return Daemon(dir=d, config_path=d / "config.yaml", socket=d / "ctl.sock", state_dir=state)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); read its state to tell.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return sys.platform == "darwin"


def wait_gone(pids, timeout: float = 30) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(pid_alive(p) for p in pids):
            return True
        time.sleep(0.1)
    return False


__all__ = ["Daemon", "free_port", "make_daemon", "model_entry", "pid_alive", "wait_gone"]
