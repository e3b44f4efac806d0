"""`vllmmlxd serve` as a user meets it: a busy port is refused before anything loads, and a cap
given alone (--max-request-tokens) lowers the default max_tokens instead of refusing the flags."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import httpx

from tests.support.servers import free_port, start_serve


def test_a_busy_port_fails_at_once_with_one_line_before_any_load():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        started = time.monotonic()
        r = subprocess.run(
            [sys.executable, "-m", "vllmmlxd.cli", "serve", "builtin:tiny", "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        took = time.monotonic() - started
    assert r.returncode == 4, r.stderr
    [line] = r.stderr.splitlines()
    assert "event=worker.bind_failed" in line and f"port={port}" in line and "Address already in use" in line
    # Nothing was probed or loaded: the bind came first (the time is the interpreter's start only).
    assert took < 60


def test_a_cap_alone_lowers_the_default_and_serves():
    s = start_serve("builtin:tiny", "--max-request-tokens", "16", "--default-temperature", "0", port=free_port())
    try:
        body = {"prompt": "Once upon a time", "ignore_eos": True}
        silent = httpx.post(s.url + "/v1/completions", json=body, timeout=60).json()
        assert silent["usage"]["completion_tokens"] == 16 and silent["choices"][0]["finish_reason"] == "length"
        asked = httpx.post(s.url + "/v1/completions", json={**body, "max_tokens": 32000}, timeout=60).json()
        assert asked["usage"]["completion_tokens"] == 16  # clamped to the cap, not refused
    finally:
        assert s.stop() == 0, s.log()[-3000:]
