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
from collections.abc import Callable

from stride.events.v1 import shard_pb2
from stride.trainer.agent_client import AgentClient

Say = Callable[..., None]


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

    def __init__(self, agent: AgentClient, dataset: str, leases: LeaseKeeper) -> None:
        self.agent = agent
        self.dataset = dataset
        self.leases = leases
        self._finished: int | None = None
        self.ended = False

    def finished(self, shard: shard_pb2.Shard) -> None:
        """Every step of ``shard`` has finished: report it done with the next call."""
        if self._finished is not None:
            self.flush()
        # Its lease is kept until the done report leaves, however long that waits.
        self._finished = shard.shard_id

    def flush(self) -> None:
        """Report a finished shard done now (before a snapshot, or at the end)."""
        if self._finished is None:
            return
        shard_id, self._finished = self._finished, None
        self.leases.release(shard_id)
        self.agent.report(self.dataset, shard_id, 0, done=True)

    def take(self, wait: bool) -> shard_pb2.Shard | None:
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
        return shard
