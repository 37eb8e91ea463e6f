"""The GoldMiner data-worker mode: index batches tagged with step ids (GoldMiner sec. 4).

Stateless data workers fetch batches of sample indices and produce mini-batches from them;
training workers consume the mini-batches in step-id order. The batch of a step id is
fixed by the dataset's parameters and seed (:func:`batch_of`), so the dispatching order is
deterministic and a consumption state is just the last consumed step id.

* The dispatcher records, for each dispatched step, who fetched it and until when it must
  be consumed. A step not consumed by then is handed out again to the next data worker
  that asks (its data worker is presumed lost or slow).
* The consumer reports the last step id it consumed, in order; steps up to it are never
  handed out again, and it drops any batch whose step id is at or below it (a re-dispatch
  can produce a step twice): :class:`stride.shardclient.steps.StepOrderer`.

Together this is exactly once per epoch for formats whose indices map to mini-batches
deterministically (small files, table rows). For formats where a data worker cannot
reproduce a mini-batch from indices (interleaved TFRecord files) the paper falls back to
at most once by treating dispatched data as consumed; see the service README.
"""

from __future__ import annotations

from dataclasses import dataclass

from stride.dispatcher.domain.datasets import DatasetParameters, ShardingKind
from stride.dispatcher.domain.sharding import epoch_permutation
from stride.runtime.errors import FailedPrecondition

MAX_IN_FLIGHT = 4096
"""Steps dispatched but not consumed, at most: bounds the lease table and the consumer's
reorder buffer. Far more than data workers prefetch (GoldMiner keeps a few batches each)."""


def check_stepped(parameters: DatasetParameters, dataset: str) -> None:
    """Streams have no fixed index batches; refuse them for the data-worker mode."""
    if parameters.kind is ShardingKind.STREAM:
        raise FailedPrecondition(
            f"dataset: {dataset!r} is a stream; data-worker batches need an index dataset"
        )


def batches_per_epoch(parameters: DatasetParameters) -> int:
    """Batches in one epoch (the last one may be shorter)."""
    return -(-parameters.record_count // parameters.batch_size)


def total_steps(parameters: DatasetParameters) -> int:
    """Step ids run from 0 to this, exclusive, over every epoch."""
    return batches_per_epoch(parameters) * parameters.epochs


@dataclass(frozen=True)
class StepBatch:
    """The indices of one step."""

    step_id: int
    epoch: int
    indices: list[int]


def batch_of(parameters: DatasetParameters, step_id: int) -> StepBatch:
    """The batch of ``step_id``: its epoch's record order, sliced by batch size.

    Index lists follow the epoch's seeded permutation; index ranges are read in order.
    """
    per_epoch = batches_per_epoch(parameters)
    epoch, batch = divmod(step_id, per_epoch)
    first = batch * parameters.batch_size
    last = min(first + parameters.batch_size, parameters.record_count)
    if parameters.kind is ShardingKind.INDEX_LIST:
        indices = list(epoch_permutation(parameters, epoch)[first:last])
    else:
        indices = list(range(first, last))
    return StepBatch(step_id, epoch, indices)


def new_steps(
    next_step: int, consumed_step: int, total: int, wanted: int, in_flight: int = MAX_IN_FLIGHT
) -> range:
    """Step ids to dispatch for the first time: up to ``wanted``, with at most ``in_flight``
    steps dispatched and not consumed (the consumer's queue: what it may have to hold)."""
    room = min(in_flight, MAX_IN_FLIGHT) - (next_step - consumed_step - 1)
    count = max(0, min(wanted, total - next_step, room))
    return range(next_step, next_step + count)
