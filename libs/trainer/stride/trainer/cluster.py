"""The chief's link to its TensorFlow cluster, and moving that link to a new cluster inside
the running process.

A plan that changes the cluster (DLRover-RM sec. 5.2) reaches the chief as a RECONFIGURE
with the new cluster. How the chief follows depends on what changed (:func:`classify`):

- **workers only** (scale out, scale in, a worker moved): the variables live on the PS, which
  stay, so nothing is saved or restored. The chief finishes its in-flight steps, connects
  the new cluster in place (TensorFlow's ``update_server_def``: contexts on the tasks that
  stay are kept, with the variables in them; new tasks get one), and makes a new strategy
  and coordinator over it. The pause is the reconnection and the first step's tracing.
- **PS changed** (more or fewer PS, a PS moved): the variables must be repartitioned. The
  chief saves a flash checkpoint, drops its model, connects the new cluster afresh (new
  remote contexts everywhere, without leaving the process: TensorFlow and the job's code
  stay loaded), rebuilds the model under the new strategy (its variables placed
  round-robin over the new PS) and restores the checkpoint into it.
- **the chief moved** (its pod was migrated): the chief process itself goes. It saves a flash
  checkpoint and hands over to the new chief pod, which started first as a standby (its
  TensorFlow and the job's code already loaded) and restores.
- **incompatible** (a task's address now serves another task): re-execute on the new cluster
  and restore, the path a failed PS also takes.

Departure, said here and in the closing note: TensorFlow's ParameterServerStrategy has no
public call to change its cluster. ``tf.config.experimental_connect_to_cluster`` with another
cluster makes every remote context anew (the variables go with them): a PS change uses that.
The workers-only move calls ``context.context().update_server_def``, the call TensorFlow's
own coordinator makes to take relaunched workers back (``WorkerPreemptionHandler``), and
stops the old coordinator's threads through its cluster's ``stop``, as its destructor would.
Both are guarded: anything unexpected falls back to re-execution.
"""

from __future__ import annotations

import enum
import gc
import socket
from collections.abc import Mapping, Sequence
from typing import Any

from stride.trainer.settings import TF_ROLES

Cluster = Mapping[str, Sequence[str]]
"""``{"chief": [...], "ps": [...], "worker": [...]}`` of host:port addresses in task order."""


class ClusterChange(enum.Enum):
    """What a new cluster changes for the chief, and so how it follows."""

    NONE = "none"
    """The same cluster: nothing to do."""
    WORKERS = "workers"
    """Only workers came or went: move in place, the variables stay on the PS."""
    PARAMETER_SERVERS = "parameter servers"
    """The PS changed: checkpoint, move in place, rebuild and restore."""
    CHIEF_MOVED = "chief moved"
    """The chief has a new pod: checkpoint and hand over to it."""
    INCOMPATIBLE = "incompatible"
    """An address serves another task now: re-execute and restore."""


def _tasks(cluster: Cluster) -> dict[str, tuple[str, int]]:
    return {
        address: (role, index)
        for role, addresses in cluster.items()
        if role in TF_ROLES
        for index, address in enumerate(addresses)
    }


def classify(old: Cluster, new: Cluster) -> ClusterChange:
    """How the chief goes from cluster ``old`` to cluster ``new``. Data workers are not
    TensorFlow tasks: a change of data workers alone is :attr:`ClusterChange.NONE`."""

    def listed(cluster: Cluster, role: str) -> list[str]:
        return list(cluster.get(role, ()))

    if all(listed(old, role) == listed(new, role) for role in TF_ROLES):
        return ClusterChange.NONE
    if listed(old, "chief") != listed(new, "chief"):
        return ClusterChange.CHIEF_MOVED
    before, after = _tasks(old), _tasks(new)
    # TensorFlow keys a remote context by task name; a server that already holds this
    # client's context as one task cannot take another task's name in place.
    if any(before[address] != task for address, task in after.items() if address in before):
        return ClusterChange.INCOMPATIBLE
    if listed(old, "ps") != listed(new, "ps"):
        return ClusterChange.PARAMETER_SERVERS
    return ClusterChange.WORKERS


