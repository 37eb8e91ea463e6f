"""Cutting an epoch into shards.

DLRover sec. 5.2: the dataset is not split by the number of workers but into many small
shards of sample indices, all placed in a TODO queue. Here a shard is a contiguous index
range of ``shard_batches * batch_size`` records; the last shard of an epoch is shorter.

An index-list shard is a slice ``[start, end)`` of the epoch's record permutation
(:func:`epoch_permutation`); a stream shard is offsets ``[start, end)`` of one partition.

Shard ids are ``epoch * shards_per_epoch + index`` (``index`` counts ranges from the start
of the dataset), so ids are unique per dataset, stable across restarts and need no counter.
With ``shuffle`` the order in which an epoch's shards are handed out is a permutation that
depends only on the seed and the epoch: a dispatcher restarted from its database, or a
simulator, hands out the same order.
"""

from __future__ import annotations

import random
import threading
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from stride.dispatcher.domain.datasets import DatasetParameters, ShardingKind


@dataclass(frozen=True)
class IndexRange:
    """Records ``[start, end)`` of the dataset."""

    start: int
    end: int

    @property
    def size(self) -> int:
        """Records in the range."""
        return self.end - self.start


def cut_ranges(record_count: int, shard_records: int) -> list[IndexRange]:
    """Contiguous ranges of ``shard_records`` covering ``[0, record_count)``, the last shorter."""
    if record_count <= 0 or shard_records <= 0:
        raise ValueError("record_count and shard_records must be positive")
    return [
        IndexRange(start, min(start + shard_records, record_count))
        for start in range(0, record_count, shard_records)
    ]


def epoch_seed(seed: int, epoch: int) -> int:
    """The shuffle seed of one epoch: distinct per epoch, fixed for a dataset seed.

    Integer seeds make :class:`random.Random` deterministic across processes and Python
    builds (unlike ``hash()`` of a string, which is salted per process).
    """
    return (seed & 0xFFFFFFFFFFFFFFFF) * 1_000_003 + epoch


def hand_out_order(parameters: DatasetParameters, epoch: int) -> list[int]:
    """Range indices of one epoch in the order they are handed out."""
    order = list(range(parameters.shards_per_epoch))
    if parameters.shuffle:
        random.Random(epoch_seed(parameters.seed, epoch)).shuffle(order)
    return order


ROWS_PER_WRITE = 1024
"""Shard rows written at a time when an epoch's TODO rows run out (:func:`next_rows`); the
default of ``DispatcherSettings.rows_per_write``, which says why."""
INLINE_ORDER_SHARDS = 4096
"""A shuffled epoch of at most this many shards has its order computed where it is first
needed (about 2 ms); a bigger one only off the event loop (:func:`compute_order`): a
1,000,000-shard shuffle is about half a second of CPU."""
ORDER_CACHE_SHARDS = 8_000_000
"""Shard positions the order cache keeps, over all epochs (8 bytes each: 64 MB): eight
epochs of the largest datasets, the newest of every busy job. The least recently used go."""


@dataclass(frozen=True)
class Shuffle:
    """A seeded shuffle of ``range(count)`` to compute once and cache: an epoch's hand-out
    order (``kind`` "order") or an index list's record order ("records").

    :meth:`compute` is CPU only and picklable, so the service runs it in a worker process:
    on a thread it held the GIL in 5 ms slices for half a second, and every other call
    waited for its slices (another job's GetShard p99 went from 7 to 108 ms,
    ``bench/dispatcher_epoch_cut.py``). :meth:`store` caches the result where it runs.
    """

    kind: str
    key: tuple[int, int, int]
    count: int
    seed: int

    def compute(self) -> bytes:
        """The shuffled order, as the bytes of a signed 64-bit array."""
        order = list(range(self.count))
        random.Random(self.seed).shuffle(order)
        return array("q", order).tobytes()

    def store(self, data: bytes) -> None:
        """Cache what :meth:`compute` returned."""
        order = array("q")
        order.frombytes(data)
        (_ORDERS if self.kind == "order" else _PERMUTATIONS).put(self.key, order)

    def run(self) -> None:
        """Compute and cache, here (tests, and small shuffles)."""
        self.store(self.compute())


