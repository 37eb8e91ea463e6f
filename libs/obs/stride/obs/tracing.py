"""OpenTelemetry tracing: a tracer provider per process and W3C context propagation.

Spans go to an OTLP/gRPC collector when an endpoint is configured; otherwise they are
created (so ids appear in logs and propagate across hops) but not exported.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

_provider: TracerProvider | None = None


def configure_tracing(service: str, otlp_endpoint: str | None) -> TracerProvider:
    """Install a global tracer provider named after ``service``.

    The provider is set once per process (OpenTelemetry refuses to replace it); calling
    again returns the first one.
    """
    global _provider  # noqa: PLW0603 - one provider per process, by OpenTelemetry's design
    if _provider is not None:
        return _provider
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    if otlp_endpoint:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter(endpoint=otlp_endpoint, insecure=True)
        provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=200))
    trace.set_tracer_provider(provider)
    _provider = provider
    return provider


def shutdown_tracing() -> None:
    """Flush pending spans; called last in a service's shutdown."""
    if _provider is not None:
        _provider.force_flush(timeout_millis=2000)


def inject_headers(headers: MutableMapping[str, str]) -> MutableMapping[str, str]:
    """Write the current trace context (traceparent, tracestate) into message headers."""
    propagate.inject(headers)
    return headers


def extract_context(headers: Mapping[str, str] | None) -> otel_context.Context:
    """Read a trace context from message headers (empty context if there is none)."""
    return propagate.extract(dict(headers or {}))