class MoveFailed(Exception):
    """The cluster could not be moved in place; the caller re-executes instead."""


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


class ClusterConnection:
    """The chief's ``ParameterServerStrategy`` and ``ClusterCoordinator`` over one cluster,
    and :meth:`move` to another without leaving the process.

    :attr:`cluster` is the cluster as the podwatcher sees it. TensorFlow is connected to the
    same cluster with one difference after a fresh reconnection: the chief's own server
    (which TensorFlow cannot stop) keeps its port, so a new one is served on another port
    of the chief's host. No other task connects to the chief (in ParameterServerStrategy
    the chief calls the workers and PS), so the address only has to be free."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = {role: list(addresses) for role, addresses in cluster.items()}
        self.chief_address = self.cluster["chief"][0]
        """Where this process's TensorFlow server for the chief task listens."""
        self.strategy: Any = None
        self.coordinator: Any = None

    def _connected_cluster(self) -> dict[str, list[str]]:
        return {
            role: [self.chief_address] if role == "chief" else list(addresses)
            for role, addresses in self.cluster.items()
            if addresses and role in TF_ROLES
        }

    def connect(self) -> None:
        """Connect to :attr:`cluster` (TensorFlow's own connection, through the strategy)."""
        import tensorflow as tf

        resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
            tf.train.ClusterSpec(self._connected_cluster()),
            task_type="chief",
            task_id=0,
            rpc_layer="grpc",
        )
        self.strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
        self.coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(self.strategy)

    def move(self, cluster: Cluster, *, keep_state: bool) -> None:
        """Follow ``cluster`` in place: finish in-flight steps, stop the old coordinator, and
        connect a new strategy and coordinator.

        ``keep_state`` (workers only): the remote contexts are updated, and kept on the
        tasks that stay, with the variables on the PS. Otherwise every context is made anew
        (TensorFlow's ``experimental_connect_to_cluster`` with a new cluster): the old
        variables are gone and the caller restores them from a checkpoint. An update does
        not reach a new PS from the workers that stay (they answer "No worker known as
        /job:ps/..."), so a PS change always starts afresh.

        Raises :class:`MoveFailed` when TensorFlow refuses; the old strategy is unusable
        then and the caller re-executes."""
        import tensorflow as tf
        from tensorflow.core.protobuf.tensorflow_server_pb2 import ServerDef
        from tensorflow.python.eager import context

        if list(cluster.get("chief", ())) != self.cluster["chief"]:
            raise MoveFailed("the chief's own address changed: that is a handover")
        if self.coordinator is not None:
            self.coordinator.join()
            self._stop_coordinator()
        self.cluster = {role: list(addresses) for role, addresses in cluster.items()}
        try:
            if keep_state:
                current = context.get_server_def()
                if current is None:
                    raise MoveFailed("not connected to a cluster")
                updated = ServerDef()
                updated.CopyFrom(current)
                updated.cluster.CopyFrom(
                    tf.train.ClusterSpec(self._connected_cluster()).as_cluster_def()
                )
                # ParameterServerStrategy then finds the cluster unchanged and only
                # refreshes its device filters, keeping the contexts.
                context.context().update_server_def(updated)
            else:
                host = self.chief_address.rpartition(":")[0]
                self.chief_address = f"{host}:{_free_port(host)}"
            self.connect()
        except MoveFailed:
            raise
        except Exception as error:  # TensorFlow's refusal, whatever its type
            raise MoveFailed(f"{type(error).__name__}: {str(error)[:300]}") from error

    def _stop_coordinator(self) -> None:
        coordinator, strategy = self.coordinator, self.strategy
        self.coordinator = self.strategy = None
        # What ClusterCoordinator.__del__ does, now rather than whenever the cycle between
        # the strategy and its coordinator is collected: its worker threads would otherwise
        # go on taking closures for the old cluster.
        coordinator._cluster.stop()
        if strategy is not None and getattr(strategy, "_cluster_coordinator", None) is coordinator:
            strategy._cluster_coordinator = None
        del coordinator, strategy
        gc.collect()
