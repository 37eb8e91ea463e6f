"""The checkpoint checksum (CRC-32C, Castagnoli), computed incrementally over streamed chunks.

The API field is ``crc32c``. The ``crc32c`` package computes it with the CPU's CRC32
instruction (about 15 GiB/s here, the GIL released) over any buffer: bytes, and also a
read-only ``mmap`` of a shared-memory segment, so checking a segment needs no copy of it.
(``google_crc32c`` accepts only ``bytes``, which forced a copy of every segment, chunk by
chunk, before it could be checked: that copy cost more than the checksum.)
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import crc32c

if TYPE_CHECKING:
    from typing_extensions import Buffer

ALGORITHM = "crc32c"


def extend(crc: int, data: Buffer) -> int:
    """The checksum of everything so far followed by ``data`` (start from 0)."""
    return int(crc32c.crc32c(data, value=crc))


def checksum(data: Buffer) -> int:
    """The checksum of one buffer."""
    return extend(0, data)


def combined(shard_checksums: Iterable[int]) -> int:
    """One checksum for a checkpoint: its shard's own for one shard, else the checksum of
    the shards' checksums in shard order (identifies the content, e.g. in event ids)."""
    values = list(shard_checksums)
    if len(values) == 1:
        return values[0]
    return checksum(b"".join(value.to_bytes(4, "big") for value in values))
