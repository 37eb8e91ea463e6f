"""Prometheus metrics served over HTTP, one port per process, and the metrics the shared
libraries report (defined once here, so every service exports them under the same names)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, start_http_server

OUTBOX_PARKED = Gauge(
    "stride_outbox_parked_messages",
    "Outbox events the bus refused for good, waiting in the outbox_dead_letter table for "
    "an operator (alert on > 0)",
    ["service"],
)
"""Rows in the service's ``outbox_dead_letter`` table, as last counted. A gauge, because
an operator's removal of a row lowers it."""

OUTBOX_PARKED_TOTAL = Counter(
    "stride_outbox_parked",
    "Outbox events parked in the outbox_dead_letter table since the process started",
    ["service"],
)
"""Events this process parked (exported as ``stride_outbox_parked_total``)."""


def start_metrics_server(port: int, host: str = "0.0.0.0") -> None:
    """Serve /metrics on ``port``; 0 disables metrics (tests and the CLI)."""
    if port:
        start_http_server(port, addr=host)
