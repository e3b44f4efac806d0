"""server.py: routes and status codes, the socket's safety, and leaving the daemon's signals alone."""

from __future__ import annotations

import asyncio
import errno
import json
import signal
import socket
import time

import httpx
import pytest

from tests.support.control import ControlThread, FakeTarget, short_tmp_dir
from vllmmlxd.control.protocol import ReloadResponse
from vllmmlxd.control.server import make_control_app, serve_control


@pytest.fixture
def sock_dir():
    with short_tmp_dir() as d:
        yield d


@pytest.fixture
def target() -> FakeTarget:
    return FakeTarget()


@pytest.fixture
def http(target, sock_dir):
    with (
        ControlThread(target, sock_dir / "c.sock") as running,
        httpx.Client(transport=httpx.HTTPTransport(uds=str(running.path)), base_url="http://vllmmlxd") as client,
    ):
        yield client


def test_status(http):
    r = http.get("/status")
    assert r.status_code == 200
    assert [m["name"] for m in r.json()["models"]] == ["a", "b"]


def test_a_failed_reload_is_409_with_the_reload_body(http, target):
    target.reload_response = ReloadResponse(ok=False, dry_run=False, plan="", error="c.yaml:1:1: bad")
    r = http.post("/reload", params={"dry_run": "true"})
    assert r.status_code == 409
    assert r.json() == {
        "ok": False,
        "dry_run": True,
        "plan": "",
        "error": "c.yaml:1:1: bad",
        "config_path": None,
        "entries": [],
    }
    assert target.calls == [("reload", True)]


def test_unknown_model_is_404_listing_the_models(http):
    r = http.post("/models/x/restart")
    assert (r.status_code, r.json()) == (404, {"error": "no model named 'x'; models: a, b"})
    assert http.get("/models/x/logs", params={"follow": "true"}).status_code == 404


def test_any_key_error_for_a_name_not_configured_is_a_404(http, target):
    async def restart(name):
        raise KeyError(f"no model named {name!r}")  # the message, not just the name

    target.restart = restart
    assert http.post("/models/x/restart").status_code == 404


def test_bad_parameters_get_an_error_body(http):
    r = http.get("/models/a/logs", params={"lines": "many"})
    assert r.status_code == 422 and "lines" in r.json()["error"]
    assert http.post("/models/a/explode").status_code == 422


def test_a_key_error_that_is_not_the_models_name_is_a_500(http, target):
    def broken(name, lines):
        raise KeyError("internal")

    target.logs = broken
    r = http.get("/models/a/logs")
    assert r.status_code == 500 and "KeyError" in r.json()["error"]


def test_logs_as_json_and_as_a_text_stream(http):
    assert http.get("/models/a/logs", params={"lines": 2}).json() == {"lines": ["line 8", "line 9"]}
    r = http.get("/models/a/logs", params={"lines": 1, "follow": "true"})
    assert r.headers["content-type"].startswith("text/plain")
    assert r.text == "line 9\nnew 1\nnew 2\n"


def test_a_stale_socket_file_is_replaced(target, sock_dir):
    path = sock_dir / "c.sock"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(path))
    with ControlThread(target, path):
        assert httpx.Client(transport=httpx.HTTPTransport(uds=str(path))).get("http://x/status").status_code == 200


def test_a_live_socket_is_not_taken_over(target, sock_dir):
    path = sock_dir / "c.sock"
    with ControlThread(target, path) as first:
        with pytest.raises(OSError) as info:
            first.run(serve_control(make_control_app(target), path))
        assert info.value.errno == errno.EADDRINUSE and str(path) in str(info.value)
        assert path.is_socket()


def test_a_file_that_is_not_a_socket_is_left_alone(target, sock_dir):
    path = sock_dir / "c.sock"
    path.write_text("mine")
    with pytest.raises(FileExistsError):
        asyncio.run(serve_control(make_control_app(target), path))
    assert path.read_text() == "mine"


def test_serving_in_the_main_thread_leaves_signal_handlers_alone(target, sock_dir):
    def handlers():
        return {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}

    async def scenario():
        before = handlers()  # asyncio.run's own SIGINT handler included
        # Returned once uvicorn has started, which it does inside its signal capture: past where it would install them.
        server = await serve_control(make_control_app(target), sock_dir / "c.sock")
        during = handlers()
        await server.stop()
        return before, during, handlers()

    before, during, after = asyncio.run(scenario())
    assert during == before and after == before


