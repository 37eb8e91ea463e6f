"""Prometheus metrics served over HTTP, one port per process."""

from __future__ import annotations

from prometheus_client import start_http_server


def start_metrics_server(port: int, host: str = "0.0.0.0") -> None:
    """Serve /metrics on ``port``; 0 disables metrics (tests and the CLI)."""
    if port:
        start_http_server(port, addr=host)
