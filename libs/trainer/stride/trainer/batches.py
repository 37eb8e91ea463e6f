"""Ready mini-batches: how a data worker makes one and how it travels to the chief.

A data worker makes a step's whole mini-batch (GoldMiner sec. 3.3): the job's
``make_batch(indices)`` reads the samples, and the data half of its model (what
:func:`stride.trainer.partition.split_model` cut off ahead of the model state) turns them
into the training half's inputs. The chief trains the training half on them. Arrays travel
as numpy lays them out (dtype, shape, C-ordered bytes); only numeric arrays travel, since
the data half ends where the strings have become numbers.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from stride.api.dataworker.v1 import dataworker_service_pb2 as pb

MakeBatch = Callable[[np.ndarray], Sequence[np.ndarray]]
"""Sample indices -> the step's arrays, inputs first and labels last."""


class BatchError(ValueError):
    """A batch that cannot travel or cannot be read back; the message names the array."""


def encode_arrays(arrays: Sequence[np.ndarray]) -> list[pb.Array]:
    """``arrays`` as wire arrays; :class:`BatchError` for a non-numeric one."""
    encoded = []
    for position, array in enumerate(arrays):
        value = np.asarray(array)
        if value.dtype.kind not in "biuf":
            raise BatchError(
                f"arrays[{position}]: dtype {value.dtype} does not travel; a data worker "
                "sends only numeric arrays (bool, int, float)"
            )
        encoded.append(
            pb.Array(
                dtype=value.dtype.str,
                shape=list(value.shape),
                data=np.ascontiguousarray(value).tobytes(),
            )
        )
    return encoded


def decode_arrays(arrays: Sequence[pb.Array]) -> list[np.ndarray]:
    """Wire arrays back as numpy arrays; :class:`BatchError` names a malformed one."""
    decoded = []
    for position, array in enumerate(arrays):
        try:
            dtype = np.dtype(array.dtype)
        except TypeError:
            raise BatchError(f"arrays[{position}].dtype: {array.dtype!r} is not a dtype") from None
        if dtype.kind not in "biuf":
            raise BatchError(f"arrays[{position}].dtype: {array.dtype!r} is not numeric")
        shape = tuple(int(n) for n in array.shape)
        if any(n < 0 for n in shape) or int(np.prod(shape)) * dtype.itemsize != len(array.data):
            raise BatchError(
                f"arrays[{position}]: {len(array.data)} bytes do not hold shape {shape} of {dtype}"
            )
        decoded.append(np.frombuffer(array.data, dtype=dtype).reshape(shape))
    return decoded


@dataclass(frozen=True)
class Ready:
    """A produced mini-batch: the training half's inputs, labels last."""

    step_id: int
    epoch: int
    indices: np.ndarray
    arrays: list[np.ndarray]
    split: bool
    """True when ``arrays`` are the data half's outputs (train the training half); False
    when they are ``make_batch``'s own (train the whole model)."""
    produce_seconds: float = 0.0


class Producer:
    """Makes ready mini-batches: ``make_batch`` and then the model's data half."""

    def __init__(self, make_batch: MakeBatch, data_model: Any | None) -> None:
        """``data_model`` None: the model has no data half, and ``make_batch``'s arrays are
        the whole mini-batch (the chief trains the whole model on them)."""
        self.make_batch = make_batch
        self.data_model = data_model
        self._run: Any = None
        if data_model is not None:
            import tensorflow as tf

            # One traced function per input signature: the data half runs as a graph.
            self._run = tf.function(lambda inputs: data_model(inputs, training=False))

    def produce(self, step_id: int, epoch: int, indices: np.ndarray) -> Ready:
        """The step's mini-batch, made here."""
        started = time.perf_counter()
        if self._run is None:
            arrays = [np.asarray(a) for a in self.make_batch(indices)]
            return Ready(step_id, epoch, indices, arrays, False, time.perf_counter() - started)
        *inputs, labels = self.make_batch(indices)
        outputs = self._run(list(inputs))
        if not isinstance(outputs, list | tuple):
            outputs = [outputs]
        arrays = [np.asarray(output) for output in outputs] + [np.asarray(labels)]
        return Ready(step_id, epoch, indices, arrays, True, time.perf_counter() - started)


def to_wire(ready: Ready) -> pb.ReadyBatch:
    """A produced mini-batch as the data worker streams it."""
    return pb.ReadyBatch(
        step_id=ready.step_id,
        epoch=ready.epoch,
        indices=ready.indices.tolist(),
        arrays=encode_arrays(ready.arrays),
        produce_seconds=ready.produce_seconds,
        split=ready.split,
    )


def from_wire(batch: pb.ReadyBatch) -> Ready:
    """A streamed mini-batch as the chief trains it."""
    return Ready(
        batch.step_id,
        batch.epoch,
        np.asarray(batch.indices, dtype=np.int64),
        decode_arrays(batch.arrays),
        batch.split,
        batch.produce_seconds,
    )
