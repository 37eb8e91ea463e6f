"""This machine's cores and memory: what the embedded default plans on when no cluster is
configured (admission's capacity, the local backend's virtual nodes)."""

from __future__ import annotations

import os

__all__ = ["machine_cores", "machine_memory_bytes"]

FALLBACK_MEMORY_BYTES = 8 * 1024**3
"""Assumed where the OS does not say (no ``sysconf`` page counts)."""


def machine_cores() -> int:
    """Cores of this machine (at least 1)."""
    return os.cpu_count() or 1


def machine_memory_bytes() -> int:
    """Physical memory of this machine, in bytes."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return FALLBACK_MEMORY_BYTES
