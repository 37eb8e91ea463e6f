"""The chief's shards: one round trip per shard, asked for ahead, with their leases kept.

Each shard costs the chief a call to its agent and the agent a call to the dispatcher. On
the path of every step, that cost adds up (``bench/agent_overhead.py`` measures it), so
:class:`ShardFeed` hides it behind the training:

- **ahead**: while a shard's steps run on the workers, the next shard is asked for
  (``no_wait``: if only held shards remain, the answer is "none now", never a wait on a
  shard this chief itself holds);
- **done with the next**: a shard whose steps have finished is reported done in the same
  call that asks for the next one (the dispatcher completes it first, in one transaction);
- **flushed before a snapshot**: a checkpoint's shard state must count every shard whose
  training the checkpoint holds, so :meth:`ShardFeed.flush` reports a finished shard at
  once before the snapshot is taken. A shard asked for ahead and not trained yet is leased
  at the snapshot; a restore from it gives the shard back (nothing lost, nothing twice).

:class:`LeaseKeeper` reports every held shard's offset on a thread, so a shard whose steps
wait on a worker being relaunched is not taken back by its lease (DLRover sec. 5.2's
heartbeats); a chief that died stops reporting and its shards come back.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from stride.events.v1 import shard_pb2
from stride.trainer.agent_client import AgentClient
from stride.trainer.batches import MakeBatch

Say = Callable[..., None]


def shard_indices(shard: shard_pb2.Shard) -> np.ndarray:
    """The sample indices of ``shard`` not yet consumed (from its offset on)."""
    if shard.indices:
        return np.asarray(shard.indices[shard.offset :], dtype=np.int64)
    return np.arange(shard.start + shard.offset, shard.end, dtype=np.int64)


@dataclass(frozen=True)
class ShardUnit:
    """A shard as the loop trains it: batches made here by ``make_batch``, each a step."""

    shard: shard_pb2.Shard
    make_batch: MakeBatch
    batch_size: int

    @property
    def indices(self) -> np.ndarray:
        return shard_indices(self.shard)

    @property
    def samples(self) -> int:
        return len(self.indices)

    @property
    def step_count(self) -> int:
        return -(-self.samples // self.batch_size)

    def batches(self) -> Iterator[tuple[bool, Sequence[np.ndarray]]]:
        """(made by a data worker: never here, the arrays) per step."""
        indices = self.indices
        for start in range(0, len(indices), self.batch_size):
            yield False, self.make_batch(indices[start : start + self.batch_size])

    def log_records(self) -> Iterator[dict[str, Any]]:
        """What the consumed log records of the shard."""
        yield {
            "epoch": self.shard.epoch,
            "shard_id": self.shard.shard_id,
            "indices": self.indices.tolist(),
        }


class LeaseKeeper:
    """Reports the offset of every shard the chief holds, every ``every`` seconds."""

    def __init__(self, agent: AgentClient, dataset: str, every: float, say: Say) -> None:
        self.agent = agent
        self.dataset = dataset
        self.every = every
        self.say = say
        self._held: dict[int, int] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stride-lease", daemon=True)
        self._thread.start()

    def hold(self, shard: shard_pb2.Shard) -> None:
        """A shard the chief now holds (asked for ahead, or in training)."""
        with self._lock:
            self._held[shard.shard_id] = shard.offset

    def release(self, shard_id: int) -> None:
        """A shard about to be reported done (or given up)."""
        with self._lock:
            self._held.pop(shard_id, None)

    def close(self) -> None:
        """Stop reporting."""
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            # Under the lock, so a shard released (and then reported done) is never
            # heartbeaten after its done report.
            with self._lock:
                for shard_id, offset in list(self._held.items()):
                    try:
                        self.agent.report(self.dataset, shard_id, offset, done=False)
                    except Exception as error:  # a heartbeat never ends training itself
                        self.say("lease heartbeat refused", shard=shard_id, why=str(error)[:200])


class ShardFeed:
    """The chief's source of shards (see the module docstring)."""

    def __init__(
        self,
        agent: AgentClient,
        dataset: str,
        leases: LeaseKeeper,
        make_batch: MakeBatch,
        batch_size: int,
    ) -> None:
        self.agent = agent
        self.dataset = dataset
        self.leases = leases
        self.make_batch = make_batch
        self.batch_size = batch_size
        self._finished: int | None = None
        self.ended = False

    def finished(self, unit: ShardUnit) -> None:
        """Every step of ``unit`` has finished: report its shard done with the next call."""
        if self._finished is not None:
            self.flush()
        # Its lease is kept until the done report leaves, however long that waits.
        self._finished = unit.shard.shard_id

    def flush(self) -> None:
        """Report a finished shard done now (before a snapshot, or at the end)."""
        if self._finished is None:
            return
        shard_id, self._finished = self._finished, None
        self.leases.release(shard_id)
        self.agent.report(self.dataset, shard_id, 0, done=True)

    def take(self, wait: bool) -> ShardUnit | None:
        """The next shard, reporting a finished one done in the same call. ``None`` at the
        end of the data (:attr:`ended`), or, without ``wait``, when none is free now."""
        if self.ended:
            self.flush()
            return None
        done, self._finished = self._finished, None
        if done is not None:
            self.leases.release(done)
        shard, end_of_data = self.agent.next_shard(self.dataset, done=done, wait=wait)
        if shard is not None:
            self.leases.hold(shard)
        self.ended = end_of_data
        return None if shard is None else ShardUnit(shard, self.make_batch, self.batch_size)

    def follow(self, addresses: Sequence[str]) -> None:
        """Data workers serve only a job read by steps (:class:`stride.trainer.dataqueue.
        StepFeed`); a job read by shards makes its batches here whatever the plan says."""

    def close(self) -> None:
        """Nothing runs on its own here (the leases are the :class:`LeaseKeeper`'s)."""
