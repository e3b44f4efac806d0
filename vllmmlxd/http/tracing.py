"""Traces of a process's requests (OpenTelemetry), exported over OTLP where ``telemetry:`` says.

Each API request is one span (kind SERVER) named as OpenTelemetry's generative-AI conventions
name it (``chat qwen``), the child of the client's ``traceparent`` when it sends one (the
gateway's span, through the gateway), with the conventions' attributes (``gen_ai.operation.name``,
``gen_ai.request.model``, ``gen_ai.usage.input_tokens``...) and never a prompt or an answer unless
``capture_content`` is on (``trace_content.py``), never a key. The engine's phases are
child spans made when the request ends from the times the engine thread already keeps
(``RequestProgress``): queue, prefill (cached tokens), decode (tokens, speculation's drafts), so
the engine thread does nothing for tracing. Each MCP tool call is a span of its own.

Export never holds a request: spans go to a batch processor's thread through a bounded queue
(``QUEUE``); past it, and when an export fails (a collector that is down or slow past
``timeout_s``), spans are dropped and counted (``vllmmlxd_trace_spans_dropped_total``). One
``Tracing`` per process (``TRACING``), reconfigured whole when the section changes; the old
provider is shut down on a thread of its own.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from prometheus_client.core import CounterMetricFamily, Metric
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..config.tracing import TracingConfig
from .access_log import SERVED
from .key_usage import counted
from .trace_content import BODY_BYTES, input_messages, output_messages

QUEUE = 2048  # spans waiting for export at most; past it they are dropped, counted
OUTPUT = "traced_output"  # scope["state"] key: the answer's text and finish reason, when content is captured
# The SDK logs every failed try of an export (a traceback each, while a collector is down): drops are
# counted in /metrics instead, and a worker's log stays for what the operator must act on.
QUIET = ("opentelemetry.exporter.otlp", "opentelemetry.sdk._shared_internal", "opentelemetry.sdk.trace.export")
PROPAGATOR = TraceContextTextMapPropagator()
# The conventions' operation of each API route (by the end of its path).
OPERATIONS = (
    ("/chat/completions", "chat"),
    ("/completions", "text_completion"),
    ("/responses", "chat"),
    ("/messages", "chat"),
    ("/api/chat", "chat"),
    ("/api/generate", "text_completion"),
    ("/embeddings", "embeddings"),
    ("/api/embed", "embeddings"),
    ("/api/embeddings", "embeddings"),
)


def operation_of(path: str) -> str:
    return next((op for end, op in OPERATIONS if path.endswith(end)), "request")


class CountingExporter(SpanExporter):
    """An exporter that counts what it sent and what it could not (dropped)."""

    def __init__(self, inner: SpanExporter):
        self.inner = inner
        self.exported = 0
        self.failed = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            result = self.inner.export(spans)
        except Exception:  # an exporter that raises: the batch is lost like a failed one
            result = SpanExportResult.FAILURE
        if result == SpanExportResult.SUCCESS:
            self.exported += len(spans)
        else:
            self.failed += len(spans)
        return result

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self.inner.force_flush(timeout_millis)


class BoundedProcessor(SpanProcessor):
    """A batch processor that drops (and counts) a span rather than queue more than ``QUEUE``."""

    def __init__(self, exporter: CountingExporter, settings: TracingConfig):
        self.exporter = exporter
        self.inner = BatchSpanProcessor(
            exporter,
            max_queue_size=QUEUE + 512,  # never reached: the bound is counted here
            schedule_delay_millis=500,
            max_export_batch_size=512,
            export_timeout_millis=int(settings.timeout_s * 1000),
        )
        self.handed = 0
        self.dropped = 0
        self.closed = False
        self.successor: Callable[[], BoundedProcessor | None] = lambda: None  # where late spans go once closed

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        self.inner.on_start(span, parent_context)

    def on_end(self, span: ReadableSpan) -> None:
        if self.closed:  # its request began before a reload replaced this provider: the new one sends it
            successor = self.successor()
            if successor is not None:
                successor.on_end(span)
            else:
                self.dropped += 1
            return
        if self.handed - self.exporter.exported - self.exporter.failed >= QUEUE:
            self.dropped += 1
            return
        self.handed += 1
        self.inner.on_end(span)

    def shutdown(self) -> None:
        self.closed = True
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self.inner.force_flush(timeout_millis)


def make_exporter(settings: TracingConfig) -> SpanExporter:
    headers = {k: v.get_secret_value() for k, v in settings.headers.items()}
    if settings.protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

        target = settings.endpoint.removeprefix("http://").removeprefix("https://")
        insecure = not settings.endpoint.startswith("https://")
        return GrpcExporter(endpoint=target, insecure=insecure, headers=headers, timeout=settings.timeout_s)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

    url = settings.endpoint.rstrip("/")
    return HttpExporter(
        endpoint=url if url.endswith("/v1/traces") else url + "/v1/traces", headers=headers, timeout=settings.timeout_s
    )


class Tracing:
    """A process's tracer: nothing recorded until ``configure`` is given a section."""

    def __init__(self) -> None:
        self.settings: TracingConfig | None = None
        self._provider: TracerProvider | None = None
        self._processor: BoundedProcessor | None = None
        self._tracer: trace.Tracer | None = None
        self._gone = [0, 0]  # exported and dropped by providers replaced and shut down
        self._retiring: list[BoundedProcessor] = []  # replaced, still sending what they held
        self._lock = threading.Lock()

    @property
    def on(self) -> bool:
        return self._tracer is not None

    @property
    def captures(self) -> bool:
        """Whether spans hold the requests' content (``capture_content``)."""
        return self._tracer is not None and self.settings is not None and self.settings.capture_content

    def configure(self, settings: TracingConfig | None) -> None:
        """Export where ``settings`` says from now on (None: trace nothing); an unchanged section
        keeps its provider and its queue."""
        if settings == self.settings:
            return
        old, processor = self._provider, self._processor
        self.settings, self._provider, self._processor, self._tracer = settings, None, None, None
        if settings is not None:
            for name in QUIET:
                logging.getLogger(name).setLevel(logging.CRITICAL)
            sampler = ParentBased(TraceIdRatioBased(settings.sampling_ratio))
            provider = TracerProvider(
                resource=Resource.create({"service.name": settings.service_name}), sampler=sampler
            )
            self._processor = BoundedProcessor(CountingExporter(make_exporter(settings)), settings)
            provider.add_span_processor(self._processor)
            self._provider, self._tracer = provider, provider.get_tracer("vllmmlxd")
        if old is not None and processor is not None:
            processor.successor = lambda: self._processor
            with self._lock:
                self._retiring.append(processor)
            threading.Thread(target=self._retire, args=(old, processor), name="vllmmlxd-trace-end", daemon=True).start()

    def _retire(self, provider: TracerProvider, processor: BoundedProcessor) -> None:
        """Shut a replaced provider down (it sends what it held, or drops it), then keep its counts."""
        provider.shutdown()
        with self._lock:
            self._retiring.remove(processor)
            self._gone[0] += processor.exporter.exported
            self._gone[1] += processor.dropped + processor.exporter.failed

    def counts(self) -> tuple[int, int]:
        """Spans exported, and dropped (queue full or export failed), since the process started."""
        with self._lock:
            live = [*self._retiring, *([self._processor] if self._processor is not None else [])]
            exported = self._gone[0] + sum(p.exporter.exported for p in live)
            dropped = self._gone[1] + sum(p.dropped + p.exporter.failed for p in live)
        return exported, dropped

    def start(
        self,
        name: str,
        *,
        kind: SpanKind = SpanKind.INTERNAL,
        parent: Any = None,
        start_ns: int | None = None,
        **attrs: Any,
    ) -> Span:
        """A span (a non-recording one when tracing is off), not made current."""
        if self._tracer is None:
            return trace.INVALID_SPAN
        return self._tracer.start_span(name, context=parent, kind=kind, attributes=_clean(attrs), start_time=start_ns)

    @contextlib.contextmanager
    def span(self, name: str, **attrs: Any) -> Iterator[Span]:
        """A child span of the current one, current while the block runs (an MCP call)."""
        span = self.start(name, **attrs)
        token = otel_context.attach(trace.set_span_in_context(span)) if self.on else None
        try:
            yield span
        except BaseException as exc:
            span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
            raise
        finally:
            if token is not None:
                otel_context.detach(token)
            span.end()

    def flush(self, timeout_s: float = 10.0) -> None:
        if self._provider is not None:
            self._provider.force_flush(int(timeout_s * 1000))


