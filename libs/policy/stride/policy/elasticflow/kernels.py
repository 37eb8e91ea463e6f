"""Algorithm 1's progressive filling (ElasticFlow sec. 4.1, lines 11-22) compiled with numba.

Admission re-fills every guaranteed job at each decision instant, a few hundred fills per
submission on a busy cluster, and each fill is a dozen small array operations: as numpy
calls their fixed cost (about 1 us each) was most of a decision
(``bench/admission_grpc.py``). Compiled, one fill is one call that walks the slots.

:func:`fill_slots` answers exactly as :meth:`.admission.PlannedJob.fill_reference` (the
numpy form, kept as the reference the property test compares it with): the same histogram
of free devices per slot, the smallest cap whose progress meets the work left, and the slot
in which the job completes. Sums run in slot order, as ``numpy.cumsum`` does; only the
progress per cap, a dot product there, may be summed in another order, a difference far
below :data:`.admission.PROGRESS_TOLERANCE`.

numba is imported on the first fill, not with the policy package: a process that never
plans a deadline (most of the suite's services) does not pay its import (about a second).
Compiled code is cached on disk (``NUMBA_CACHE_DIR``, else beside this file, else the
user's cache); where none of those can be written it is compiled once per process instead.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


def _fill_slots(
    used: IntArray,
    capacity: int,
    slots: int,
    first: float,
    needed: float,
    steps: IntArray,
    progress: FloatArray,
    progress_by_cap: FloatArray,
    usable: IntArray,
) -> IntArray:
    """The job's devices per slot, up to the slot it completes in; empty: it cannot meet its
    deadline. ``used``: the reservations so far per slot (slots past its end are free);
    ``first``: slot 0's share of a whole slot; ``needed``: the work to plan (> 0); ``steps``:
    the curve's sizes within capacity, ascending; ``progress[n]``: a slot's progress on
    ``n`` devices; ``progress_by_cap[j, n]``: on ``min(steps[j], n)``; ``usable[n]``: the
    largest allowed size within ``n``."""
    empty = np.zeros(0, dtype=np.int64)
    if steps.size == 0 or slots <= 0:
        return empty
    largest = steps[steps.size - 1]
    reserved = used.size
    by_free = np.zeros(largest + 1, dtype=np.float64)
    for slot in range(slots):
        free = capacity - used[slot] if slot < reserved else capacity
        by_free[min(free, largest)] += 1.0
    free = capacity - used[0] if reserved > 0 else capacity
    by_free[min(free, largest)] -= 1.0 - first  # slot 0 may be a partial slot
    low = -1
    for cap_index in range(steps.size):  # the smallest cap that meets the deadline
        reachable = 0.0
        for offered in range(largest + 1):
            reachable += progress_by_cap[cap_index, offered] * by_free[offered]
        if reachable >= needed:
            low = cap_index
            break
    if low < 0:
        return empty
    cap = steps[low]
    done = 0.0
    last = slots - 1
    for slot in range(slots):  # the slot it completes in
        free = capacity - used[slot] if slot < reserved else capacity
        gained = progress[min(cap, free)]
        done += gained * first if slot == 0 else gained
        if done >= needed:
            last = slot
            break
    plan = np.empty(last + 1, dtype=np.int64)
    for slot in range(last + 1):
        free = capacity - used[slot] if slot < reserved else capacity
        plan[slot] = usable[min(cap, free)]
    return plan


@functools.cache
def fill_slots() -> Callable[..., IntArray]:
    """:func:`_fill_slots`, compiled on the first call (then the same function)."""
    import numba

    options: dict[str, Any] = {"nogil": True}
    try:
        return numba.njit(cache=True, **options)(_fill_slots)  # type: ignore[no-any-return]
    except RuntimeError:  # no cache directory can be written: compile in memory
        return numba.njit(**options)(_fill_slots)  # type: ignore[no-any-return]
