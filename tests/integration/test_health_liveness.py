"""A worker whose engine thread stops stepping says so on /health (503 degraded), then recovers.

The stall is the test-only hook ``VLLMMLXD_TEST_STALL_ENGINE_S`` (worker/testing.py): the
engine thread's first step sleeps, as a hung Metal call would block it.
"""

from __future__ import annotations

import threading
import time

import httpx

from tests.support.servers import start_serve


def test_a_stalled_engine_is_degraded_then_ok_again():
    s = start_serve("builtin:tiny", env={"VLLMMLXD_STUCK_AFTER_S": "1", "VLLMMLXD_TEST_STALL_ENGINE_S": "5"})
    try:
        assert httpx.get(s.url + "/health").json()["status"] == "ok"  # idle: nothing waits
        result: list[int] = []
        body = {"prompt": "x", "max_tokens": 3, "ignore_eos": True}
        t = threading.Thread(
            target=lambda: result.append(httpx.post(s.url + "/v1/completions", json=body, timeout=60).status_code)
        )
        t.start()
        seen = []
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and t.is_alive():
            r = httpx.get(s.url + "/health")
            seen.append((r.status_code, r.json()["status"]))
            time.sleep(0.2)
        t.join(30)
        assert (503, "degraded") in seen, seen
        assert result == [200]
        r = httpx.get(s.url + "/health")
        assert (r.status_code, r.json()["status"]) == (200, "ok")
    finally:
        assert s.stop() == 0, s.log()[-3000:]
