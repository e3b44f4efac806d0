"""What both fuzz modules share: the worker they fuzz, its key, and the description they read.

The description is built in-process from a worker app over a stand-in engine (only its routes are
read); the requests go over HTTP to a real ``vllmmlxd serve builtin:tiny``.
"""

from __future__ import annotations

import os

import httpx

from tests.support.servers import Server, start_serve

KEY = "sk-fuzz-test-key"
AUTH = {"authorization": f"Bearer {KEY}"}
# Cases per operation; raise it locally for a longer hunt: VLLMMLXD_FUZZ_EXAMPLES=500 pytest tests/fuzz
MAX_EXAMPLES = int(os.environ.get("VLLMMLXD_FUZZ_EXAMPLES", "25"))
# The same cases on every run (CI); VLLMMLXD_FUZZ_RANDOM=1 draws new ones (pytest prints the seed).
DERANDOMIZE = not os.environ.get("VLLMMLXD_FUZZ_RANDOM")
FAMILY_PREFIX = "/v1/messages"  # Anthropic's error shape there, OpenAI's everywhere else (but Ollama's)
OLLAMA_PREFIX = "/ollama/"  # Ollama's {"error": "message"}


def described() -> dict:
    """The worker's OpenAPI description, as ``app.openapi()`` gives it."""
    from typing import cast

    from tests.unit.http.test_metrics import FakeEngine  # a stand-in engine: only the routes are read
    from vllmmlxd.config.schema import ResolvedModel
    from vllmmlxd.engine.types import Engine
    from vllmmlxd.worker.app import create_app

    return create_app(
        cast(Engine, FakeEngine()), ResolvedModel(model="x"), "m"
    ).openapi()  # the same whatever the entry says


def start_worker() -> Server:
    """A keyed tiny worker that answers fast: 8 tokens at most, whatever a request asks."""
    return start_serve(
        "builtin:tiny",
        "--api-key",
        KEY,
        "--max-tokens",
        "8",
        "--max-request-tokens",
        "8",
        "--enable-metrics",
        "--timeout",
        "30",
    )


def assert_alive(server: Server) -> None:
    """Still serving: the process is up and /health answers 200."""
    assert server.proc.poll() is None, server.log()[-3000:]
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200, server.log()[-3000:]


def assert_error_shape(path: str, body: object) -> None:
    """An error body in the shape of ``path``'s family."""
    assert isinstance(body, dict), body
    if path.startswith(OLLAMA_PREFIX):
        assert set(body) == {"error"} and isinstance(body["error"], str), body
    elif path.startswith(FAMILY_PREFIX):
        assert body.get("type") == "error" and set(body) == {"type", "error"}, body
        assert isinstance(body["error"].get("type"), str) and isinstance(body["error"].get("message"), str), body
    else:
        err = body.get("error")
        assert set(body) == {"error"} and isinstance(err, dict), body
        assert isinstance(err.get("message"), str) and isinstance(err.get("type"), str), body
        assert {"param", "code"} <= set(err), body
