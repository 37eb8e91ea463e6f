"""Observability for every Stride process: structured logs, traces and metrics.

One `configure()` per process sets all three up, so services do not each wire logging,
tracing and metrics their own way.
"""
