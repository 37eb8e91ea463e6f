"""Flash checkpoints of TensorFlow state: the variables of a ``tf.train.Checkpoint``, a
``tf.Module`` or a Keras model and optimizer, saved and restored through the cache.

Variables are named by their path in TensorFlow's object graph (``model/layer_with_weights-0/
kernel``, the names tf.train.Checkpoint itself would use), so the same code that builds the
model in a new process finds every value again. A save copies each variable's value once
into shared memory; a restore assigns the stored values back.

A Keras optimizer creates its slot variables lazily: build it before restoring
(``optimizer.build(model.trainable_variables)``) so its state has somewhere to go.
"""

from __future__ import annotations

from collections import deque
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


def save(client: CheckpointClient, root: Any, step: int, **options: Any) -> SavedCheckpoint:
    """Save the variables of ``root`` at ``step`` (options as for CheckpointClient.save)."""
    arrays: dict[str, np.ndarray] = {
        name: np.asarray(variable.numpy()) for name, variable in variables_of(root).items()
    }
    return client.save(step, arrays, **options)


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
