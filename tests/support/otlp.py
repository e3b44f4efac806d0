"""An OTLP/HTTP collector in the test's process: it keeps every span it is sent, decoded from
OpenTelemetry's protobuf (``opentelemetry-proto``), as plain dicts a test can search."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None


@dataclass
class Collector:
    port: int = 0
    spans: list[dict] = field(default_factory=list)
    bodies: list[bytes] = field(default_factory=list)  # raw, to search for what must not be sent
    server: ThreadingHTTPServer | None = None

    def start(self) -> Collector:
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                request = ExportTraceServiceRequest.FromString(body)
                collector.bodies.append(body)
                for resource in request.resource_spans:
                    service = {a.key: _value(a.value) for a in resource.resource.attributes}.get("service.name")
                    for scope in resource.scope_spans:
                        for s in scope.spans:
                            collector.spans.append(
                                {
                                    "name": s.name,
                                    "trace_id": s.trace_id.hex(),
                                    "span_id": s.span_id.hex(),
                                    "parent_id": s.parent_span_id.hex(),
                                    "kind": s.kind,
                                    "start": s.start_time_unix_nano,
                                    "end": s.end_time_unix_nano,
                                    "attributes": {a.key: _value(a.value) for a in s.attributes},
                                    "service": service,
                                }
                            )
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()

    def trace(self, trace_id: str, names: set[str], timeout: float = 20) -> list[dict]:
        """The spans of ``trace_id`` once every one of ``names`` has arrived."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = [s for s in self.spans if s["trace_id"] == trace_id]
            if names <= {s["name"] for s in found}:
                return found
            time.sleep(0.1)
        raise AssertionError(f"spans {names} of {trace_id} not all received: {[s['name'] for s in self.spans]}")
