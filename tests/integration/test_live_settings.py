"""Live settings on a real worker (`vllmmlxd serve builtin:tiny --health-socket PATH`): pushed
over the private socket with the daemon's own helper, applied between requests, same process."""

from __future__ import annotations

import asyncio
import tempfile
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.support.servers import free_port, start_serve, version_fields
from vllmmlxd.config.schema import ResolvedModel
from vllmmlxd.supervisor.live import push_settings

KEY = "live-s3cret-key-one"
NEW_KEY = "live-s3cret-key-two"
MODEL = "builtin:tiny"


@pytest.fixture
def worker():
    folder = Path(tempfile.mkdtemp(prefix="vllmmlxd-live-"))
    sock = folder / "w.sock"
    port = free_port()
    s = start_serve(
        MODEL, "--api-key", KEY, "--rate-limit", "10000", "--health-socket", str(sock), port=port, threads=None
    )
    base = ResolvedModel(model=MODEL, served_model_name=MODEL, port=port, api_key=KEY, rate_limit=10000)
    yield s, sock, base
    assert s.stop() == 0, s.log()[-3000:]
    log = s.log()
    assert KEY not in log and NEW_KEY not in log


def private(sock: Path, method: str, path: str, **kw) -> httpx.Response:
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)), base_url="http://worker", timeout=10) as c:
        return c.request(method, path, **kw)


def push(sock: Path, config: ResolvedModel) -> tuple[bool, str | None]:
    return asyncio.run(push_settings(sock, config))


def test_private_health_reports_load_and_the_config_hash_and_the_public_port_has_no_settings_route(worker):
    s, sock, base = worker
    body = private(sock, "GET", "/health").json()
    assert body["status"] == "ok" and body["config_hash"] == base.config_hash()
    assert {"running", "waiting", "cache_mb"} <= set(body["load"]) and "blas" in body["runtime"]
    public = httpx.get(s.url + "/health").json()
    assert public == {"status": "ok", "model": MODEL, **version_fields()}  # no hash, load or runtime on the public port
    r = httpx.post(
        s.url + "/internal/settings", content=base.to_worker_json(), headers={"Authorization": f"Bearer {KEY}"}
    )
    assert r.status_code == 404


def test_a_pushed_rate_limit_applies_in_the_same_process_with_no_failed_request_under_load(worker):
    s, sock, base = worker
    pid = s.proc.pid
    auth = {"Authorization": f"Bearer {KEY}"}
    failures: list[str] = []
    done = threading.Event()
    served = [0]

    def load() -> None:
        with httpx.Client(timeout=60) as client:
            while not done.is_set():
                body = {"prompt": "x", "max_tokens": 12, "ignore_eos": True, "stream": True}
                try:
                    with client.stream("POST", s.url + "/v1/completions", json=body, headers=auth) as r:
                        text = "".join(r.iter_text())
                    if r.status_code != 200 or not text.rstrip().endswith("data: [DONE]"):
                        failures.append(f"{r.status_code}: {text[-200:]}")
                    served[0] += 1
                except httpx.HTTPError as exc:
                    failures.append(repr(exc))

    threads = [threading.Thread(target=load) for _ in range(4)]
    for t in threads:
        t.start()
    try:
        while served[0] < 4 and not failures:  # the pushes land while requests run
            threading.Event().wait(0.05)
        configs = [
            base.model_copy(update={"rate_limit": 9000 - i, "timeout": 100.0 + i, "owned_by": f"o{i}"})
            for i in range(5)
        ]
        for config in configs:
            assert push(sock, config) == (True, config.config_hash())
            # More served than were in flight at the push: at least one ran under the new settings.
            after = served[0] + len(threads)
            deadline = time.monotonic() + 60
            while served[0] <= after and not failures:
                assert time.monotonic() < deadline, "no request served after a push"
                threading.Event().wait(0.05)
    finally:
        done.set()
        for t in threads:
            t.join(60)
    assert not failures, failures[:3]
    assert served[0] >= 4
    assert s.proc.poll() is None and s.proc.pid == pid
    assert httpx.get(s.url + "/v1/models", headers=auth).json()["data"][0]["owned_by"] == "o4"

    # The new limit holds from the next request: a limit of 2 is a fresh budget of 2.
    limited = base.model_copy(update={"rate_limit": 2})
    assert push(sock, limited)[0]
    small = {"prompt": "x", "max_tokens": 2}
    codes = [httpx.post(s.url + "/v1/completions", json=small, headers=auth).status_code for _ in range(3)]
    assert codes == [200, 200, 429]
    assert private(sock, "GET", "/health").json()["config_hash"] == limited.config_hash()
    assert "event=settings.applied" in s.log()


def test_a_new_key_locks_out_the_old_one_and_names_never_values_in_errors(worker):
    s, sock, base = worker
    rotated = ResolvedModel.model_validate({**base.model_dump(), "api_key": NEW_KEY})  # as the daemon's config holds it
    ok, config_hash = push(sock, rotated)
    assert ok and config_hash == rotated.config_hash()
    small = {"prompt": "x", "max_tokens": 2}
    assert (
        httpx.post(s.url + "/v1/completions", json=small, headers={"Authorization": f"Bearer {KEY}"}).status_code == 401
    )
    assert httpx.post(s.url + "/v1/completions", json=small, headers={"x-api-key": NEW_KEY}).status_code == 200

    # A key that needs a new worker is refused, and nothing changes.
    ok, reason = push(sock, rotated.model_copy(update={"port": 1, "max_num_seqs": 3}))
    assert not ok and "409" in reason and "max_num_seqs" in reason and "port" in reason
    assert private(sock, "GET", "/health").json()["config_hash"] == rotated.config_hash()
    # An invalid entry is a 422 that does not echo the values sent.
    r = private(
        sock, "POST", "/internal/settings", json={**rotated.model_dump(mode="json"), "api_key": NEW_KEY, "timeout": -1}
    )
    assert r.status_code == 422 and "timeout" in r.json()["error"] and NEW_KEY not in r.text
    assert NEW_KEY not in (reason or "")
