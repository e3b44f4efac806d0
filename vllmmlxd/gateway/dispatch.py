"""The gateway's core: one request, from its body to the route's worker and back.

``Gateway`` holds the current routing table (swapped whole by a settings push; each request
takes it once), the shared HTTP client and the daemon client. ``forward`` decides what a
resolved request needs before it can be relayed: an unreachable upstream is refused at once,
a lazy model is loaded first (a streaming client gets its SSE head at once and keep-alive
comments while it waits), a worker's stand-in answering "not loaded" makes one load and one
retry. A replica set's request (``forward_set``) goes to its members in the balancer's order
(``balance.py``), failing over to the next while nothing has been relayed. Errors are raised
from ``vllmmlxd.errors`` and shaped by the route's family.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable

import httpcore
import httpx
from opentelemetry import trace
from starlette.requests import Request
from starlette.types import Receive, Scope, Send

from ..api.body import read_body
from ..config.gateway import Route
from ..errors import InvalidRequest, NotFound, Overloaded, RequestError, RequestTimeout
from ..http.access import Caller, presented_key
from ..http.error_shapes import anthropic_error, is_anthropic, openai_error
from ..http.ratelimit import GroupQuotas, RateStore
from ..http.tracing import TRACING, inject
from ..log import log_event
from .balance import Replicas, affinity_key, estimate_tokens, fallback
from .lazy import DaemonClient
from .proxy import (
    BACKEND_HEADER,
    CONNECT_ERRORS,
    UPSTREAM_ERRORS,
    RawResponse,
    Relay,
    Upstream,
    close_quietly,
    new_client,
    open_stream,
    pump,
    request_headers,
    until_disconnect,
)
from .routing import ReplicaSet, Table, Target, coming_up, needs_load, serving

logger = logging.getLogger("vllmmlxd.gateway")

LOADING_COMMENT_EVERY_S = 5.0
STATE_HEADER = "x-vllmmlxd-state"  # set by the daemon's stand-in on a model's port
NOT_LOADED_STATES = frozenset({"unloaded", "loading"})
UPSTREAM_RETRY_AFTER_S = 5
# How long a request for a starting model waits for the daemon's push that shows it ready: the push
# follows the state change by milliseconds, so a client that saw "ready" in status is not refused.
STARTING_WAIT_S = 5.0
Done = Callable[[int, bool], None]
# What a route is sent, of (route, the request's fields, the client's body): body_for, or an upload's (uploads.py).
Body = Callable[[Route, dict, bytes], bytes]
# A connection that broke before the response's head: the worker went (or closed a kept-alive
# connection just then); it answered nothing, so a replica set tries the next member.
DROPPED_ERRORS = (httpcore.RemoteProtocolError, httpcore.ReadError, httpcore.WriteError)


class Unavailable(Overloaded):
    """The route cannot serve now (503, with Retry-After)."""

    def __init__(self, message: str, *, retry_after: int = UPSTREAM_RETRY_AFTER_S, code: str = "model_unavailable"):
        super().__init__(message, retry_after=retry_after)
        self.code = code


def parse_object(raw: bytes) -> dict:
    """The body as a JSON object, or 400."""
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):  # bad JSON or UTF-8, or nested past the parser's stack
        raise InvalidRequest("request body is not valid JSON") from None
    if not isinstance(data, dict):
        raise InvalidRequest("request body must be a JSON object")
    return data


def body_for(route: Route, data: dict, raw: bytes) -> bytes:
    """The bytes to send: the client's own, except that an upstream is given the name it serves
    the model under (it knows nothing of this host's keys and aliases), and a member of a set named
    by the group is given its own name (a worker with strict_model_name knows no group)."""
    model = data.get("model")
    if model in (route.served_model_name, route.embedding_model):
        return raw
    if route.kind != "upstream" and (model is None or model != route.group):
        return raw
    return json.dumps({**data, "model": route.served_model_name}).encode()


def sse_error(anthropic: bool, status: int, message: str, type_: str, code: str | None = None) -> bytes:
    """An error as one SSE event in the family's shape, for a stream whose 200 head is already out."""
    if anthropic:
        kind = "overloaded_error" if status in (503, 529) else type_
        return b"event: error\ndata: " + json.dumps(anthropic_error(message, kind)).encode() + b"\n\n"
    return b"data: " + json.dumps(openai_error(message, type_, code=code)).encode() + b"\n\n"


def sse_error_from(anthropic: bool, status: int, body: bytes) -> bytes:
    """A worker's error answer (already in the family's shape) as an SSE event."""
    try:
        data = json.loads(body)
    except ValueError:
        data = None
    if not isinstance(data, dict) or "error" not in data:
        return sse_error(anthropic, status, f"the model answered HTTP {status}", "server_error")
    return (b"event: error\n" if anthropic else b"") + b"data: " + json.dumps(data).encode() + b"\n\n"


class Gateway:
    def __init__(self, table: Table):
        self.table = table
        self._swapped = asyncio.Event()  # set (and replaced) at each swap
        self.client = new_client()
        self.daemon = DaemonClient(lambda: self.table.spec)
        self.replicas = Replicas()  # members' load, ejections, affinity: written on this loop only
        self.rates = RateStore()  # replica sets' windows, for the gateway's life (kept across swaps)
        self.group_quotas = group_quotas(table, self.rates)
        self.started = time.time()
        self.in_flight = 0
        self.total = 0
        TRACING.configure(table.spec.telemetry)  # the gateway's spans (http/tracing.py), swapped with the table

    def swap(self, table: Table) -> None:
        old, self.table = self.table, table  # one assignment on the loop: requests hold the table they took
        self.replicas.swapped(old, table)
        self.group_quotas = group_quotas(table, self.rates)
        swapped, self._swapped = self._swapped, asyncio.Event()
        swapped.set()
        TRACING.configure(table.spec.telemetry)

    async def until_serving(self, route: Route) -> Route:
        """``route`` as a later table shows it once it serves; a starting model is waited for a
        moment (``STARTING_WAIT_S``), any other state that is not serving is a 503 at once."""
        deadline = asyncio.get_running_loop().time() + STARTING_WAIT_S
        while not serving(route):
            left = deadline - asyncio.get_running_loop().time()
            if not coming_up(route) or left <= 0:
                raise Unavailable(f"model {route.served_model_name} is not serving ({route.state})", retry_after=1)
            try:
                await asyncio.wait_for(self._swapped.wait(), left)
            except TimeoutError:
                continue
            now = next((r for r in self.table.routes if r.name == route.name and r.kind == route.kind), None)
            if now is None:
                raise Unavailable(f"model {route.served_model_name} is not served here any more", retry_after=1)
            route = now
        return route

    def admit(self, request: Request, target: Target) -> Caller:
        """The caller (its key checked: 401/403); a request to a replica set, or to one of its members by
        name, also spends the set's own windows, counted here for the whole set (429 over them)."""
        caller = self.table.access_of(target).identify(request)
        group = target.name if isinstance(target, ReplicaSet) else target.group
        quotas = self.group_quotas.get(group) if group is not None else None
        if quotas is not None:
            quotas.admit(caller)
        return caller

    @property
    def max_body_bytes(self) -> int:
        return int(self.table.spec.gateway.max_body_mb * 1024 * 1024)

    async def read_body(self, request: Request) -> bytes:
        return await read_body(request, self.max_body_bytes)

    async def routed(self, request: Request, path: str, embeddings: bool = False) -> RawResponse:
        """A model API request: resolve its route, check its key, forward it."""
        raw = await self.read_body(request)
        data = parse_object(raw)
        table = self.table
        key = presented_key(request)
        stored = data.get("previous_response_id") if path == "/v1/responses" else None
        # A conversation stored in one worker goes back to that worker, whatever model it names.
        made_by = table.by_response(stored, key) if isinstance(stored, str) else None
        target = made_by or table.resolve(data.get("model"), embeddings, key)
        self.admit(request, target)
        # A worker's Ollama paths (an upstream's, through this main port) stream NDJSON, not SSE.
        return await self.dispatch(request, target, path, data, raw, sse=not path.startswith("/ollama/"))

    async def stored(self, request: Request, response_id: str, path: str) -> RawResponse:
        """A stored response's retrieve, delete or input items: from the worker that made it."""
        table = self.table
        route = table.by_response(response_id, presented_key(request))
        if route is None:
            raise NotFound(f"response with id {response_id!r} not found")
        table.access_of(route).identify(request)
        return await self.forward(request, route, path, b"", False)

    async def dispatch(
        self, request: Request, target: Target, path: str, data: dict, raw: bytes, *, sse: bool = True
    ) -> RawResponse:
        """Forward to a route, or to a member of a set (the key was checked already). ``sse``: a streamed
        answer is SSE, so a lazy model's load can be waited for with comment lines after the head; a
        family whose stream is not (Ollama's NDJSON) has its load waited for before the head."""
        stream = sse and data.get("stream") is True
        if isinstance(target, ReplicaSet):
            return await self.forward_set(request, target, path, data, raw, stream)
        return await self.forward(request, target, path, body_for(target, data, raw), stream)

    async def forward(self, request: Request, route: Route, path: str, body: bytes, stream: bool) -> RawResponse:
        """The response relaying ``body`` to ``route``'s ``path`` (the key was checked already)."""
        done = Finish(self, request, route, path)
        done.count(route.name, len(body) // 4)
        try:
            if route.kind == "upstream" and route.state == "unreachable":
                raise Unavailable(
                    f"upstream {route.served_model_name} is unreachable"
                    + (f": {route.last_error}" if route.last_error else "")
                )
            if needs_load(route):
                trace.get_current_span().add_event("gateway.lazy_load", {"vllmmlxd.route": route.name})
                if stream:
                    return LoadingStream(self, request, route, path, body, done)
                await self.load(route)
            elif not serving(route):
                route = await self.until_serving(route)
            return Relay(await self.open(request, route, path, body), done, backend=route.name)
        except BaseException as exc:
            done(getattr(exc, "status_code", 499 if isinstance(exc, asyncio.CancelledError) else 500), False)
            raise

    async def forward_set(
        self, request: Request, rset: ReplicaSet, path: str, data: dict, raw: bytes, stream: bool, body: Body = body_for
    ) -> RawResponse:
        """The response of the first member of ``rset`` that answers, tried in the balancer's order,
        each once. A member that refused the connection, dropped it before the response's head, or whose
        port the daemon's stand-in answered (no worker there) has generated nothing the client saw: the
        next one is tried with the same body. Any answer of a worker, an error too, is relayed."""
        key = affinity_key(path, data)
        plan = self.replicas.plan(rset, key, time.monotonic())
        if not plan:  # no member serves: one is loaded or waited for, as a single route would be
            member = fallback(rset)
            if member is None:
                states = ", ".join(sorted({m.state for m in rset.members}))
                raise Unavailable(f"no replica of {rset.name} is serving ({states})", retry_after=1)
            return await self.forward(request, member, path, body(member, data, raw), stream)
        est = estimate_tokens(len(raw), data)
        done = Finish(self, request, rset, path)
        why = ""
        try:
            for member in plan:
                done.count(member.name, est)
                try:
                    upstream = await self._send(request, member, path, body(member, data, raw))
                except CONNECT_ERRORS as exc:  # refused or unreachable: no new request for a while
                    self.replicas.eject(member.name, time.monotonic())
                    why = type(exc).__name__
                except DROPPED_ERRORS as exc:  # gone before the head: nothing reached the client
                    why = type(exc).__name__
                except (httpcore.TimeoutException, *UPSTREAM_ERRORS) as exc:
                    raise refusal(member, exc) from None
                else:
                    if not stand_in(upstream):
                        if 200 <= upstream.status_code < 300:
                            self.replicas.answered(rset, key, member.name, time.monotonic())
                        done.route = member
                        return Relay(upstream, done, backend=member.name)
                    await close_quietly(upstream)
                    self.replicas.eject(member.name, time.monotonic())
                    why = f"not serving ({upstream.header(STATE_HEADER)})"
                done.uncount()
                trace.get_current_span().add_event(
                    "gateway.failover", {"vllmmlxd.route": member.name, "error.type": why}
                )
                log_event(logger, "gateway.failover", logging.WARNING, group=rset.name, route=member.name, error=why)
            raise Unavailable(f"no replica of {rset.name} could answer ({why})", retry_after=1)
        except BaseException as exc:
            done(getattr(exc, "status_code", 499 if isinstance(exc, asyncio.CancelledError) else 500), False)
            raise

    async def load(self, route: Route) -> None:
        outcome = await self.daemon.load(route.name)
        if not outcome.ok:
            raise Unavailable(outcome.message, code="model_not_loaded")

    async def _send(self, request: Request, route: Route, path: str, body: bytes) -> Upstream:
        """Send the request to the route; return with the response's head. Raises httpcore's errors."""
        span = trace.get_current_span()
        span.set_attribute("gen_ai.request.model", route.name)  # the last one tried: the one that answered
        span.set_attribute("vllmmlxd.route.kind", route.kind)
        headers = self.headers_for(request, route)
        query = request.scope.get("query_string", b"")  # as sent: no parsing on the hot path
        url = route.url.rstrip("/") + path + ("?" + query.decode("latin-1") if query else "")
        return await open_stream(self.client, url, headers, body, route.timeout, request.method)

    async def open(self, request: Request, route: Route, path: str, body: bytes, retry: bool = True) -> Upstream:
        """Send the request to the route; return with the response's head. Errors in the family's terms."""
        try:
            upstream = await self._send(request, route, path, body)
        except (httpcore.TimeoutException, *UPSTREAM_ERRORS) as exc:
            raise refusal(route, exc) from None
        if (
            retry
            and route.kind == "local"
            and upstream.status_code == 503
            and upstream.header(STATE_HEADER) in NOT_LOADED_STATES
        ):
            # The daemon's stand-in answered: nothing was generated, so load and send once more.
            await close_quietly(upstream)
            await self.load(route)
            return await self.open(request, route, path, body, retry=False)
        return upstream

    def headers_for(self, request: Request, route: Route) -> list[tuple[bytes, bytes]]:
        """The headers to send ``route``: an upstream gets its own key (never the client's), a local
        worker the daemon's token and the client's address as this gateway judged it."""
        peer = request.client.host if request.client else "unknown"
        if route.kind == "upstream":
            key = route.upstream_api_key.get_secret_value() if route.upstream_api_key else None
            return with_trace(request_headers(request.headers.raw, peer, upstream=True, upstream_key=key))
        token = route.gateway_token.get_secret_value() if route.gateway_token else None
        headers = request_headers(
            request.headers.raw, peer, token=token, client=self.table.client_address(request) if token else None
        )
        return with_trace(headers)


def with_trace(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """``headers`` whose ``traceparent`` is the gateway's own span (the client's was its parent)."""
    carrier = inject({})
    if not carrier:
        return headers
    kept = [(k, v) for k, v in headers if k not in (b"traceparent", b"tracestate")]
    return kept + [(k.encode("latin-1"), v.encode("latin-1")) for k, v in carrier.items()]


def group_quotas(table: Table, store: RateStore) -> dict[str, GroupQuotas]:
    """The windows of each replica set the gateway section limits."""
    return {name: GroupQuotas(name, limits, store) for name, limits in table.spec.gateway.groups.items()}


def refusal(route: Route, exc: BaseException) -> RequestError:
    """The gateway's own error for a route that could not be sent a request, or gave no head."""
    if isinstance(exc, CONNECT_ERRORS):
        if route.kind == "upstream":
            return Unavailable(f"upstream {route.served_model_name} cannot be reached ({type(exc).__name__})")
        return Unavailable(f"model {route.served_model_name} is not serving ({route.state})", retry_after=1)
    if isinstance(exc, httpcore.TimeoutException):
        return RequestTimeout(
            f"model {route.served_model_name} did not answer within {route.timeout:g}s", code="timeout"
        )
    return Unavailable(f"model {route.served_model_name} failed to answer ({type(exc).__name__})")


def stand_in(upstream: Upstream) -> bool:
    """Did the daemon's stand-in answer (a 503 naming a state: no worker serves that port)? A worker's
    own 503 (its queue is full) carries no state header, and is the worker's answer to relay."""
    return upstream.status_code == 503 and upstream.header(STATE_HEADER) is not None


class Finish:
    """The end of one request through the gateway, called once (``done(status, completed)``): the
    gateway's counts, the member's outstanding count it holds, and the request's log line."""

    def __init__(self, gateway: Gateway, request: Request, route: Target, path: str):
        self.gateway, self.request, self.route, self.path = gateway, request, route, path
        self.started = time.perf_counter()
        self.finished = False
        self._counted: tuple[str, int] | None = None
        gateway.in_flight += 1
        gateway.total += 1

    def count(self, entry: str, est_tokens: int) -> None:
        """The request is outstanding on ``entry`` now (until it ends, or ``uncount``)."""
        self.uncount()
        self.gateway.replicas.begin(entry, est_tokens)
        self._counted = (entry, est_tokens)

    def uncount(self) -> None:
        if self._counted is not None:
            self.gateway.replicas.end(*self._counted)
            self._counted = None

    def __call__(self, status: int, completed: bool) -> None:
        if self.finished:
            return
        self.finished = True
        self.gateway.in_flight -= 1
        self.uncount()
        route = self.route
        log_event(
            logger,
            "gateway.request",
            model=route.served_model_name,
            route=route.name,
            kind=route.kind,
            group=getattr(route, "group", None) if isinstance(route, Route) else route.name,
            path=self.path,
            status=status,
            ms=round((time.perf_counter() - self.started) * 1000, 1),
            completed=completed,
            request_id=getattr(self.request.state, "request_id", None),
        )


class LoadingStream(RawResponse):
    """A streaming request to a lazy model not loaded yet: the SSE head at once, a comment line
    every few seconds while the daemon loads it, then the model's own stream (or an error event)."""

    def __init__(self, gateway: Gateway, request: Request, route: Route, path: str, body: bytes, done: Done):
        super().__init__()
        self.gateway, self.request, self.route, self.path, self.request_body, self.done = (
            gateway,
            request,
            route,
            path,
            body,
            done,
        )
        self.anthropic = is_anthropic(request)
        self.status = 200

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        completed = False
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [
                        (b"content-type", b"text/event-stream; charset=utf-8"),
                        (b"cache-control", b"no-cache"),
                        (b"x-accel-buffering", b"no"),
                        (BACKEND_HEADER, self.route.name.encode()),
                    ],
                }
            )
            completed = await until_disconnect(receive, lambda: self._run(send))
        finally:
            self.done(self.status, completed)

    async def _run(self, send: Send) -> bool:
        try:
            if not await self._wait_for_load(send):
                return True
            try:
                upstream = await self.gateway.open(self.request, self.route, self.path, self.request_body)
            except RequestError as exc:
                return await self._fail(send, exc.status_code, exc.message, exc.error_type, exc.code)
            try:
                if upstream.status_code != 200:
                    self.status = upstream.status_code
                    await send(
                        {
                            "type": "http.response.body",
                            "more_body": False,
                            "body": sse_error_from(self.anthropic, upstream.status_code, await upstream.aread()),
                        }
                    )
                    return True
                return await pump(upstream, send)
            finally:
                await close_quietly(upstream)
        except (OSError, httpx.HTTPError, *UPSTREAM_ERRORS) as exc:  # the head is out: logged here, the stream cut
            log_event(logger, "gateway.stream_failed", logging.WARNING, route=self.route.name, error=type(exc).__name__)
            return False

    async def _wait_for_load(self, send: Send) -> bool:
        comment = f": loading {self.route.served_model_name}\n\n".encode()
        load = asyncio.ensure_future(self.gateway.daemon.load(self.route.name))
        try:
            while True:
                await send({"type": "http.response.body", "body": comment, "more_body": True})
                finished, _ = await asyncio.wait({load}, timeout=LOADING_COMMENT_EVERY_S)
                if finished:
                    break
        finally:
            load.cancel()  # only this waiter: the load itself is shielded and shared
        outcome = load.result()
        if not outcome.ok:
            await self._fail(send, 503, outcome.message, "overloaded_error", "model_not_loaded")
        return outcome.ok

    async def _fail(self, send: Send, status: int, message: str, type_: str, code: str | None) -> bool:
        self.status = status
        await send(
            {
                "type": "http.response.body",
                "body": sse_error(self.anthropic, status, message, type_, code),
                "more_body": False,
            }
        )
        return True
