"""A test's own bus connection, publishing each event as the service that produces it.

Services check who signed every event they consume (:mod:`stride.bus.signing`), so a test
that stands in for a producer signs as it, with the session's certificates (every
identity's key is in the test's TLS folder), and checks the senders of what it consumes.
"""

from __future__ import annotations

from stride.bus.client import Bus
from stride.bus.signing import as_producers
from stride.runtime import tls


async def producer_bus(url: str, name: str = "test", timeout: float = 10.0) -> Bus:
    """A bus that signs each topic's events as its producer (see the module docstring)."""
    return await Bus.connect(url, name, timeout, signer_for=as_producers(tls.load))