TRACING = Tracing()


def inject(headers: dict[str, str]) -> dict[str, str]:
    """``headers`` with the current span's ``traceparent`` (none when nothing is traced)."""
    PROPAGATOR.inject(headers)
    return headers


def _clean(attrs: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in attrs.items() if v is not None}


def _ns(monotonic_s: float, anchor: tuple[int, float]) -> int:
    """A ``time.monotonic()`` reading as Unix nanoseconds (spans carry wall-clock times)."""
    wall_ns, mono = anchor
    return wall_ns - int((mono - monotonic_s) * 1e9)


def phase_spans(tracing: Tracing, parent: Span, progress: Any, end_s: float) -> None:
    """The engine's phases of one request, as child spans with the times it kept."""
    if progress is None or not tracing.on:
        return
    anchor = (time.time_ns(), time.monotonic())
    parent_ctx = trace.set_span_in_context(parent)
    started, first, last = progress.started_at, progress.first_token_at, progress.last_token_at
    phases = [
        ("queue", progress.queued_at, started, {"vllmmlxd.queue.waited_for": progress.waited_for}),
        (
            "prefill",
            started,
            first,
            {"vllmmlxd.prompt_tokens": progress.prompt_tokens, "vllmmlxd.cached_tokens": progress.cached_tokens},
        ),
        (
            "decode",
            first,
            last if last is not None else end_s,
            {
                "vllmmlxd.generated_tokens": progress.generated_tokens,
                "vllmmlxd.speculation.drafted": progress.drafted_tokens or None,
                "vllmmlxd.speculation.accepted": progress.accepted_tokens if progress.drafted_tokens else None,
            },
        ),
    ]
    for name, begin, end, attrs in phases:
        if begin is not None:
            span = tracing.start(name, parent=parent_ctx, start_ns=_ns(begin, anchor), **attrs)
            span.end(end_time=_ns(end if end is not None else end_s, anchor))


