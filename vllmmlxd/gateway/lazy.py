"""Talking to the daemon over its control socket: load a lazy model, read its status, and the model
store's pulls and removals (Ollama's ``/api/pull`` and ``/api/delete``).

A lazy model's first request asks the daemon to load it (``POST /models/{entry}/load``,
answered once the model is ready, or refused with the reason). Requests for the same model
arriving meanwhile share that one call; a client that leaves does not cancel it (the next
one still wants the model). A pull is the daemon's too: the gateway starts or joins it and
follows its statuses; a client that leaves stops the following, never the download.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from urllib.parse import quote

import httpx

from ..config.gateway import GatewaySpec
from ..log import log_event

logger = logging.getLogger("vllmmlxd.gateway")


@dataclass(frozen=True)
class LoadOutcome:
    ok: bool
    message: str


class DaemonClient:
    """The daemon's control API as the gateway uses it; the socket and timeout read from the current spec."""

    def __init__(self, spec: Callable[[], GatewaySpec]):
        self._spec = spec
        self._loads: dict[str, asyncio.Task[LoadOutcome]] = {}

    def _client(self, socket_path: str, timeout: float) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            transport=httpx.AsyncHTTPTransport(uds=socket_path, verify=False),  # no TLS on a Unix socket
            base_url="http://daemon",
            timeout=httpx.Timeout(timeout, connect=5.0),
            trust_env=False,
        )

    async def load(self, entry: str) -> LoadOutcome:
        """Have the daemon load ``entry``; one call at a time per model, shared by its waiters."""
        task = self._loads.get(entry)
        if task is None:
            task = self._loads[entry] = asyncio.create_task(self._load(entry))
            task.add_done_callback(lambda t: self._loads.pop(entry, None) if self._loads.get(entry) is t else None)
        return await asyncio.shield(task)

    async def _load(self, entry: str) -> LoadOutcome:
        spec = self._spec()
        if not spec.control_socket:
            return LoadOutcome(False, f"model {entry} is not loaded and no daemon is there to load it")
        timeout = spec.gateway.load_timeout
        log_event(logger, "gateway.load_requested", model=entry)
        try:
            async with self._client(spec.control_socket, timeout) as client:
                response = await client.post(f"/models/{quote(entry, safe='')}/load")
        except httpx.TimeoutException:
            outcome = LoadOutcome(False, f"model {entry} did not load within {timeout:g}s")
        except httpx.HTTPError as exc:
            outcome = LoadOutcome(False, f"the daemon could not be asked to load {entry}: {type(exc).__name__}")
        else:
            outcome = _outcome(entry, response)
        log_event(
            logger,
            "gateway.load_answered",
            logging.INFO if outcome.ok else logging.WARNING,
            model=entry,
            ok=outcome.ok,
            message=None if outcome.ok else outcome.message,
        )
        return outcome

    def _socket(self) -> str:
        spec = self._spec()
        if not spec.control_socket:
            raise httpx.ConnectError("no control socket")
        return spec.control_socket

    async def status(self) -> httpx.Response:
        """The daemon's ``GET /status``, read whole; ``httpx.HTTPError`` when it cannot be reached."""
        async with self._client(self._socket(), 10.0) as client:
            return await client.get("/status")

    async def usage(self, since_s: float = 86_400) -> httpx.Response:
        """The daemon's ``GET /usage``: each key's use per model over ``since_s``, and the budgets."""
        async with self._client(self._socket(), 10.0) as client:
            return await client.get("/usage", params={"since": str(since_s)})

    async def start_pull(self, source: str, revision: str | None) -> httpx.Response:
        """``POST /store/pulls``: start a pull or join the one of that repo under way (200, its status;
        422 a source naming no model; 409 another revision under way); ``httpx.HTTPError`` unreached."""
        async with self._client(self._socket(), 30.0) as client:
            return await client.post("/store/pulls", json={"source": source, "revision": revision})

    @asynccontextmanager
    async def follow_pull(self, pull_id: str) -> AsyncIterator[AsyncIterator[dict]]:
        """A pull's statuses, one per change, ending with its final one (``GET /store/pulls/ID?follow=true``);
        leaving the block stops following (never the pull). ``httpx.HTTPError`` when the daemon is not
        reached or answers no stream."""
        # No read timeout: a pull may sit in one state for long (the hub's listing, a checksum pass).
        async with self._client(self._socket(), 5.0) as client:
            path = f"/store/pulls/{quote(pull_id, safe='')}"
            timeout = httpx.Timeout(None, connect=5.0)
            async with client.stream("GET", path, params={"follow": "true"}, timeout=timeout) as response:
                response.raise_for_status()
                yield _statuses(response)

    async def remove_model(self, name: str) -> httpx.Response:
        """``DELETE /store/models/NAME`` (200 removed; 404 not in the store; 409 in use or being pulled)."""
        async with self._client(self._socket(), 60.0) as client:
            # Every separator escaped: no name becomes another path of the control API.
            return await client.delete(f"/store/models/{quote(name, safe='')}")


async def _statuses(response: httpx.Response) -> AsyncIterator[dict]:
    async for line in response.aiter_lines():
        if line.strip():
            status = json.loads(line)
            if isinstance(status, dict):
                yield status


def error_text(response: httpx.Response) -> str:
    """The ``error`` of a control API answer, else its status code in words."""
    try:
        body = response.json()
    except ValueError:
        body = None
    error = body.get("error") if isinstance(body, dict) else None
    return error if isinstance(error, str) and error else f"the daemon answered HTTP {response.status_code}"


def _outcome(entry: str, response: httpx.Response) -> LoadOutcome:
    try:
        body = response.json()
    except ValueError:
        body = {}
    body = body if isinstance(body, dict) else {}
    message = body.get("message") if isinstance(body.get("message"), str) else ""
    if response.status_code == 200 and body.get("ok", True):
        return LoadOutcome(True, message or f"model {entry} is ready")
    return LoadOutcome(False, message or f"the daemon did not load {entry} (HTTP {response.status_code})")
