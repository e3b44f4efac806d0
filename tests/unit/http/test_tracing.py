"""Traces (http/tracing.py): spans counted as exported or dropped, never queued past the bound, the
engine's phases at the times the engine kept, and a section swapped whole."""

from __future__ import annotations

import time
from types import SimpleNamespace

from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from vllmmlxd.config.tracing import TracingConfig
from vllmmlxd.http import tracing
from vllmmlxd.http.tracing import BoundedProcessor, CountingExporter, Tracing, operation_of, phase_spans


class Failing(InMemorySpanExporter):
    def export(self, spans):  # a collector that is down
        return SpanExportResult.FAILURE


def traced(monkeypatch, exporter) -> Tracing:
    monkeypatch.setattr(tracing, "make_exporter", lambda settings: exporter)
    t = Tracing()
    t.configure(TracingConfig(endpoint="http://127.0.0.1:9"))
    return t


def test_operations_are_named_as_the_conventions_name_them():
    assert operation_of("/v1/chat/completions") == "chat" and operation_of("/v1/completions") == "text_completion"
    assert operation_of("/v1/messages") == "chat" and operation_of("/ollama/api/generate") == "text_completion"
    assert operation_of("/v1/embeddings") == "embeddings"


def test_spans_are_counted_exported_or_dropped(monkeypatch):
    memory = InMemorySpanExporter()
    t = traced(monkeypatch, memory)
    t.start("a").end()
    t.flush()
    assert t.counts() == (1, 0) and [s.name for s in memory.get_finished_spans()] == ["a"]
    failing = traced(monkeypatch, Failing())
    failing.start("b").end()
    failing.flush()
    assert failing.counts() == (0, 1)


def test_past_the_queue_a_span_is_dropped_and_counted(monkeypatch):
    monkeypatch.setattr(tracing, "QUEUE", 3)
    exporter = CountingExporter(InMemorySpanExporter())
    processor = BoundedProcessor(exporter, TracingConfig(endpoint="http://x"))
    span = SimpleNamespace(context=None)
    monkeypatch.setattr(processor.inner, "on_end", lambda s: None)  # never exported: the queue only grows
    for _ in range(5):
        processor.on_end(span)
    assert (processor.handed, processor.dropped) == (3, 2)


def test_the_engine_s_phases_carry_the_times_it_kept(monkeypatch):
    memory = InMemorySpanExporter()
    t = traced(monkeypatch, memory)
    now = time.monotonic()
    progress = SimpleNamespace(
        queued_at=now - 3.0,
        started_at=now - 2.0,
        first_token_at=now - 1.5,
        last_token_at=now - 0.5,
        waited_for="max_num_seqs",
        prompt_tokens=100,
        cached_tokens=64,
        generated_tokens=20,
        drafted_tokens=10,
        accepted_tokens=7,
    )
    parent = t.start("chat m")
    phase_spans(t, parent, progress, now)
    parent.end()
    t.flush()
    spans = {s.name: s for s in memory.get_finished_spans()}
    seconds = {n: (spans[n].end_time - spans[n].start_time) / 1e9 for n in ("queue", "prefill", "decode")}
    assert abs(seconds["queue"] - 1.0) < 0.01 and abs(seconds["prefill"] - 0.5) < 0.01
    assert abs(seconds["decode"] - 1.0) < 0.01
    assert spans["prefill"].attributes["vllmmlxd.cached_tokens"] == 64
    assert spans["queue"].attributes["vllmmlxd.queue.waited_for"] == "max_num_seqs"
    assert spans["decode"].attributes["vllmmlxd.speculation.accepted"] == 7
    assert spans["queue"].parent.span_id == spans["chat m"].context.span_id


def test_an_unchanged_section_keeps_its_provider_and_a_removed_one_stops_tracing(monkeypatch):
    t = traced(monkeypatch, InMemorySpanExporter())
    tracer = t._tracer
    t.configure(TracingConfig(endpoint="http://127.0.0.1:9"))
    assert t._tracer is tracer and t.on
    t.configure(None)
    assert not t.on and not t.start("x").is_recording()


def test_each_protocol_gets_the_sdk_s_exporter_at_the_section_s_endpoint():
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as Grpc
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as Http

    http = tracing.make_exporter(TracingConfig(endpoint="http://collector:4318", headers={"a": "b"}))
    assert isinstance(http, Http) and http._endpoint == "http://collector:4318/v1/traces"
    grpc = tracing.make_exporter(TracingConfig(endpoint="http://collector:4317", protocol="grpc"))
    assert isinstance(grpc, Grpc)


def test_spans_reach_a_grpc_collector():
    from concurrent import futures

    import grpc  # type: ignore[import-untyped]
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

    received: list[str] = []

    class Service(trace_service_pb2_grpc.TraceServiceServicer):
        def Export(self, request, context):
            received.extend(s.name for r in request.resource_spans for sc in r.scope_spans for s in sc.spans)
            return trace_service_pb2.ExportTraceServiceResponse()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Service(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        t = Tracing()
        t.configure(TracingConfig(endpoint=f"http://127.0.0.1:{port}", protocol="grpc"))
        t.start("over grpc").end()
        t.flush()
        assert received == ["over grpc"] and t.counts() == (1, 0)
        t.configure(None)
    finally:
        server.stop(None)


def test_a_client_that_leaves_mid_answer_is_an_event_of_its_span(monkeypatch):
    import asyncio

    from vllmmlxd.http.tracing import TracingMiddleware

    memory = InMemorySpanExporter()
    t = traced(monkeypatch, memory)

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})
        assert (await receive())["type"] == "http.disconnect"  # a streaming route watches for it

    async def receive():
        return {"type": "http.disconnect"}

    async def send(message):
        pass

    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": [], "state": {}}
    asyncio.run(TracingMiddleware(app, lambda: "m", tracing=t)(scope, receive, send))
    t.flush()
    [span] = memory.get_finished_spans()
    assert span.name == "chat m" and [e.name for e in span.events] == ["client.disconnect"]


def test_a_span_that_ends_after_a_reload_is_sent_by_the_new_provider(monkeypatch):
    made: list[InMemorySpanExporter] = []
    monkeypatch.setattr(tracing, "make_exporter", lambda settings: made.append(InMemorySpanExporter()) or made[-1])
    t = Tracing()
    t.configure(TracingConfig(endpoint="http://127.0.0.1:9"))
    span = t.start("began before the reload")
    t.configure(TracingConfig(endpoint="http://127.0.0.1:9", service_name="renamed"))
    time.sleep(0.5)  # the old provider has shut down
    span.end()
    t.flush()
    assert [s.name for s in made[1].get_finished_spans()] == ["began before the reload"]
    assert t.counts() == (1, 0)
