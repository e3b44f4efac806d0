"""Bad input on a real worker: each gets a 4xx naming the problem, and the worker keeps
answering (the first points of the hardening work; the rest come with named keys)."""

from __future__ import annotations

import concurrent.futures as cf
import time
from pathlib import Path

import httpx
import pytest

from tests.support.servers import start_serve

MSGS = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def server():
    s = start_serve("builtin:tiny", "--timeout", "60")
    yield s
    assert s.stop() == 0, s.log()[-3000:]


@pytest.mark.parametrize(
    "extra,param",
    [
        (
            {"chat_template_kwargs": {"chat_template": "{% for i in range(100000000) %}x{% endfor %}"}},
            "chat_template_kwargs.chat_template",
        ),
        ({"chat_template_kwargs": {"padding": "max_length", "max_length": 2**31}}, "chat_template_kwargs.padding"),
        ({"chat_template_kwargs": {"enable_thinking": ["x"] * 3}}, "chat_template_kwargs.enable_thinking"),
        ({"logit_bias": {"--5": 1}}, "logit_bias"),
        ({"logit_bias": {"²": 1}}, "logit_bias"),
        ({"seed": 2**64}, "seed"),
        ({"seed": -(2**63) - 1}, "seed"),
        ({"stop": ["x" * 1000]}, "stop"),
    ],
)
def test_a_hostile_parameter_is_a_400_naming_it(server, extra, param):
    started = time.monotonic()
    r = httpx.post(server.url + "/v1/chat/completions", json={"messages": MSGS, "max_tokens": 2, **extra}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    assert time.monotonic() - started < 5
    assert httpx.get(server.url + "/health", timeout=5).status_code == 200


@pytest.mark.parametrize(
    "extra", [{"top_k": 10**9}, {"seed": -1}, {"seed": 2**64 - 1}, {"chat_template_kwargs": {"enable_thinking": False}}]
)
def test_edge_values_that_mean_something_are_served(server, extra):
    r = httpx.post(server.url + "/v1/chat/completions", json={"messages": MSGS, "max_tokens": 2, **extra}, timeout=30)
    assert r.status_code == 200, r.text


def test_a_large_conversation_renders_without_stalling_health(server):
    # ~1.5 MB of messages (a second or more of rendering and counting here): rendered off the event
    # loop, so /health keeps answering meanwhile, many times over; on the loop, it would answer once.
    big = [{"role": "user", "content": "word " * 1000}] * 300
    with cf.ThreadPoolExecutor(1) as pool:
        fut = pool.submit(
            httpx.post, server.url + "/v1/chat/completions", json={"messages": big, "max_tokens": 1}, timeout=120
        )
        worst, answers = 0.0, 0
        while not fut.done():
            started = time.monotonic()
            assert httpx.get(server.url + "/health", timeout=10).status_code == 200
            worst, answers = max(worst, time.monotonic() - started), answers + 1
            time.sleep(0.05)
        r = fut.result()
    assert r.status_code in (400, 413), r.text  # longer than the context (or the body cap): a 4xx either way
    assert worst < 2.0 and answers >= 3, (worst, answers)


KEY = "sk-hardening-test-key"


@pytest.fixture(scope="module")
def keyed(tmp_path_factory):
    key_file = tmp_path_factory.mktemp("key") / "key"
    key_file.write_text(KEY + "\n")
    s = start_serve("builtin:tiny", "--api-key-file", str(key_file), "--enable-metrics", "--host", "0.0.0.0")
    yield s
    assert s.stop() == 0, s.log()[-3000:]


def test_a_key_from_a_file_works_and_never_shows_in_ps_or_logs(keyed):
    url = keyed.url + "/v1/models"
    assert httpx.get(url).status_code == 401
    assert httpx.get(url, headers={"authorization": f"Bearer {KEY}"}).status_code == 200
    proc = Path(f"/proc/{keyed.proc.pid}/cmdline")
    cmdline = proc.read_bytes() if proc.exists() else b""
    assert KEY.encode() not in cmdline and KEY not in keyed.log()
    # Bound beyond loopback with a key: no warning about an open model.
    assert "worker.open_to_network" not in keyed.log()


def test_an_open_model_bound_beyond_loopback_is_warned_about():
    s = start_serve("builtin:tiny", "--host", "0.0.0.0", env={"VLLMMLXD_API_KEY": ""})
    try:
        assert "event=worker.open_to_network" in s.log() and "level=warning" in s.log()
    finally:
        assert s.stop() == 0


def test_every_route_but_health_and_metrics_needs_the_key(keyed):
    """Routes enumerated from the app itself: a new route cannot be left open by mistake."""
    from tests.unit.http.test_metrics import FakeEngine  # a stand-in engine: only the routes are read
    from vllmmlxd.config.schema import ResolvedModel
    from vllmmlxd.worker.app import create_app

    app = create_app(FakeEngine(), ResolvedModel(model="x", api_key=KEY, enable_metrics=True), "m")
    # The OpenAPI view lists every route, those of included routers too.
    routes = [(path, method.upper()) for path, ops in app.openapi()["paths"].items() for method in ops]
    assert ("/v1/messages", "POST") in routes and ("/v1/chat/completions", "POST") in routes
    for path, method in routes:
        concrete = path.replace("{model_id}", "anything")
        r = httpx.request(method, keyed.url + concrete, json={})
        if path in ("/health", "/metrics"):
            assert r.status_code == 200, (path, r.status_code)
        else:
            assert r.status_code == 401, (method, path, r.status_code, r.text[:200])


@pytest.mark.parametrize(
    "method,path",
    [
        ("POST", "//v1/chat/completions"),
        ("GET", "/v1/../v1/models"),
        ("GET", "/v1/models/"),
        ("GET", "/v1%2Fmodels"),
        ("HEAD", "/v1/models"),
        ("OPTIONS", "/v1/chat/completions"),
        ("GET", "/V1/models"),
        ("POST", "/v1/messages/"),
    ],
)
def test_path_tricks_do_not_get_past_the_key(keyed, method, path):
    r = httpx.request(method, keyed.url + path, json={"messages": MSGS} if method == "POST" else None)
    assert r.status_code in (401, 404, 405, 307), (method, path, r.status_code)
    if r.status_code == 307:  # a trailing slash: sent to the route itself, which asks for the key
        assert r.headers["location"].endswith(path.rstrip("/"))
        assert (
            httpx.request(method, keyed.url + path, json={"messages": MSGS}, follow_redirects=True).status_code == 401
        )
    if r.status_code != 401:  # not served
        assert "choices" not in r.text and '"data"' not in r.text
