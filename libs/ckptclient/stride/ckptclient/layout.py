"""How named tensors are laid out in one contiguous checkpoint buffer.

Each tensor starts at a 64-byte boundary (a cache line, and enough for any dtype's
alignment), in the order given. The layout is described by plain records (name, dtype
string, shape, offset, length) that travel in the checkpoint header, so reading a
checkpoint back needs no pickle and no code from the writer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

ALIGNMENT = 64


@dataclass(frozen=True)
class TensorRecord:
    """Where one tensor sits in the buffer."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    length: int


def _aligned(offset: int) -> int:
    return (offset + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT


def plan(arrays: Mapping[str, np.ndarray]) -> tuple[list[TensorRecord], int]:
    """The records of ``arrays`` (contiguous, native byte order) and the buffer's size."""
    records = []
    offset = 0
    for name, array in arrays.items():
        if not name:
            raise ValueError("tensor names must not be empty")
        if array.dtype.hasobject:
            raise TypeError(f"tensor {name!r} has dtype object, which has no byte layout")
        offset = _aligned(offset)
        records.append(
            TensorRecord(name, array.dtype.str, tuple(array.shape), offset, array.nbytes)
        )
        offset += array.nbytes
    return records, offset


def as_bytes(array: np.ndarray) -> np.ndarray:
    """A flat uint8 view of a C-contiguous array (no copy)."""
    return array.reshape(-1).view(np.uint8)


def views(buffer: bytes | np.ndarray, records: list[TensorRecord]) -> dict[str, np.ndarray]:
    """Arrays over ``buffer``, one per record (no copy; read-only over bytes)."""
    arrays = {}
    for record in records:
        dtype = np.dtype(record.dtype)
        count = record.length // dtype.itemsize if dtype.itemsize else 0
        expected = int(np.prod(record.shape, dtype=np.int64)) if record.shape else 1
        if count != expected or record.offset + record.length > len(buffer):
            raise ValueError(
                f"tensor {record.name!r}: {record.length} bytes of {record.dtype} do not hold "
                f"shape {record.shape} inside a {len(buffer)}-byte buffer"
            )
        flat = np.frombuffer(buffer, dtype=dtype, count=count, offset=record.offset)
        arrays[record.name] = flat.reshape(record.shape)
    return arrays
