"""The trainer-side checkpoint library: flash saves through Stride's checkpoint cache.

``CheckpointClient.save(step, {name: array})`` puts the state into the node's shared
memory in about the time of one memory copy; ``restore()`` returns the newest intact
checkpoint. ``stride.ckptclient.tensorflow`` does the same for TensorFlow and Keras state.
"""

from stride.ckptclient.client import (
    CheckpointCacheError,
    CheckpointClient,
    CorruptCheckpointError,
    RestoredCheckpoint,
    SavedCheckpoint,
    new_checkpoint_id,
)
from stride.ckptclient.shared_memory import SharedMemoryFull

__all__ = [
    "CheckpointCacheError",
    "CheckpointClient",
    "CorruptCheckpointError",
    "RestoredCheckpoint",
    "SavedCheckpoint",
    "SharedMemoryFull",
    "new_checkpoint_id",
]
