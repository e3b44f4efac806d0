"""Schema-driven fuzzing of a real worker: cases generated from the worker's own OpenAPI
description (valid bodies and invalid ones), sent over HTTP, with the key and without.

Whatever a request holds, the answer is never a 5xx, its status is one the description declares,
and its body has the declared content type and shape; a guarded route refuses a missing or wrong key.
"""

from __future__ import annotations

import httpx
import hypothesis
import pytest
import schemathesis
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    ignored_auth,
    response_schema_conformance,
    status_code_conformance,
)

from tests.fuzz.worker import DERANDOMIZE, KEY, MAX_EXAMPLES, assert_alive, described, start_worker

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    ignored_auth,
]
# Bounded, and the same cases on every run unless VLLMMLXD_FUZZ_RANDOM is set.
SETTINGS = hypothesis.settings(
    max_examples=MAX_EXAMPLES,
    deadline=None,
    derandomize=DERANDOMIZE,
    database=None,
    suppress_health_check=list(hypothesis.HealthCheck),
)

keyed = schemathesis.openapi.from_dict(described())
# The key is sent as given below; a made-up x-api-key beside it would only blur which one counted.
keyed.config.generation.update(with_security_parameters=False)


@keyed.auth()
class TheKey:
    """The worker's key on every keyed case (what schemathesis counts as the caller's own auth)."""

    def get(self, case, context):
        return KEY

    def set(self, case, data, context):
        case.headers = {**(case.headers or {}), "Authorization": f"Bearer {data}"}


keyless = schemathesis.openapi.from_dict(described())  # may send made-up keys: each is refused
OPEN_ROUTES = {"/health", "/metrics"}


@pytest.fixture(scope="module")
def worker():
    s = start_worker()
    yield s
    assert s.stop() == 0, s.log()[-3000:]


@keyed.parametrize()
@SETTINGS
def test_with_the_key(case, worker):
    case.call_and_validate(base_url=worker.url, checks=CHECKS, timeout=60)


@keyless.parametrize()
@SETTINGS
def test_without_the_key(case, worker):
    # No key, or one the generator made up: every guarded route refuses, before reading the body.
    response = case.call_and_validate(base_url=worker.url, checks=CHECKS, timeout=60)
    if case.path not in OPEN_ROUTES and not refused_before_the_key(response):
        assert response.status_code == 401, (case.method, case.path, response.status_code, response.text[:200])


def refused_before_the_key(response) -> bool:
    # Routing answers before the key check: another method on the path (the coverage phase tries
    # them) is a 405; a path parameter the route's pattern refuses (a newline) is "no route".
    # So does the browser defences' middleware: a POST not said to be JSON is a 415.
    code = response.status_code
    return code in (405, 415) or (code == 404 and "no route" in response.text)


def test_the_worker_is_still_up_and_logged_no_failure(worker):
    assert_alive(worker)
    assert "event=request.failed" not in worker.log(), worker.log()[-3000:]


def test_the_description_is_never_served(worker):
    for path in ("/openapi.json", "/docs", "/redoc"):
        assert httpx.get(worker.url + path, timeout=10).status_code == 404, path