class OrderNotReady(Exception):
    """The hand-out order of a big shuffled epoch is not computed yet. The caller runs
    :attr:`shuffle` off the event loop and asks again."""

    def __init__(self, parameters: DatasetParameters, epoch: int) -> None:
        super().__init__(f"the order of epoch {epoch} ({parameters.shards_per_epoch} shards)")
        self.parameters = parameters
        self.epoch = epoch
        self.shuffle = order_shuffle(parameters, epoch)


class _OrderCache:
    """Shuffled hand-out orders by (shards, seed, epoch), as compact arrays, least recently
    used first out. Thread-safe: orders are computed on worker threads."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._orders: OrderedDict[tuple[int, int, int], Sequence[int]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple[int, int, int]) -> Sequence[int] | None:
        with self._lock:
            order = self._orders.get(key)
            if order is not None:
                self._orders.move_to_end(key)
            return order

    def put(self, key: tuple[int, int, int], order: Sequence[int]) -> None:
        with self._lock:
            self._orders[key] = order
            self._orders.move_to_end(key)
            while len(self._orders) > 1 and sum(map(len, self._orders.values())) > self.capacity:
                self._orders.popitem(last=False)


_ORDERS = _OrderCache(ORDER_CACHE_SHARDS)


def _order_key(parameters: DatasetParameters, epoch: int) -> tuple[int, int, int]:
    return parameters.shards_per_epoch, parameters.seed, epoch


def order_ready(parameters: DatasetParameters, epoch: int) -> bool:
    """Whether :func:`epoch_order` answers at once (no big shuffle to compute first)."""
    return (
        not parameters.shuffle
        or parameters.shards_per_epoch <= INLINE_ORDER_SHARDS
        or _ORDERS.get(_order_key(parameters, epoch)) is not None
    )


def order_shuffle(parameters: DatasetParameters, epoch: int) -> Shuffle:
    """The shuffle that gives :func:`hand_out_order` of a shuffled epoch."""
    return Shuffle(
        "order",
        _order_key(parameters, epoch),
        parameters.shards_per_epoch,
        epoch_seed(parameters.seed, epoch),
    )


def compute_order(parameters: DatasetParameters, epoch: int) -> None:
    """Compute and cache an epoch's hand-out order here (CPU only: off the event loop)."""
    if _ORDERS.get(_order_key(parameters, epoch)) is None:
        order_shuffle(parameters, epoch).run()


def epoch_order(parameters: DatasetParameters, epoch: int) -> Sequence[int]:
    """:func:`hand_out_order` without a Python list per call: a ``range`` unshuffled, else
    the cached array. Raises :class:`OrderNotReady` for a big shuffled epoch not cached."""
    if not parameters.shuffle:
        return range(parameters.shards_per_epoch)
    order = _ORDERS.get(_order_key(parameters, epoch))
    if order is None:
        if parameters.shards_per_epoch > INLINE_ORDER_SHARDS:
            raise OrderNotReady(parameters, epoch)
        compute_order(parameters, epoch)
        order = _ORDERS.get(_order_key(parameters, epoch))
        assert order is not None
    return order


@dataclass(frozen=True)
class PlannedShard:
    """A shard of a new epoch, before anyone leased it."""

    shard_id: int
    epoch: int
    position: int
    """Place in the epoch's hand-out order; lower goes first."""
    start: int
    end: int
    partition: int = 0
    """Stream partition (0 for the index kinds)."""


def plan_shard(
    parameters: DatasetParameters, epoch: int, index: int, position: int
) -> PlannedShard:
    """The shard of range ``index`` of ``epoch``, handed out at ``position``."""
    partition, piece = divmod(index, parameters.ranges_per_partition)
    start = piece * parameters.shard_records
    end = min(start + parameters.shard_records, parameters.record_count)
    # A stream's epoch is the next window of every partition, not a re-read of the same one.
    base = epoch * parameters.record_count if parameters.kind is ShardingKind.STREAM else 0
    return PlannedShard(
        shard_id=epoch * parameters.shards_per_epoch + index,
        epoch=epoch,
        position=position,
        start=base + start,
        end=base + end,
        partition=partition,
    )


def plan_positions(
    parameters: DatasetParameters, epoch: int, first: int, stop: int
) -> list[PlannedShard]:
    """The shards handed out at positions ``[first, stop)`` of ``epoch``, in that order.

    Raises :class:`OrderNotReady` (see :func:`epoch_order`).
    """
    order = epoch_order(parameters, epoch)
    return [
        plan_shard(parameters, epoch, order[position], position)
        for position in range(first, min(stop, parameters.shards_per_epoch))
    ]


