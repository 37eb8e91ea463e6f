"""Ready mini-batches on the wire: numeric arrays travel bit for bit; anything else is
refused naming the array, and a malformed message is refused naming its field."""

from __future__ import annotations

import numpy as np
import pytest

from stride.api.dataworker.v1 import dataworker_service_pb2 as pb
from stride.trainer.batches import (
    BatchError,
    Ready,
    decode_arrays,
    encode_arrays,
    from_wire,
    to_wire,
)


def test_numeric_arrays_travel_unchanged() -> None:
    arrays = [
        np.arange(12, dtype=np.float32).reshape(3, 4) / 7,
        np.array([[1, 2], [3, 4]], dtype=np.int64).T,  # not C-ordered: sent as if it were
        np.array([True, False]),
        np.zeros((0, 5), dtype=np.uint8),
    ]
    back = decode_arrays(encode_arrays(arrays))
    for sent, received in zip(arrays, back, strict=True):
        assert received.dtype == sent.dtype and received.shape == sent.shape
        assert np.array_equal(received, sent)


def test_a_ready_batch_round_trips_with_its_step_and_samples() -> None:
    ready = Ready(41, 1, np.array([5, 9, 2]), [np.ones((3, 2), np.float32)], True, 0.25)
    back = from_wire(pb.ReadyBatch.FromString(to_wire(ready).SerializeToString()))
    assert (back.step_id, back.epoch, back.split, back.produce_seconds) == (41, 1, True, 0.25)
    assert back.indices.tolist() == [5, 9, 2] and np.array_equal(back.arrays[0], ready.arrays[0])


def test_strings_do_not_travel_and_the_array_is_named() -> None:
    records = np.array([[b"1\t2"], [b"0\t3"]], dtype=object)
    with pytest.raises(BatchError, match=r"arrays\[1\]: dtype object does not travel"):
        encode_arrays([np.ones(2), records])


@pytest.mark.parametrize(
    ("array", "message"),
    [
        (pb.Array(dtype="nonsense", shape=[1], data=b"\0"), r"arrays\[0\]\.dtype: 'nonsense'"),
        (pb.Array(dtype="|O", shape=[1], data=b"\0" * 8), r"is not numeric"),
        (pb.Array(dtype="<f4", shape=[2, 2], data=b"\0" * 12), r"12 bytes do not hold shape"),
        (pb.Array(dtype="<f4", shape=[-1], data=b""), r"do not hold shape \(-1,\)"),
    ],
)
def test_malformed_arrays_are_refused_naming_the_field(array: pb.Array, message: str) -> None:
    with pytest.raises(BatchError, match=message):
        decode_arrays([array])
