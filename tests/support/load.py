"""A steady stream of small requests against one port, counting every failure."""

from __future__ import annotations

import threading
import time

import httpx


class SteadyLoad:
    """Sends completions back to back from a thread until stopped."""

    def __init__(self, port: int, *, keepalive: bool = False):
        self.url = f"http://127.0.0.1:{port}/v1/completions"
        self.ok = 0
        self.failures: list[str] = []
        self._stop = threading.Event()
        limits = httpx.Limits(max_keepalive_connections=5 if keepalive else 0)
        self._client = httpx.Client(timeout=60, limits=limits)
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                r = self._client.post(self.url, json={"prompt": "hi", "max_tokens": 2})
                if r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1:
                    self.ok += 1
                else:
                    self.failures.append(f"{r.status_code}: {r.text[:200]}")
            except httpx.HTTPError as exc:
                self.failures.append(repr(exc))
            time.sleep(0.01)

    def __enter__(self) -> SteadyLoad:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(30)
        self._client.close()