class TraceCollector:
    """``vllmmlxd_trace_spans_exported_total`` and ``..._dropped_total`` of this process."""

    def __init__(self, tracing: Tracing = TRACING):
        self.tracing = tracing

    def collect(self) -> Iterator[Metric]:
        exported, dropped = self.tracing.counts()
        yield CounterMetricFamily("vllmmlxd_trace_spans_exported", "Spans sent to the OTLP collector.", exported)
        yield CounterMetricFamily(
            "vllmmlxd_trace_spans_dropped", "Spans dropped: the export queue was full, or an export failed.", dropped
        )

    def describe(self) -> Iterator[Metric]:
        return self.collect()


class TracingMiddleware:
    """One SERVER span per counted API request (``key_usage.counted``), the client's
    ``traceparent`` its parent, current while the request runs (MCP calls and the gateway's
    forwarding are its children). ``model``: the worker's served name; None in the gateway."""

    def __init__(self, app: ASGIApp, model: Callable[[], str] | None, tracing: Tracing = TRACING):
        self.app, self.model, self.tracing = app, model, tracing

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        tracing = self.tracing
        path, method = scope.get("path", ""), scope.get("method", "")
        if scope["type"] != "http" or not tracing.on or not counted(method, path):
            await self.app(scope, receive, send)
            return
        carrier = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope.get("headers", [])}
        parent = PROPAGATOR.extract(carrier)
        model = self.model() if self.model is not None else None
        operation = operation_of(path)
        # A worker's span is the conventions' "chat qwen"; the gateway's names its route (the model is
        # in the body, which the gateway reads later: its dispatch sets gen_ai.request.model).
        span = tracing.start(
            f"{operation} {model}" if model is not None else f"gateway {method} {path}",
            kind=SpanKind.SERVER,
            parent=parent,
            **{
                "gen_ai.operation.name": operation,
                "gen_ai.request.model": model,
                "gen_ai.provider.name": "vllmmlxd",
                "http.request.method": method,
                "url.path": path,
                "vllmmlxd.role": "worker" if model is not None else "gateway",
            },
        )
        status = 500
        token = otel_context.attach(trace.set_span_in_context(span))
        answered = False

        async def watch(message: Message) -> None:
            nonlocal status, answered
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                answered = True

        body = bytearray() if tracing.captures else None

        async def listen() -> Message:
            message = await receive()
            if message["type"] == "http.disconnect" and not answered:  # the client left before the answer ended
                span.add_event("client.disconnect")
            elif body is not None and message["type"] == "http.request" and len(body) <= BODY_BYTES:
                body.extend(message.get("body", b""))
            return message

        try:
            await self.app(scope, listen, watch)
        except BaseException as exc:
            span.record_exception(exc)
            raise
        finally:
            otel_context.detach(token)
            if body is not None:
                self._content(span, scope, bytes(body))
            self._finish(span, scope, status, model)

    @staticmethod
    def _content(span: Span, scope: Scope, body: bytes) -> None:
        """The request's messages and its answer, where the operator asked for content."""
        state = scope.get("state") or {}
        asked = input_messages(body) if len(body) <= BODY_BYTES else None
        answer = state.get(OUTPUT)
        attrs = {
            "gen_ai.input.messages": asked,
            "gen_ai.output.messages": output_messages(answer[0], answer[1]) if isinstance(answer, tuple) else None,
        }
        span.set_attributes(_clean(attrs))

    def _finish(self, span: Span, scope: Scope, status: int, model: str | None) -> None:
        state = scope.get("state") or {}
        found = state.get(SERVED)
        served: dict[str, Any] = found if isinstance(found, dict) else {}
        caller = state.get("caller")
        attrs = {
            "http.response.status_code": status,
            "gen_ai.response.id": state.get("request_id"),
            "gen_ai.response.model": model,  # the model the worker served (None in the gateway)
            "gen_ai.response.finish_reasons": [served["finish_reason"]] if served.get("finish_reason") else None,
            "gen_ai.usage.input_tokens": served.get("prompt_tokens"),
            "gen_ai.usage.output_tokens": served.get("completion_tokens"),
            "vllmmlxd.cached_tokens": served.get("cached_tokens"),
            "vllmmlxd.key.name": getattr(caller, "key_name", None),
        }
        span.set_attributes(_clean(attrs))
        if status >= 500:
            span.set_status(Status(StatusCode.ERROR, f"HTTP {status}"))
            span.set_attribute("error.type", str(status))
        elif status >= 400:
            span.set_attribute("error.type", str(status))
        phase_spans(self.tracing, span, state.get("progress"), time.monotonic())
        span.end()
