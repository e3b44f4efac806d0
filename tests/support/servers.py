"""Start real vllmmlxd processes for tests and wait until they answer."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A port free now and never handed out before in this process: the kernel may give a port
    it just freed again, so two entries asked for one after the other could share one."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port
    raise RuntimeError("no port free that was not handed out already")


@dataclass
class Server:
    proc: subprocess.Popen
    port: int
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, timeout: float = 20) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def wait_healthy(url: str, proc: subprocess.Popen, log_path: Path, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{log_path.read_text()[-4000:]}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"server not healthy after {timeout}s:\n{log_path.read_text()[-4000:]}")


def start_serve(
    model: str,
    *flags: str,
    port: int | None = None,
    env: dict | None = None,
    threads: int | None = 1,
    bin: Path | None = None,
) -> Server:
    """``vllmmlxd serve MODEL`` as a real subprocess, healthy on return.

    On one BLAS thread unless ``--threads`` is among the flags or ``threads`` is None (the worker's
    default: one fewer than the cores, on any machine): the suite runs three test processes and
    their workers on two cores, where a second thread decodes no faster and costs 18-36% more CPU
    (SmolLM2, quiet and beside four busy processes, 2026-12-02). A test that pushes whole entries through ``--health-socket``, as the
    daemon does, passes ``threads=None``: threads cannot change in a running worker. ``bin``: an
    installed package's bin folder, whose ``vllmmlxd`` runs instead, from outside the clone."""
    port = port or free_port()
    if threads is not None and "--threads" not in flags:
        flags = (*flags, "--threads", str(threads))
    log = Path(tempfile.mkstemp(prefix="vllmmlxd-serve-", suffix=".log")[1])
    command = [str(bin / "vllmmlxd")] if bin else [sys.executable, "-m", "vllmmlxd.cli"]
    base = {k: v for k, v in os.environ.items() if not (bin and k == "PYTHONPATH")}
    proc = subprocess.Popen(
        [*command, "serve", model, "--port", str(port), *flags],
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        env={**base, **(env or {})},
        cwd=log.parent if bin else None,
    )
    server = Server(proc, port, log)
    try:
        wait_healthy(server.url, proc, log)
    except Exception:
        server.stop()
        raise
    return server


def greedy_completion(url: str, prompt: str, max_tokens: int = 8, timeout: float = 600) -> tuple[float, str]:
    """A streamed greedy completion from ``url``'s worker: (seconds to its first token, its text)."""
    started, first, text = time.perf_counter(), None, ""
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=timeout) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: {"):
                piece = json.loads(line[6:])["choices"][0]["text"]
                if piece and first is None:
                    first = time.perf_counter() - started
                text += piece
    assert first is not None
    return first, text


def version_fields() -> dict:
    """What every /health adds: the version, and the clone's commit (the tests run from one)."""
    from vllmmlxd import __version__
    from vllmmlxd.version import commit

    return {"version": __version__, "commit": commit()}
