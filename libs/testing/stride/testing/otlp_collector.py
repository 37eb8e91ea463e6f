"""A minimal OTLP/gRPC trace collector, so tests can see the spans real service processes export."""

from __future__ import annotations

import threading
from collections import defaultdict
from concurrent import futures
from dataclasses import dataclass
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc


@dataclass(frozen=True)
class CollectedSpan:
    """One exported span: who made it, its trace, its name and kind."""

    service: str
    trace_id: str
    span_id: str
    parent_span_id: str
    name: str
    kind: int


class _TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, collector: OtlpCollector) -> None:
        self.collector = collector

    def Export(self, request: Any, context: Any) -> Any:
        spans = []
        for resource_spans in request.resource_spans:
            service = next(
                (
                    a.value.string_value
                    for a in resource_spans.resource.attributes
                    if a.key == "service.name"
                ),
                "",
            )
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    spans.append(
                        CollectedSpan(
                            service=service,
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_span_id=span.parent_span_id.hex(),
                            name=span.name,
                            kind=span.kind,
                        )
                    )
        self.collector.add(spans)
        return trace_service_pb2.ExportTraceServiceResponse()


class OtlpCollector:
    """Receives spans on 127.0.0.1:<port>; point services at it with STRIDE_OTLP_ENDPOINT."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spans: list[CollectedSpan] = []
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(  # type: ignore[no-untyped-call]
            _TraceService(self), self.server
        )
        self.port = self.server.add_insecure_port("127.0.0.1:0")

    @property
    def endpoint(self) -> str:
        """host:port for the OTLP exporter."""
        return f"127.0.0.1:{self.port}"

    def start(self) -> OtlpCollector:
        """Start receiving."""
        self.server.start()
        return self

    def stop(self) -> None:
        """Stop receiving."""
        self.server.stop(grace=None)

    def add(self, spans: list[CollectedSpan]) -> None:
        """Record exported spans."""
        with self._lock:
            self._spans.extend(spans)

    def spans(self) -> list[CollectedSpan]:
        """Everything received so far."""
        with self._lock:
            return list(self._spans)

    def services_by_trace(self) -> dict[str, set[str]]:
        """For each trace id, the services that exported spans in it."""
        traces: dict[str, set[str]] = defaultdict(set)
        for span in self.spans():
            traces[span.trace_id].add(span.service)
        return dict(traces)
