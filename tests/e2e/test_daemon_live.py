"""Live settings through the real daemon: an edit that changes only live keys is pushed to
the running worker (same pid, nothing reloaded) while clients stream, and none of them fails."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from tests.support.daemon import free_port, make_daemon, model_entry, wait_gone

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def daemon():
    d = make_daemon()
    yield d
    pids = d.worker_pids()
    d.stop()
    assert wait_gone(pids, 20)


def test_a_rate_limit_change_applies_live_with_the_same_worker_and_no_failed_request(daemon):
    port = free_port()
    daemon.write({"tiny": model_entry(port, rate_limit=0)})
    daemon.start()
    daemon.wait_ready(["tiny"])
    [pid] = daemon.worker_pids()
    url = f"http://127.0.0.1:{port}"
    failures: list[str] = []
    done = threading.Event()
    served = [0]

    def client(n: int) -> None:
        # Each client stays under any limit set below: 4 clients, a request every ~0.5 s or slower.
        with httpx.Client(timeout=60, headers={"authorization": f"Bearer client-{n}"}) as http:
            while not done.is_set():
                try:
                    with http.stream(
                        "POST", url + "/v1/completions", json={"prompt": "Once", "max_tokens": 8, "stream": True}
                    ) as r:
                        body = r.read().decode()
                        if r.status_code != 200 or "[DONE]" not in body:
                            failures.append(f"{r.status_code}: {body[:200]}")
                        served[0] += 1
                except httpx.HTTPError as exc:
                    failures.append(repr(exc))
                time.sleep(0.5)

    threads = [threading.Thread(target=client, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    try:
        served_past(served, len(threads) - 1, failures)  # requests run when the reload lands
        reloaded_after(daemon, lambda: daemon.write({"tiny": model_entry(port, rate_limit=1000)}))
        served_past(served, served[0] + len(threads), failures)
    finally:
        done.set()
        for t in threads:
            t.join(60)
    assert not failures, failures[:5]
    assert served[0] >= 8
    assert daemon.worker_pids() == [pid], "a live key must not start a new worker"
    # The limit is really in force on that same worker: tightened, a burst is cut at 2.
    reloaded_after(daemon, lambda: daemon.write({"tiny": model_entry(port, rate_limit=2)}))
    codes = [
        httpx.post(url + "/v1/completions", json={"prompt": "a", "max_tokens": 1}, timeout=60).status_code
        for _ in range(3)
    ]
    assert codes == [200, 200, 429]
    assert daemon.worker_pids() == [pid] and daemon.log().count("event=worker.spawned") == 1
    assert daemon.models()["tiny"]["state"] == "ready"


def served_past(served: list[int], count: int, failures: list[str], timeout: float = 60) -> None:
    """Wait until more than ``count`` requests are served (or one failed). Past what was served
    and in flight at a reload: at least one request came after it."""
    deadline = time.monotonic() + timeout
    while served[0] <= count and not failures:
        assert time.monotonic() < deadline, f"{served[0]} requests served, not more than {count}"
        time.sleep(0.05)


def reloaded_after(daemon, edit) -> None:
    """Make ``edit`` and wait until the daemon has applied a reload after it."""
    started = time.time()
    edit()

    def applied(_models) -> bool:
        last = (daemon.status() or {}).get("daemon", {}).get("last_reload")
        return bool(last) and last["at"] >= started and last["ok"]

    daemon.wait_for(applied, 60, "the reload")


def test_named_keys_change_on_reload_in_the_same_worker_without_a_failed_request(daemon, tmp_path):
    port = free_port()
    old, new, bob = "alice-old-k3y", "alice-new-k3y", "bob-k3y-in-a-file"
    (tmp_path / "bob.key").write_text(bob + "\n")
    keys = {"alice": {"key": old}, "bob": {"key": f"${{file:{tmp_path / 'bob.key'}}}"}}
    daemon.write({"tiny": model_entry(port, api_keys=["alice"])}, api_keys=keys)
    daemon.start()
    daemon.wait_ready(["tiny"])
    [pid] = daemon.worker_pids()
    url = f"http://127.0.0.1:{port}/v1/completions"
    small = {"prompt": "a", "max_tokens": 1}
    assert httpx.post(url, json=small, headers={"x-api-key": bob}, timeout=60).status_code == 403
    assert daemon.models()["tiny"]["keys"] == ["alice"]

    failures: list[str] = []
    done = threading.Event()
    served = [0]

    def client() -> None:
        # Streams with alice's old key until it is rotated away; the reloads land meanwhile.
        with httpx.Client(timeout=60, headers={"authorization": f"Bearer {old}"}) as http:
            while not done.is_set():
                with http.stream("POST", url, json={"prompt": "Once", "max_tokens": 8, "stream": True}) as r:
                    body = r.read().decode()
                if r.status_code != 200 or "[DONE]" not in body:
                    failures.append(f"{r.status_code}: {body[:200]}")
                served[0] += 1

    threads = [threading.Thread(target=client) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        served_past(served, len(threads) - 1, failures)  # requests run when the reload lands
        reloaded_after(
            daemon, lambda: daemon.write({"tiny": model_entry(port, api_keys=["alice", "bob"])}, api_keys=keys)
        )
        served_past(served, served[0] + len(threads), failures)
    finally:
        done.set()
        for t in threads:
            t.join(60)
    assert not failures, failures[:5]
    assert served[0] >= 3
    assert httpx.post(url, json=small, headers={"x-api-key": bob}, timeout=60).status_code == 200
    status = daemon.ctl("status")
    assert "alice,bob" in status.stdout and daemon.models()["tiny"]["keys"] == ["alice", "bob"]

    # Rotating alice's key: the old one is refused at once, the new one works, same worker.
    rotated = {**keys, "alice": {"key": new}}
    plan = daemon.ctl("reload", "--dry-run")
    reloaded_after(
        daemon, lambda: daemon.write({"tiny": model_entry(port, api_keys=["alice", "bob"])}, api_keys=rotated)
    )
    assert httpx.post(url, json=small, headers={"x-api-key": old}, timeout=60).status_code == 401
    assert httpx.post(url, json=small, headers={"x-api-key": new}, timeout=60).status_code == 200
    assert daemon.worker_pids() == [pid] and daemon.log().count("event=worker.spawned") == 1
    shown = daemon.log() + status.stdout + plan.stdout + daemon.ctl("status", "--json").stdout
    for secret in (old, new, bob):
        assert secret not in shown
