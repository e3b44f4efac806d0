"""Slow and greedy clients against a real worker, over raw sockets: slow heads and stalled
bodies are cut off (2 s here, by the environment), oversized heads refused, connections past
max_connections get 503, and the worker keeps answering throughout."""

from __future__ import annotations

import contextlib
import select
import socket
import time

import httpx
import pytest

from tests.support.servers import start_serve

MODEL = "builtin:tiny"
FAST = {"VLLMMLXD_HEADER_TIMEOUT_S": "2", "VLLMMLXD_BODY_TIMEOUT_S": "2"}
BOUND = 30.0  # generous: the timeouts are 2 s, the machine may be busy
CHAT = b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1'


@pytest.fixture(scope="module")
def server():
    s = start_serve(MODEL, env=FAST)
    yield s
    assert s.stop() == 0, s.log()[-3000:]


@pytest.fixture(scope="module")
def small():
    s = start_serve(MODEL, "--max-connections", "3", "--rate-limit", "2")  # the default 10 s head timeout
    yield s
    assert s.stop() == 0, s.log()[-3000:]


def connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=BOUND)


def read_answer(sock: socket.socket) -> bytes:
    """What the server sends until it closes the connection (b"" when it closes silently)."""
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except ConnectionResetError:
        pass
    return data


def head(method: str, path: str, port: int, extra: str = "") -> bytes:
    return f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{extra}".encode()


def test_slow_request_heads_are_cut_off_while_health_answers(server):
    socks = [connect(server.port) for _ in range(20)]
    for sock in socks:
        sock.sendall(head("GET", "/health", server.port, "X-Slow: "))
    open_, answers, started = set(socks), {}, time.monotonic()
    while open_ and time.monotonic() - started < BOUND:
        for sock in list(open_):  # one more byte each, never the end of the head
            with contextlib.suppress(OSError):
                sock.sendall(b"a")
        readable, _, _ = select.select(list(open_), [], [], 0.2)
        for sock in readable:
            answers[sock] = read_answer(sock)
            open_.discard(sock)
        assert httpx.get(server.url + "/health", timeout=10).status_code == 200
    assert not open_, f"{len(open_)} slow connections still open after {BOUND} s"
    for sock in socks:
        sock.close()
    assert all(a.startswith(b"HTTP/1.1 408 ") for a in answers.values()), set(answers.values())


def test_a_stalled_body_gets_a_408_and_a_closed_connection(server):
    with connect(server.port) as sock:
        sock.sendall(
            head(
                "POST",
                "/v1/chat/completions",
                server.port,
                "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n",
            )
            + CHAT[:20]
        )
        answer = read_answer(sock)  # returns once the server closes; the socket timeout is BOUND
    assert answer.startswith(b"HTTP/1.1 408 ") and b"body" in answer, answer
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200
    assert "request.failed" not in server.log()  # the route saw a client gone, not an error


def test_a_large_body_that_keeps_coming_is_not_cut_off(server):
    # 400 KiB in pieces over about 3 s, longer than the 2 s body timeout: the pace earns time.
    body = CHAT + b" " * (400 * 1024) + b"}"
    with connect(server.port) as sock:
        sock.sendall(
            head(
                "POST",
                "/v1/chat/completions",
                server.port,
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n",
            )
        )
        for i in range(0, len(body), 40 * 1024):
            sock.sendall(body[i : i + 40 * 1024])
            time.sleep(0.3)
        answer = read_answer(sock)
    assert not answer.startswith(b"HTTP/1.1 408"), answer[:300]
    assert answer.startswith(b"HTTP/1.1 200 ") and b'"choices"' in answer, answer[:300]


def test_an_oversized_head_is_refused_and_the_worker_lives(server):
    with connect(server.port) as sock:
        try:
            sock.sendall(head("GET", "/health", server.port, "X-Big: " + "a" * (100 * 1024) + "\r\n\r\n"))
        except OSError:  # refused and closed while still sending
            answer = b""
        else:
            answer = read_answer(sock)
    assert answer == b"" or answer.startswith(b"HTTP/1.1 431 "), answer[:300]
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200
    # A large head under the 64 KiB cap is served.
    r = httpx.get(server.url + "/health", headers={"x-large": "a" * (40 * 1024)}, timeout=10)
    assert r.status_code == 200


def test_forwarded_for_does_not_name_the_client(small):
    # --rate-limit 2: a client that claims new addresses does not get new budgets.
    codes = [
        httpx.get(small.url + "/v1/models", headers={"x-forwarded-for": f"10.0.0.{i}"}, timeout=10).status_code
        for i in range(4)
    ]
    assert codes[:2] == [200, 200] and 429 in codes[2:], codes


def test_connections_past_max_connections_get_503(small):
    held = [connect(small.port) for _ in range(3)]  # idle: the default 10 s head timeout keeps them
    deadline = time.monotonic() + BOUND
    while (r := httpx.get(small.url + "/health", timeout=10)).status_code != 503:  # until the three are accepted
        assert time.monotonic() < deadline, r.text
        time.sleep(0.1)
    assert r.text == "Service Unavailable", r.text
    held.pop().close()
    deadline = time.monotonic() + BOUND
    while (code := httpx.get(small.url + "/health", timeout=10).status_code) == 503 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert code == 200
    for sock in held:
        sock.close()
