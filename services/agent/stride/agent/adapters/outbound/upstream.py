"""Passing an upstream service's gRPC error on to the trainer.

The agent is a pass-through: when the dispatcher or checkpoint cache refuses a call, the
trainer sees the same status code and message (``offset: must be between ...``). An
unreachable upstream is named, so "UNAVAILABLE" says which service is down.
"""

from __future__ import annotations

import grpc

_NAMED_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})


class UpstreamError(Exception):
    """A call to ``upstream`` failed with ``code``."""

    def __init__(self, upstream: str, address: str, code: grpc.StatusCode, details: str) -> None:
        self.upstream = upstream
        self.code = code
        self.details = details
        if code in _NAMED_CODES:
            self.details = f"{upstream} at {address}: {details}"
        super().__init__(f"{upstream} answered {code.name}: {self.details}")

    @classmethod
    def wrap(cls, upstream: str, address: str, error: grpc.aio.AioRpcError) -> UpstreamError:
        """The error of an upstream call."""
        return cls(upstream, address, error.code(), error.details() or "")
