"""Bad input on a real worker: each gets a 4xx naming the problem, and the worker keeps
answering (the first points of the hardening work; the rest come with named keys)."""

from __future__ import annotations

import concurrent.futures as cf
import time

import httpx
import pytest

from tests.support.servers import start_serve

MSGS = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def server():
    s = start_serve("builtin:tiny", "--timeout", "60")
    yield s
    assert s.stop() == 0, s.log()[-3000:]


@pytest.mark.parametrize("extra,param", [
    ({"chat_template_kwargs": {"chat_template": "{% for i in range(100000000) %}x{% endfor %}"}},
     "chat_template_kwargs.chat_template"),
    ({"chat_template_kwargs": {"padding": "max_length", "max_length": 2**31}}, "chat_template_kwargs.padding"),
    ({"chat_template_kwargs": {"enable_thinking": ["x"] * 3}}, "chat_template_kwargs.enable_thinking"),
    ({"logit_bias": {"--5": 1}}, "logit_bias"),
    ({"logit_bias": {"²": 1}}, "logit_bias"),
    ({"seed": 2**64}, "seed"),
    ({"seed": -(2**63) - 1}, "seed"),
    ({"stop": ["x" * 1000]}, "stop"),
])
def test_a_hostile_parameter_is_a_400_naming_it(server, extra, param):
    started = time.monotonic()
    r = httpx.post(server.url + "/v1/chat/completions", json={"messages": MSGS, "max_tokens": 2, **extra}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    assert time.monotonic() - started < 5
    assert httpx.get(server.url + "/health", timeout=5).status_code == 200


@pytest.mark.parametrize("extra", [{"top_k": 10**9}, {"seed": -1}, {"seed": 2**64 - 1},
                                   {"chat_template_kwargs": {"enable_thinking": False}}])
def test_edge_values_that_mean_something_are_served(server, extra):
    r = httpx.post(server.url + "/v1/chat/completions", json={"messages": MSGS, "max_tokens": 2, **extra}, timeout=30)
    assert r.status_code == 200, r.text


def test_a_large_conversation_renders_without_stalling_health(server):
    # ~15 MB of messages: rendered off the event loop, so /health keeps answering meanwhile.
    big = [{"role": "user", "content": "word " * 1000}] * 3000
    with cf.ThreadPoolExecutor(1) as pool:
        fut = pool.submit(httpx.post, server.url + "/v1/chat/completions",
                          json={"messages": big, "max_tokens": 1}, timeout=120)
        worst = 0.0
        while not fut.done():
            started = time.monotonic()
            assert httpx.get(server.url + "/health", timeout=10).status_code == 200
            worst = max(worst, time.monotonic() - started)
            time.sleep(0.05)
        r = fut.result()
    assert r.status_code in (400, 413), r.text  # longer than the context (or the body cap): a 4xx either way
    assert worst < 2.0, worst
