"""Two keys on one worker, directly and through the gateway: neither learns, overwrites or reads
what the other sent (issue 37). The worker starts open and is given a config with two named
keys the way the daemon gives it one (pushed over its private socket); a gateway process routes
to it with both keys' grants.
"""

from __future__ import annotations

import asyncio
import tempfile
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.support.gateway import Gateway
from tests.support.servers import free_port, start_serve
from vllmmlxd.config.keys import key_digest
from vllmmlxd.config.load import parse_config
from vllmmlxd.supervisor.live import push_settings

ALICE, BOB = "alice-tenant-k3y", "bob-tenant-k3y"
MODEL = "builtin:tiny"


@pytest.fixture(scope="module")
def urls():
    sock = Path(tempfile.mkdtemp(prefix="vllmmlxd-tenants-")) / "w.sock"
    port = free_port()
    worker = start_serve(MODEL, "--health-socket", str(sock), port=port, threads=None)
    text = f"""
api_keys:
  alice: {{key: {ALICE}}}
  bob: {{key: {BOB}}}
models:
  m: {{model: {MODEL}, served_model_name: m, port: {port}, api_keys: [alice, bob]}}
"""
    ok, detail = asyncio.run(push_settings(sock, parse_config(text).config.models["m"]))
    assert ok, detail
    grants = [{"name": n, "sha256": key_digest(k), "allowed": True} for n, k in (("alice", ALICE), ("bob", BOB))]
    route = {"name": "m", "served_model_name": "m", "url": worker.url, "state": "ready", "api_keys": ["alice", "bob"]}
    gw_port = free_port()
    gateway = Gateway(
        {"gateway": {"host": "127.0.0.1", "port": gw_port}, "routes": [{**route, "key_grants": grants}], "version": 1},
        gw_port,
    )
    yield {"worker": worker.url, "gateway": gateway.url}
    gateway.proc.terminate()
    gateway.wait()
    assert worker.stop() == 0, worker.log()[-3000:]


def call(url: str, key: str, method: str, path: str, **kw) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}", **kw.pop("headers", {})}
    return httpx.request(method, url + path, headers=headers, timeout=60, **kw)


ASK = {"model": "m", "input": "Say something.", "max_output_tokens": 6, "temperature": 0}


@pytest.mark.parametrize("via", ["worker", "gateway"])
def test_a_response_id_is_the_server_s_own_and_another_key_can_neither_read_nor_replace_it(urls, via):
    url = urls[via]
    mine = call(url, ALICE, "POST", "/v1/responses", json=ASK, headers={"x-request-id": "chosen-by-alice"}).json()
    again = call(url, ALICE, "POST", "/v1/responses", json=ASK, headers={"x-request-id": "chosen-by-alice"}).json()
    assert mine["id"] != again["id"]  # never taken from the client's header
    theirs = call(url, BOB, "POST", "/v1/responses", json={**ASK, "input": "Something else."},
                  headers={"x-request-id": mine["id"]}).json()  # fmt: skip
    assert theirs["id"] != mine["id"]
    got = call(url, ALICE, "GET", f"/v1/responses/{mine['id']}")
    assert got.status_code == 200 and got.json()["output"] == mine["output"]
    for path in (f"/v1/responses/{mine['id']}", f"/v1/responses/{mine['id']}/input_items"):
        assert call(url, BOB, "GET", path).status_code == 404
    assert call(url, BOB, "DELETE", f"/v1/responses/{mine['id']}").status_code == 404
    assert call(url, ALICE, "GET", f"/v1/responses/{mine['id']}").status_code == 200


def test_v1_status_shows_a_key_its_own_requests_only(urls):
    url = urls["worker"]
    body = {"prompt": "Count slowly.", "max_tokens": 400, "ignore_eos": True, "stream": True, "temperature": 0}
    running = threading.Event()

    def stream() -> None:
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=120,
                          headers={"Authorization": f"Bearer {ALICE}", "x-request-id": "alice-secret-1"}) as r:  # fmt: skip
            for _ in r.iter_lines():
                running.set()

    thread = threading.Thread(target=stream)
    thread.start()
    try:
        assert running.wait(60)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            hers = call(url, ALICE, "GET", "/v1/status").json()["requests"]
            if hers:
                break
        assert [r["request_id"] for r in hers] == ["alice-secret-1"]
        his = call(url, BOB, "GET", "/v1/status").json()
        assert his["requests"] == [] and "alice-secret-1" not in str(his)
    finally:
        thread.join(120)
