"""The client's buffer layout: aligned, no pickle, every dtype and shape round-trips."""

from __future__ import annotations

import numpy as np
import pytest

from stride.ckptclient.layout import ALIGNMENT, as_bytes, plan, views


def test_tensors_round_trip_through_one_aligned_buffer() -> None:
    arrays: dict[str, np.ndarray] = {
        "kernel": np.arange(15, dtype=np.float32).reshape(3, 5),
        "scalar": np.array(7, dtype=np.int64),
        "empty": np.zeros((0, 4), dtype=np.float16),
        "flags": np.array([True, False, True]),
        "wide": np.arange(6, dtype=np.complex128).reshape(2, 3),
    }
    records, size = plan(arrays)
    assert all(r.offset % ALIGNMENT == 0 for r in records)
    buffer = bytearray(size)
    for record, array in zip(records, arrays.values(), strict=True):
        buffer[record.offset : record.offset + record.length] = as_bytes(array).tobytes()
    restored = views(bytes(buffer), records)
    for name, array in arrays.items():
        assert restored[name].dtype == array.dtype and restored[name].shape == array.shape
        assert np.array_equal(restored[name], array)


def test_object_arrays_and_empty_names_are_refused() -> None:
    with pytest.raises(TypeError, match="object"):
        plan({"x": np.array([object()])})
    with pytest.raises(ValueError, match="names"):
        plan({"": np.zeros(1)})


def test_a_record_that_does_not_fit_its_buffer_is_refused() -> None:
    records, size = plan({"x": np.zeros(4, dtype=np.float32)})
    with pytest.raises(ValueError, match="do not hold"):
        views(bytes(size - 1), records)
