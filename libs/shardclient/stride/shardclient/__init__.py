"""The shard dispatcher's client: what the agent and the TensorFlow integration use to read
a dataset as a worker (prefetching, periodic progress, retries, incarnation fencing).

``ShardClient`` wraps the RPCs; ``ShardReader`` is a plain iterator of sample indices.
"""

from stride.shardclient.client import (
    ClientClosed,
    Committed,
    LeasedShard,
    RetryPolicy,
    Revoked,
    ShardClient,
    ShardReply,
)
from stride.shardclient.reader import ShardReader
from stride.shardclient.steps import StepOrderer

__all__ = [
    "ClientClosed",
    "Committed",
    "LeasedShard",
    "RetryPolicy",
    "Revoked",
    "ShardClient",
    "ShardReader",
    "ShardReply",
    "StepOrderer",
]
