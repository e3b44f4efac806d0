"""A gateway process started by hand, its routing table on stdin (as the daemon starts it)."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx


class Gateway:
    def __init__(self, spec: dict, port: int):
        self.port = port
        self.spec = spec
        self.dir = Path(tempfile.mkdtemp(prefix="vllmmlxd-gw-"))
        self.socket = self.dir / "gw.sock"
        self.log_path = self.dir / "gateway.log"
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "vllmmlxd.gateway",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--health-socket",
                str(self.socket),
                "--state-dir",
                str(self.dir / "state"),
                "--drain-timeout",
                "5",
            ],
            stdin=subprocess.PIPE,
            stdout=self.log_path.open("wb"),
            stderr=subprocess.STDOUT,
        )
        assert self.proc.stdin is not None  # stdin=PIPE
        self.proc.stdin.write(json.dumps(spec).encode() + b"\n")
        self.proc.stdin.flush()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log()
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200 and self.socket.exists():
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise TimeoutError(self.log())

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def private(self) -> httpx.Client:
        return httpx.Client(transport=httpx.HTTPTransport(uds=str(self.socket)), base_url="http://gateway")

    def wait(self, timeout: float = 15) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise
