"""An OTLP/HTTP receiver on 127.0.0.1, for tests that send spans over OTLP/HTTP."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, HTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


class Received:
    """The spans an OTLP/HTTP receiver got, as (trace id, span id, name, parent span id)."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, str, str, str]] = []
        self.requests = 0

    def add(self, body: bytes) -> None:
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        self.requests += 1
        self.spans += [
            (span.trace_id.hex(), span.span_id.hex(), span.name, span.parent_span_id.hex())
            for resource in request.resource_spans
            for scope in resource.scope_spans
            for span in scope.spans
        ]

    def roots(self) -> list[str]:
        return [trace for trace, _, _, parent in self.spans if not parent]


@contextmanager
def receiver(*, refusing: bool = False) -> Iterator[tuple[str, Received]]:
    """An OTLP/HTTP receiver (one that answers 400 Bad Request when `refusing`)."""
    received = Received()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            received.add(self.rfile.read(int(self.headers["Content-Length"])))
            answer = ExportTraceServiceResponse().SerializeToString()
            self.send_response(400 if refusing else 200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/v1/traces", received
    finally:
        server.shutdown()
