"""Straggler detection from progress rates, and the smaller shards a straggler gets.

DLRover sec. 5.4: "Straggler is a node which is significantly slower than others. If a
worker is straggler, Data Shard Manager would dispatch fewer data shards to this worker."
DLRover-RM sec. 5.1: the job master compares the progress offsets in workers' heartbeats,
labels a worker that "lags significantly behind its peers" a straggler, and gives it a
shard with fewer batches ("scaling down from a shard with 256 batches to one with 128").

Neither paper gives a number for "significantly", so the rule here is ours:

* each worker's rate is records reported per second, decayed over ``window`` seconds
  (:func:`decayed_rate`), so a rate follows a change within about one window. It starts
  at zero when the worker registers (its first GetShard), and the part of its weight that
  zero still holds is taken out before it is judged (:func:`judged_rate`): a worker that
  joins a running job (a scale-out, a replaced pod) is compared at its real pace. Without
  that, with reports every third of a window a newcomer was first judged at about 0.6 of
  its pace, and one joining a running job at its peers' pace was flagged;
* a worker is a straggler when its rate is below ``STRAGGLER_RATIO`` (one half) of the
  median rate of its peers, judged only with at least ``MIN_PEERS`` peers (the median of
  one peer is that peer, which says nothing about who is slow);
* it stays one until its rate is back above ``RECOVERY_RATIO`` (three quarters) of the
  median, so a worker near the line does not flap;
* a straggler's shards are half the dataset's shard size (the papers' 256 -> 128 example),
  never less than one batch.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Set

from stride.dispatcher.domain.datasets import DatasetParameters

STRAGGLER_RATIO = 0.5
"""A worker below this fraction of its peers' median rate is a straggler."""
RECOVERY_RATIO = 0.75
"""A straggler stops being one above this fraction of the median (hysteresis)."""
MIN_PEERS = 2
"""Peers needed before anyone is judged."""


def decayed_rate(previous: float, records: int, elapsed: float, window: float) -> float:
    """The rate after ``records`` more were reported ``elapsed`` seconds after the last report.

    An exponentially time-weighted average of records per second with time constant
    ``window``: the new interval's rate gets weight ``1 - exp(-elapsed / window)``. A burst
    of reports close together therefore moves the rate by about ``records / window``, not
    by an enormous instantaneous rate.
    """
    if elapsed <= 0:
        return previous + records / window
    weight = 1.0 - math.exp(-elapsed / window)
    return previous * (1.0 - weight) + (records / elapsed) * weight


def judged_rate(rate: float, measured: float, window: float) -> float:
    """The rate a worker is judged by: ``rate``, decayed from zero since registration over
    ``measured`` seconds of reports (its last report's time less its registration's),
    divided by the weight those reports have in it, ``1 - exp(-measured / window)``.

    The bias correction of an exponentially weighted average that starts at zero: a worker
    reporting ``r`` records a second from its registration on is judged at ``r`` however
    recently it registered, not at ``r`` times that weight. After a few windows the weight
    is one and nothing changes.
    """
    if measured <= 0:
        return rate
    return rate / (1.0 - math.exp(-measured / window))


def judge(rates: Mapping[str, float], current: Set[str]) -> set[str]:
    """The stragglers among ``rates`` (worker -> rate), given who is one now."""
    stragglers = set()
    for worker, rate in rates.items():
        peers = [r for w, r in rates.items() if w != worker]
        if len(peers) < MIN_PEERS:
            continue
        median = statistics.median(peers)
        if median <= 0:
            continue
        limit = RECOVERY_RATIO if worker in current else STRAGGLER_RATIO
        if rate < limit * median:
            stragglers.add(worker)
    return stragglers


def straggler_shard_records(parameters: DatasetParameters) -> int:
    """Records in a straggler's shard: half the batches of a normal one, at least one batch."""
    return max(parameters.shard_batches // 2, 1) * parameters.batch_size
