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
from vllmmlxd.config.schema import ResolvedModel
from vllmmlxd.supervisor.live import push_settings

ALICE, BOB = "alice-tenant-k3y", "bob-tenant-k3y"
MODEL = "builtin:tiny"


def settings(port: int, scope: str = "key") -> ResolvedModel:
    text = f"""
api_keys:
  alice: {{key: {ALICE}}}
  bob: {{key: {BOB}}}
models:
  m: {{model: {MODEL}, served_model_name: m, port: {port}, api_keys: [alice, bob], cache_scope: {scope}}}
"""
    entry = parse_config(text).config.models["m"]
    assert isinstance(entry, ResolvedModel)  # served here, not an upstream
    return entry


def push(sock: Path, config: ResolvedModel) -> None:
    ok, detail = asyncio.run(push_settings(sock, config))
    assert ok, detail


@pytest.fixture(scope="module")
def worker():
    sock = Path(tempfile.mkdtemp(prefix="vllmmlxd-tenants-")) / "w.sock"
    port = free_port()
    worker = start_serve(MODEL, "--health-socket", str(sock), port=port, threads=None)
    push(sock, settings(port))
    yield worker, sock, port
    assert worker.stop() == 0, worker.log()[-3000:]


@pytest.fixture(scope="module")
def urls(worker):
    worker, _, _ = worker
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
        assert his["source"] == MODEL  # a model's name, never the operator's path
    finally:
        thread.join(120)


# ~600 tokens a key's conversations start with: what another key must not learn it sent.
SECRET = "Internal notes. " + " ".join(f"Account {i} holds {i * 37 % 1000} credits." for i in range(60))


def cached(url: str, key: str, text: str, **extra) -> int:
    body = {"model": "m", "messages": [{"role": "user", "content": text}], "max_tokens": 1, **extra}
    r = call(url, key, "POST", "/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


@pytest.mark.parametrize("via", ["worker", "gateway"])
def test_a_key_s_prompts_hit_only_its_own_prefix_cache_unless_the_entry_shares_it(worker, urls, via):
    _, sock, port = worker
    url = urls[via]
    secret = f"{via}: {SECRET} The PIN is 4821."
    template = 32  # a block at most: the chat template's opening, which every conversation of a key shares
    assert cached(url, ALICE, secret) < template
    assert cached(url, BOB, secret.replace("4821", "1111")) < template  # its guess learns nothing
    assert cached(url, ALICE, secret) > 500  # alice's own resend is a hit
    assert cached(url, ALICE, secret, cache_salt="project-b") < template  # her own salt keeps it apart further
    push(sock, settings(port, scope="entry"))  # live: the next requests share the entry's cache
    try:
        assert cached(url, BOB, secret.replace("4821", "1111")) < template  # stored under alice's key
        assert cached(url, BOB, f"{via} shared: {SECRET} Ask 1.") < template
        assert cached(url, ALICE, f"{via} shared: {SECRET} Ask 2.") > 500  # a shared system prompt
    finally:
        push(sock, settings(port))