def plan_epoch(parameters: DatasetParameters, epoch: int) -> list[PlannedShard]:
    """Every shard of ``epoch``, in hand-out order (the in-memory queue's whole cut; the
    dispatcher writes an epoch's rows in batches instead, :func:`next_rows`)."""
    order = hand_out_order(parameters, epoch)
    return [plan_shard(parameters, epoch, index, position) for position, index in enumerate(order)]


@dataclass(frozen=True)
class RowBatch:
    """The next shards to write as rows: positions ``[first, stop)`` of ``epoch``."""

    epoch: int
    first: int
    stop: int
    new_epoch: bool
    """Whether this starts the epoch (it is cut: counted as created, none of it written)."""


def next_rows(
    parameters: DatasetParameters, epochs_created: int, written: int, wanted: int, batch: int
) -> RowBatch | None:
    """Which shards to write as rows when the TODO rows ran out; None if every shard of the
    last epoch has its row.

    DLRover sec. 5.2 puts every shard of a dataset in the TODO queue up front; here the queue
    is its rows followed by the newest epoch's positions from ``written`` on, which are TODO
    without a row (their order is fixed by the seed). A row is written just ahead of its
    lease, ``max(wanted, batch)`` at a time: a million-shard epoch is cut at once and written
    in short transactions, never in one long one that stalls every other job's calls.
    """
    shards = parameters.shards_per_epoch
    if epochs_created > 0 and written < shards:
        return RowBatch(
            epochs_created - 1, written, min(shards, written + max(wanted, batch)), False
        )
    if epochs_created >= parameters.epochs:
        return None
    return RowBatch(epochs_created, 0, min(shards, max(wanted, batch)), True)


def unwritten(parameters: DatasetParameters, epochs_created: int, written: int) -> int:
    """TODO shards of the newest epoch that have no row yet."""
    return parameters.shards_per_epoch - written if epochs_created > 0 else 0


_PERMUTATIONS = _OrderCache(2 * ORDER_CACHE_SHARDS)
"""Index-list record orders (up to MAX_LIST_RECORDS each): 128 MB at most."""


def _permutation_key(parameters: DatasetParameters, epoch: int) -> tuple[int, int, int]:
    return parameters.record_count, parameters.seed, epoch


def permutation_ready(parameters: DatasetParameters, epoch: int) -> bool:
    """Whether :func:`epoch_permutation` answers at once (no big shuffle to compute)."""
    return (
        not parameters.shuffle
        or parameters.record_count <= INLINE_ORDER_SHARDS
        or _PERMUTATIONS.get(_permutation_key(parameters, epoch)) is not None
    )


def permutation_shuffle(parameters: DatasetParameters, epoch: int) -> Shuffle:
    """The shuffle that gives :func:`epoch_permutation` of a shuffled index-list epoch."""
    return Shuffle(
        "records",
        _permutation_key(parameters, epoch),
        parameters.record_count,
        epoch_seed(parameters.seed, epoch) ^ 0x5EED,
    )


def compute_permutation(parameters: DatasetParameters, epoch: int) -> None:
    """Compute and cache an index-list epoch's record order here (CPU only: off the loop)."""
    if _PERMUTATIONS.get(_permutation_key(parameters, epoch)) is None:
        permutation_shuffle(parameters, epoch).run()


def epoch_permutation(parameters: DatasetParameters, epoch: int) -> Sequence[int]:
    """The record order of an index-list epoch: a seeded shuffle (identity without shuffle).

    Deterministic in (seed, epoch) like the shard order, so a restarted dispatcher slices
    the same indices. Cached as a compact array: consecutive hand-outs slice the same epoch.
    Computed here if missing; callers on the event loop compute a big one first, off it
    (:func:`permutation_ready`, :func:`compute_permutation`).
    """
    if not parameters.shuffle:
        return range(parameters.record_count)
    compute_permutation(parameters, epoch)
    order = _PERMUTATIONS.get(_permutation_key(parameters, epoch))
    assert order is not None
    return order


def shard_indices(parameters: DatasetParameters, epoch: int, start: int, end: int) -> list[int]:
    """The record indices of an index-list shard ``[start, end)``."""
    return list(epoch_permutation(parameters, epoch)[start:end])
