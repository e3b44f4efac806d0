"""Hostile bytes on every route of a real worker: arbitrary JSON values (deep, huge, NaN and
infinities as raw text, lone surrogate escapes), bytes that are no UTF-8, empty bodies and
wrong content types, alone or put into an otherwise valid request.

Whatever arrives, the answer is never a 5xx, an error is in its route family's shape, and the
worker answers /health after each route's batch. Routes are read from the worker's own
description, so a new one is fuzzed without a change here.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

import httpx
import hypothesis
import pytest
from hypothesis import strategies as st

from tests.fuzz.worker import AUTH, DERANDOMIZE, MAX_EXAMPLES, assert_alive, assert_error_shape, described, start_worker

DESCRIPTION = described()
ROUTES = [(method.upper(), path) for path, ops in DESCRIPTION["paths"].items() for method in ops]
HI = [{"role": "user", "content": "hi"}]
# A request each body route serves, so a fuzzed field reaches the code past validation.
VALID: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {"messages": HI, "max_tokens": 2},
    "/v1/completions": {"prompt": "hi", "max_tokens": 2},
    "/v1/messages": {"messages": HI, "max_tokens": 2},
    "/v1/messages/count_tokens": {"messages": HI},
}
CONTENT_TYPES = [
    "application/json",
    "application/json; charset=utf-8",
    "application/vnd.x+json",
    "",
    "text/plain",
    "application/x-www-form-urlencoded",
    "multipart/form-data; boundary=x",
    "application/json; charset=latin-1",
]


class Raw(str):
    """JSON text put into a body as is: what ``json.dumps`` would never write."""


RAW = st.sampled_from(
    [
        "NaN",
        "Infinity",
        "-Infinity",
        "1e999",
        "-1e999",
        "1" + "0" * 5000,
        "-0",
        "1E-400",
        '"\\ud800"',
        '"a\\udfffb"',
        '"\\ud83d\\ude00"',
        '"\\u0000"',
        '"\\uDBFF\\u0041"',
    ]
).map(Raw)
DEEP = st.sampled_from([50, 500, 5000, 100_000]).flatmap(
    lambda n: st.sampled_from([Raw("[" * n + "]" * n), Raw('{"a":' * n + "1" + "}" * n)])
)
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=2**63 - 2, max_value=2**64 + 2)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=30)
    | RAW
)
VALUES = (
    st.recursive(
        SCALARS,
        lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4),
        max_leaves=12,
    )
    | DEEP
)


def dumps(value: object) -> str:
    """``json.dumps``, with ``Raw`` pieces left as written."""
    if isinstance(value, Raw):
        return str(value)
    if isinstance(value, list):
        return "[" + ",".join(dumps(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(json.dumps(k) + ":" + dumps(v) for k, v in value.items()) + "}"
    return json.dumps(value)


def fields(path: str) -> list[str]:
    """The body fields the description declares for ``path``, to put hostile values into."""
    op = DESCRIPTION["paths"][path].get("post", {})
    ref = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema", {}).get("$ref")
    if not ref:
        return []
    return sorted(DESCRIPTION["components"]["schemas"][ref.rsplit("/", 1)[1]].get("properties", {}))


@st.composite
def bodies(draw, path: str) -> bytes:
    """One hostile body for ``path``: a valid request with one field (or the message) replaced,
    any JSON value, or bytes."""
    kind = draw(
        st.sampled_from(
            ["field", "message", "value", "bytes", "empty"] if path in VALID else ["value", "bytes", "empty"]
        )
    )
    if kind == "field":
        body = dict(VALID[path])
        body[draw(st.sampled_from([*fields(path), "unknown_field"]))] = draw(VALUES)
        return dumps(body).encode()
    if kind == "message":
        key = "prompt" if path == "/v1/completions" else "messages"
        body = dict(VALID[path])
        body[key] = draw(
            st.sampled_from(
                [
                    [{"role": "user", "content": draw(VALUES)}],
                    [
                        {
                            "role": draw(st.sampled_from(["user", "assistant", "system", "tool", "developer", "x"])),
                            "content": [draw(VALUES)],
                        }
                    ],
                    draw(VALUES),
                ]
            )
        )
        return dumps(body).encode()
    if kind == "value":
        return dumps(draw(VALUES)).encode()
    if kind == "bytes":  # often not UTF-8, sometimes a JSON object cut short by bad bytes
        return draw(st.binary(max_size=64) | st.binary(max_size=16).map(lambda b: b'{"messages": "' + b + b'"}'))
    return b""


@pytest.fixture(scope="module")
def worker():
    s = start_worker()
    yield s
    assert s.stop() == 0, s.log()[-3000:]


@pytest.mark.parametrize("method,path", ROUTES, ids=[f"{m} {p}" for m, p in ROUTES])
def test_a_hostile_request_is_never_a_server_error(worker, method, path):
    @hypothesis.settings(
        max_examples=2 * MAX_EXAMPLES,
        deadline=None,
        derandomize=DERANDOMIZE,
        database=None,
        suppress_health_check=list(hypothesis.HealthCheck),
    )
    @hypothesis.given(
        body=bodies(path),
        content_type=st.sampled_from(CONTENT_TYPES),
        keyed=st.sampled_from([True, True, True, False]),  # mostly past the key check
        model_id=st.text(max_size=12),
    )
    def check(body, content_type, keyed, model_id):
        url = worker.url + path.replace("{model_id}", quote(model_id or "x", safe=""))
        headers = {**(AUTH if keyed else {}), **({"content-type": content_type} if content_type else {})}
        r = httpx.request(method, url, content=body, headers=headers, timeout=60)
        assert r.status_code < 500, (r.status_code, body[:200], content_type, r.text[:300])
        if r.status_code >= 400 and not (path == "/health" or (path == "/metrics" and r.status_code == 404)):
            assert_error_shape(path, r.json())

    check()
    assert_alive(worker)


def test_no_request_failed_on_the_server(worker):
    # Run last: a 500 the assertions above missed (a stream's error frame) still shows in the log.
    assert_alive(worker)
    assert "event=request.failed" not in worker.log(), worker.log()[-3000:]
