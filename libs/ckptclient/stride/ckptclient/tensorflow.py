"""Flash checkpoints of TensorFlow state: the variables of a ``tf.train.Checkpoint``, a
``tf.Module`` or a Keras model and optimizer, saved and restored through the cache.

Variables are named by their path in TensorFlow's object graph (``model/layer_with_weights-0/
kernel``, the names tf.train.Checkpoint itself would use), so the same code that builds the
model in a new process finds every value again. A save copies each variable's value once
into shared memory; a restore assigns the stored values back.

A save reads the variables without copying them: on the CPU, ``np.asarray`` of a
variable's read value is a view of the variable's own buffer (``variable.numpy()`` would
copy it first, a second memcpy of the whole state in the blocking path). That view is a
consistent snapshot: while it is alive, TensorFlow copies a variable's buffer before it
updates it (copy-on-write in its resource-variable and optimizer kernels), so the snapshot
never changes. :func:`save_in_background` uses that to return after the snapshot alone and
copy into shared memory on a thread; the cost does not vanish, it moves: a training step
that updates the variables while the copy runs pays the copy-on-write, about one memcpy of
what it updates (bench/ckptcache.py measures both, side by side).

A Keras optimizer creates its slot variables lazily: build it before restoring
(``optimizer.build(model.trainable_variables)``) so its state has somewhere to go.
"""

from __future__ import annotations

from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from stride.ckptclient.client import CheckpointClient, RestoredCheckpoint, SavedCheckpoint


def _is_variable(node: Any) -> bool:
    # Keras 3 variables wrap a tf.Variable; either is one value to save, not a node to walk.
    return isinstance(node, (tf.Variable, keras.Variable))


def _numpy_dtype(variable: Any) -> np.dtype[Any]:
    dtype = variable.dtype
    found: np.dtype[Any] = np.dtype(getattr(dtype, "as_numpy_dtype", dtype))
    return found


def variables_of(root: Any) -> dict[str, Any]:
    """Every variable reachable from ``root``, by its object-graph path (breadth first, the
    first path found wins, as in TensorFlow's own checkpoints)."""
    found: dict[str, Any] = {}
    seen: set[int] = {id(root)}
    queue: deque[tuple[str, Any]] = deque([("", root)])
    while queue:
        path, node = queue.popleft()
        for name, child in tf.train.TrackableView.children(node).items():
            if id(child) in seen:
                continue
            seen.add(id(child))
            child_path = f"{path}/{name}" if path else name
            if _is_variable(child):
                found[child_path] = child
            else:
                queue.append((child_path, child))
    return found


def snapshot(root: Any) -> dict[str, np.ndarray]:
    """The current values of ``root``'s variables as read-only arrays, without a copy on
    the CPU (a device variable is copied to the host); they stay as they are while the
    variables go on being trained (TensorFlow copies a variable before updating it while
    such a snapshot is alive)."""
    return {
        name: np.asarray(tf.convert_to_tensor(variable))
        for name, variable in variables_of(root).items()
    }


def save(client: CheckpointClient, root: Any, step: int, **options: Any) -> SavedCheckpoint:
    """Save the variables of ``root`` at ``step`` (options as for CheckpointClient.save):
    one copy of their values, into shared memory (or the stream)."""
    return client.save(step, snapshot(root), **options)


_saver = ThreadPoolExecutor(max_workers=1, thread_name_prefix="stride-checkpoint")
"""Background saves, one at a time and in order (a single worker runs them FIFO)."""


def save_in_background(
    client: CheckpointClient, root: Any, step: int, **options: Any
) -> Future[SavedCheckpoint]:
    """Snapshot the variables of ``root`` now and save the snapshot on a thread.

    Returns at once with a future of the save; training may go on meanwhile, and each
    variable it updates before the copy is done is copied by TensorFlow first (the cost of
    the overlap: about one memcpy of the updated variables, paid by that step). Saves run
    one at a time, in order; wait for the future before relying on the checkpoint.
    """
    arrays = snapshot(root)

    def run() -> SavedCheckpoint:
        try:
            return client.save(step, arrays, **options)
        finally:
            arrays.clear()  # drop the snapshot: training stops paying copy-on-write

    return _saver.submit(run)


def restore(
    client: CheckpointClient, root: Any, checkpoint_id: str = "", *, shard_index: int = 0
) -> RestoredCheckpoint:
    """Assign the newest checkpoint's (or ``checkpoint_id``'s) values to ``root``'s variables.

    Raises ValueError, changing nothing, if a variable is missing from the checkpoint or
    has another shape or dtype there.
    """
    restored = client.restore(checkpoint_id, shard_index=shard_index)
    variables = variables_of(root)
    problems = []
    for name, variable in variables.items():
        value = restored.tensors.get(name)
        if value is None:
            problems.append(f"{name}: not in checkpoint {restored.checkpoint_id}")
        elif tuple(value.shape) != tuple(variable.shape) or value.dtype != _numpy_dtype(variable):
            problems.append(
                f"{name}: checkpoint has {value.dtype}{list(value.shape)}, the variable is "
                f"{_numpy_dtype(variable)}{list(variable.shape)}"
            )
    if problems:
        raise ValueError("cannot restore: " + "; ".join(problems[:5]))
    for name, variable in variables.items():
        variable.assign(restored.tensors[name])
    return restored