def test_stop_does_not_wait_forever_for_a_follower(target, sock_dir):
    target.follow_forever = True
    with ControlThread(target, sock_dir / "c.sock") as running:
        client = httpx.Client(transport=httpx.HTTPTransport(uds=str(running.path)), timeout=10)
        with client.stream("GET", "http://x/models/a/logs", params={"follow": "true", "lines": 0}) as r:
            assert next(r.iter_lines()) == "new 1"
            started = time.monotonic()
            running.run(running.server.stop())
            assert time.monotonic() - started < 5
        client.close()
    assert target.follow_closed.wait(5)


def test_a_file_is_read_only_for_a_dry_run(http, target):
    r = http.post("/reload", params={"file": "/tmp/other.yaml"})
    assert r.status_code == 422 and "dry run" in r.json()["error"] and target.calls == []


# -- the model store -----------------------------------------------------------------------------------


def test_a_pull_is_started_with_its_source_read_and_followed_as_json_lines(http, target):
    r = http.post("/store/pulls", json={"source": "https://huggingface.co/org/m/tree/v2"})
    assert r.status_code == 200 and r.json()["state"] == "resolving"
    assert target.calls == [("pull", "org/m", "v2")]
    r = http.get("/store/pulls/p1", params={"follow": "true"})
    assert r.headers["content-type"] == "application/x-ndjson"
    lines = [json.loads(line) for line in r.text.splitlines()]
    assert [(s["state"], s["done_bytes"]) for s in lines] == [
        ("resolving", 0),
        ("downloading", 1_000_000_000),
        ("downloading", 4_000_000_000),
        ("done", 4_000_000_000),
    ]
    assert http.get("/store/pulls/p1").json()["state"] == "done"
    assert [p["id"] for p in http.get("/store/pulls").json()["pulls"]] == ["p1"]


def test_a_source_that_names_no_model_is_422_and_a_conflict_409(http, target):
    r = http.post("/store/pulls", json={"source": "not a repo"})
    assert r.status_code == 422 and "is not a Hugging Face model repo id (org/name)" in r.json()["error"]
    assert http.post("/store/pulls", json={}).status_code == 422
    target.pull_conflict = "org/m@v1 is being pulled (p1): wait for it"
    r = http.post("/store/pulls", json={"source": "org/m", "revision": "v2"})
    assert (r.status_code, r.json()) == (409, {"error": "org/m@v1 is being pulled (p1): wait for it"})


def test_an_unknown_pull_is_404_and_a_cancel_answers_the_pulls_end(http, target):
    assert http.get("/store/pulls/nope", params={"follow": "true"}).status_code == 404
    assert http.get("/store/pulls/nope").status_code == 404
    assert http.delete("/store/pulls/nope").status_code == 404
    r = http.delete("/store/pulls/p1")
    assert r.status_code == 200 and r.json()["state"] == "cancelled"


def test_the_store_lists_and_removes_models_refusing_one_in_use(http, target):
    assert [m["name"] for m in http.get("/store").json()["models"]] == ["org/m", "builtin:tiny"]
    r = http.delete("/store/models/builtin:tiny")
    assert (r.status_code, r.json()) == (409, {"error": "builtin:tiny is in use by a"})
    assert http.delete("/store/models/org%2Fnone").status_code == 404
    r = http.delete("/store/models/org/m")  # a repo id's '/' as it is, or quoted
    assert r.status_code == 200 and r.json()["message"] == "removed org/m (4.00 GB)"
    assert ("remove", "org/m") in target.calls


def test_a_pull_past_the_daemon_s_caps_is_503_saying_why(http, target):
    target.pulls_busy = (
        "2 pulls are running and 8 waiting (max_pulls: 2, max_waiting_pulls: 8): pull org/m once some have ended"
    )
    r = http.post("/store/pulls", json={"source": "org/m"})
    assert r.status_code == 503 and "max_waiting_pulls: 8" in r.json()["error"]
