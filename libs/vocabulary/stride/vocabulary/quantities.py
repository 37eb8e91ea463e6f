"""Quantities as Kubernetes writes them: memory as bytes or a number with a unit, CPU as
cores or millicores.

``Ki Mi Gi Ti`` are powers of 1024 and ``K M G T`` powers of 1000 (``4Gi``, ``512Mi``,
``2G``, ``1.5Gi``). One reading for every place a user writes memory: the pod watcher's
virtual nodes and a job spec's declared profile. CPU is cores (``2``, ``0.5``) or
millicores (``500m``): the virtual nodes and a Kubernetes node's allocatable.
"""

from __future__ import annotations

import re

__all__ = ["MEMORY_UNITS", "parse_cpu", "parse_memory"]

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


def parse_cpu(text: str) -> float | None:
    """Cores of a quantity (``2``, ``0.5``, ``500m``), or None if ``text`` is not one."""
    value = text.strip()
    try:
        return int(value[:-1]) / 1000 if value.endswith("m") else float(value)
    except ValueError:
        return None
