"""Memory quantities as Kubernetes writes them: bytes, or a number with a unit.

``Ki Mi Gi Ti`` are powers of 1024 and ``K M G T`` powers of 1000 (``4Gi``, ``512Mi``,
``2G``, ``1.5Gi``). One reading for every place a user writes memory: the pod watcher's
virtual nodes and a job spec's declared profile.
"""

from __future__ import annotations

import re

__all__ = ["MEMORY_UNITS", "parse_memory"]

MEMORY_UNITS = {
    "": 1,
    "Ki": 1024,
    "Mi": 1024**2,
    "Gi": 1024**3,
    "Ti": 1024**4,
    "K": 1000,
    "M": 1000**2,
    "G": 1000**3,
    "T": 1000**4,
}
_QUANTITY = re.compile(r"^(\d+(?:\.\d+)?)\s*([A-Za-z]*)\Z")


def parse_memory(text: str) -> int | None:
    """Bytes of a quantity, or None if ``text`` is not one (the caller names the field)."""
    match = _QUANTITY.match(text.strip())
    if match is None or match.group(2) not in MEMORY_UNITS:
        return None
    return int(float(match.group(1)) * MEMORY_UNITS[match.group(2)])
