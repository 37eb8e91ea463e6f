"""The checkpoint checksum (CRC-32C, Castagnoli), computed incrementally over streamed chunks.

The API field is ``crc32c``; ``google_crc32c`` computes it with the CPU's CRC32 instruction
at memory speed, so checking a checkpoint costs about as much as copying it.
"""

from __future__ import annotations

from collections.abc import Iterable

import google_crc32c

ALGORITHM = "crc32c"


def extend(crc: int, data: bytes) -> int:
    """The checksum of everything so far followed by ``data`` (start from 0)."""
    return int(google_crc32c.extend(crc, data))


def checksum(data: bytes) -> int:
    """The checksum of one buffer."""
    return extend(0, data)


def combined(shard_checksums: Iterable[int]) -> int:
    """One checksum for a checkpoint: its shard's own for one shard, else the checksum of
    the shards' checksums in shard order (identifies the content, e.g. in event ids)."""
    values = list(shard_checksums)
    if len(values) == 1:
        return values[0]
    return checksum(b"".join(value.to_bytes(4, "big") for value in values))
