"""Gandiva as ElasticFlow's published simulator runs it (``stride sim --model elasticflow``).

Written from the simulator's observable behaviour (pkusys/ElasticFlow, ``--schedule=gandiva
--scheme=gandiva``); none of its code is used. See :class:`GandivaNodeSetPolicy`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from stride.sim.deadline_rounds import ef_overhead
from stride.sim.deadline_views import DeadlineView, JobView

__all__ = ["GANDIVA_CLASSES", "GandivaNodeSetPolicy"]


GANDIVA_CLASSES = (1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 56, 64, 72, 88, 128, 256)
"""GPU counts with a node-set class of their own (the simulator's, in its order)."""


@dataclass
class _NodeSet:
    nodes: int
    capacity: int
    util: int = 0
    jobs: list[str] = field(default_factory=list)


@dataclass
class _Arrival:
    time: float
    job_id: str


@dataclass
class GandivaNodeSetPolicy:
    """Gandiva as ElasticFlow's simulator runs it: node sets per GPU count, packing and
    time slicing, not deadline-aware, no admission (Xiao et al., OSDI'18, as summarised in
    ElasticFlow sec. 6.1; the rules are the simulator's observable ones).

    **Node sets.** Each job runs on its trace GPU count ``g`` for its trace duration (the
    rate it is shown, on ``g`` GPUs). Jobs of one class (``g`` rounded up to
    :data:`GANDIVA_CLASSES`) share *node sets* of ``ceil(g / 8)`` whole nodes, each running
    at most ``8 * nodes // g`` jobs at once: the first ones of its list; the rest of the list
    waits (it rotates only at rounds on whole minutes of the original clock, which this
    environment's rebased clock cannot tell, so by default never: over-full sets are FIFO
    queues). A set's use count only grows (finished jobs leave its list, not its count).

    **Placement.** An arriving job takes the least-used set of its class if one more job
    keeps that set's use count below its capacity (otherwise that set goes to the back of the
    class's list); else it opens a new set on free nodes; else it joins the (next) least-used
    set over capacity; with no set of its class and too few free nodes it waits. Waiting jobs
    are retried, in order, only in rounds where a set was dissolved, and the one after each
    job placed is skipped in that pass. Jobs larger than the cluster are refused.

    **Rounds.** Rounds come at arrivals, with the arrivals due within a slot of the previous
    round merged into one round a slot after it (unless that is the last arrival time left,
    which keeps its own), and every slot once all have arrived. Each round first
    re-balances the GPUs across classes in proportion to their demand (``g`` times jobs;
    growing a class re-spreads its jobs over its sets only when its last attempt to add a
    set failed or its sets span nodes; shrinking one dissolves its least-used sets and puts
    their jobs behind others), then credits the interval just ended to the jobs now first in
    their sets, ends those done (at the exact second: a job's recorded finish), dissolves
    emptied sets, places the arrivals, then retries waiting jobs. In rounds while arrivals
    remain every started job is charged :func:`ef_overhead` (no cache; a restart every
    ``slot``-th such round), taken off its next credited interval; a job that ever waited
    loses a charge it has not used by the next round.

    **Driving.** The policy replays those rounds itself, on their own clock, from the
    arrivals the environment shows it: the environment rounds at every arrival time and,
    once none is left, every slot (``rounds_on_completions = False``; so a round without
    arrivals tells the policy that all have arrived). A job the replay has finished is held
    in the next decision with its replayed finish as its planned end (:meth:`planned_ends`),
    so the environment completes it at its next round and records that finish; the jobs
    running in the replay fill the rest of the capacity and are never ended by the
    environment's clock. The replay may lag the environment by a round (while it cannot yet
    tell whether more arrivals are due) without changing any result. The environment's own
    overhead and progress are not used, nor is a true speed that differs from the shown one
    (``curve_error``).
    """

    name: str = "gandiva"
    node_gpus: int = 8
    capacity: int = 128
    slot: float = 60.0
    """The simulator's scheduling slot (the environment's)."""
    epoch: float | None = None
    """Absolute time of the trace's clock zero, to rotate time-sliced sets on whole
    minutes as the simulator does; None (rebased traces): never rotate."""
    rounds_on_completions: bool = False
    overhead_cache: bool = False
    _nodes: int = -1
    _free_nodes: int = 0
    _sets: dict[int, list[_NodeSet]] = field(default_factory=dict, repr=False)
    _gpus: dict[str, int] = field(default_factory=dict, repr=False)
    _duration: dict[str, float] = field(default_factory=dict, repr=False)
    _executed: dict[str, float] = field(default_factory=dict, repr=False)
    _charge: dict[str, float] = field(default_factory=dict, repr=False)
    _running: dict[str, None] = field(default_factory=dict, repr=False)
    _pending: list[str] = field(default_factory=list, repr=False)
    _waited: set[str] = field(default_factory=set, repr=False)
    _known: list[_Arrival] = field(default_factory=list, repr=False)
    _arriving: list[_Arrival] = field(default_factory=list, repr=False)
    _finished: dict[str, float] = field(default_factory=dict, repr=False)
    _plans: dict[str, tuple[float | None, float, float]] = field(default_factory=dict, repr=False)
    _clock: float | None = None
    _started: bool = False
    _arrivals_over: bool = False
    _charged_rounds: int = 0

    # ---------------------------------------------------------------- node sets

    def _class(self, gpus: int) -> int:
        return next((size for size in GANDIVA_CLASSES if size >= gpus), gpus)

    def _new_set(self, size: int) -> _NodeSet:
        nodes = math.ceil(size / self.node_gpus)
        self._free_nodes -= nodes
        return _NodeSet(nodes, max(1, nodes * self.node_gpus // size))

    @staticmethod
    def _add(sets: list[_NodeSet], node_set: _NodeSet, job_id: str) -> None:
        node_set.util += 1
        node_set.jobs.append(job_id)
        sets.append(node_set)
        sets.sort(key=lambda s: s.util)

    def _place(self, job_id: str) -> bool:
        size = self._class(self._gpus[job_id])
        sets = self._sets.setdefault(size, [])
        if sets:
            first = sets.pop(0)
            if first.util + 1 < first.capacity:
                self._add(sets, first, job_id)
                return True
            sets.append(first)  # back of the list, unsorted
        if math.ceil(size / self.node_gpus) <= self._free_nodes:
            self._add(sets, self._new_set(size), job_id)
            return True
        if sets:
            self._add(sets, sets.pop(0), job_id)
            return True
        return False

    @staticmethod
    def _spread(sets: list[_NodeSet], jobs: list[str]) -> None:
        """Each job to the least-used set, which stays in place before the re-sort (unlike
        :meth:`_add`, so ties keep a different order)."""
        for job in jobs:
            sets[0].util += 1
            sets[0].jobs.append(job)
            sets.sort(key=lambda s: s.util)

    def _rebalance(self) -> None:
        demand = {size: size * sum(len(s.jobs) for s in sets) for size, sets in self._sets.items()}
        occupied = {
            size: self.node_gpus * sum(s.nodes for s in sets) for size, sets in self._sets.items()
        }
        total = sum(demand.values())
        if not total:
            return
        for size in sorted(self._sets):
            if not demand[size]:
                continue
            target = min(math.floor(demand[size] / total * self.capacity), demand[size])
            difference = target - occupied[size]
            sets = self._sets[size]
            if difference > 0:
                failed = False
                for _ in range(math.ceil(difference / size)):
                    failed = math.ceil(size / self.node_gpus) > self._free_nodes
                    if not failed:
                        sets.append(self._new_set(size))
                # The simulator re-spreads the class's jobs over its sets only when its last
                # attempt to add a set failed or a set spans nodes (a loop-variable slip
                # there); otherwise the new sets stay empty and are dissolved at once.
                if failed or math.ceil(size / self.node_gpus) > 1:
                    jobs = [job for s in sets for job in s.jobs]
                    for node_set in sets:
                        node_set.jobs = []
                        node_set.util = 0
                    self._spread(sets, jobs)
            elif difference < 0:
                count = min(math.ceil(-difference / size), len(sets) - 1)
                removed, self._sets[size] = sets[:count], sets[count:]
                self._free_nodes += sum(s.nodes for s in removed)
                self._spread(self._sets[size], [job for s in removed for job in s.jobs])

    # ---------------------------------------------------------------- the replay

    def _execute(self, at: float, step: float) -> bool:
        """Credit the interval ending at ``at`` to each set's first jobs; end those done;
        dissolve emptied sets. Whether any set was dissolved."""
        rotate = self.epoch is not None and int((at + self.epoch) % 60) == 0
        released = False
        for size in sorted(self._sets):
            kept: list[_NodeSet] = []
            for node_set in self._sets[size]:
                active = node_set.jobs[: node_set.capacity]
                for job in active:
                    self._executed[job] += max(step - self._charge[job], 0.0)
                    self._charge[job] = 0.0
                    over = self._executed[job] - self._duration[job]
                    if over >= 0:
                        self._finished[job] = at - over
                if rotate and len(node_set.jobs) > node_set.capacity:
                    node_set.jobs = node_set.jobs[node_set.capacity :] + active
                node_set.jobs = [job for job in node_set.jobs if job not in self._finished]
                if node_set.jobs:
                    kept.append(node_set)
                else:
                    self._free_nodes += node_set.nodes
                    released = True
            self._sets[size] = kept
        for job in self._finished:
            self._running.pop(job, None)
        return released

    def _round(self, at: float, step: float, arrivals: list[str]) -> None:
        self._rebalance()  # before the jobs that just ended leave, as the simulator
        released = self._execute(at, step)
        for job in self._waited:
            self._charge[job] = 0.0
        for job in arrivals:
            if self._place(job):
                self._running[job] = None
            else:
                self._pending.append(job)
                self._waited.add(job)
        if released:
            index = 0
            while index < len(self._pending):
                job = self._pending[index]
                if self._place(job):
                    self._pending.pop(index)
                    self._running[job] = None
                index += 1  # the simulator skips the job after each one it places
        self._clock = at

    def _next_round(self, slot: float) -> tuple[float, bool] | None:
        """The replay's next round after ``_clock`` and whether arrivals were still due
        after it; None while the arrivals seen so far cannot tell."""
        assert self._clock is not None
        now = self._clock
        if self._known:
            first = self._known[0].time
            if first - now > slot:
                return first, True
            if any(arrival.time != first for arrival in self._known):
                return now + slot, True
            return (first, True) if self._arrivals_over else None
        if self._arrivals_over and (self._running or self._pending):
            return now + slot, False
        return None

    def _advance(self, until: float) -> None:
        """Replay every round up to ``until`` that the arrivals seen so far determine."""
        while self._known or self._running or self._pending:
            if self._clock is None:
                at, step = self._known[0].time, 0.0
            else:
                slot = self.slot
                upcoming = self._next_round(slot)
                if upcoming is None or upcoming[0] > until:
                    return
                at, arrivals_left = upcoming
                step = slot if not arrivals_left else float(int(at - self._clock))
                if arrivals_left:
                    restart = self._charged_rounds > 0 and self._charged_rounds % int(slot) == 0
                    self._charged_rounds += 1
                    for job in self._running:
                        self._charge[job] = ef_overhead(
                            self._gpus[job],
                            restart=restart,
                            cached=False,
                            cluster_gpus=self.capacity,
                        )
            due = [arrival.job_id for arrival in self._known if arrival.time <= at]
            self._known = self._known[len(due) :]
            self._round(at, step, due)

    # ---------------------------------------------------------------- the interface

    def admit(self, view: DeadlineView, candidate: JobView) -> bool:
        """Every job that fits the cluster is taken; the replay places it."""
        if self._nodes < 0:
            self.capacity = view.capacity
            self._nodes = self._free_nodes = view.capacity // self.node_gpus
        job = candidate.job_id
        if math.ceil(self._class(candidate.num_gpu) / self.node_gpus) > self._nodes:
            return False  # would wait forever (the simulator never finishes it)
        self._gpus[job] = candidate.num_gpu
        duration = candidate.total_iterations / candidate.curve.throughput(candidate.num_gpu)
        self._duration[job] = (
            float(round(duration)) if abs(duration - round(duration)) < 1e-6 else duration
        )
        self._executed[job] = 0.0
        self._charge[job] = 0.0
        self._arriving.append(_Arrival(candidate.submission_time, job))
        return True

    def decide(self, view: DeadlineView) -> dict[str, int]:
        """Replay the simulator's rounds up to now, then hold the jobs it has finished (each
        completes at the environment's next round with its replayed finish) and, within
        capacity, the jobs running in the replay."""
        if not self._started:
            self._started = True
        elif not self._arriving:
            # Rounds come only with arrivals while any remain.
            self._arrivals_over = True
        self._known = sorted(self._known + self._arriving, key=lambda arrival: arrival.time)
        self._arriving = []
        self._advance(view.now)
        present = {job.job_id for job in view.jobs}
        self._finished = {job: end for job, end in self._finished.items() if job in present}
        result: dict[str, int] = {}
        self._plans = {}
        used = 0
        for job, end in self._finished.items():
            if used + self._gpus[job] <= view.capacity:
                used += self._gpus[job]
                result[job] = self._gpus[job]
                self._plans[job] = (end, end, end)
        for size in sorted(self._sets):
            for node_set in self._sets[size]:
                for job in node_set.jobs[: node_set.capacity]:
                    if job in present and used + self._gpus[job] <= view.capacity:
                        used += self._gpus[job]
                        result[job] = self._gpus[job]
                        self._plans[job] = (None, math.inf, math.inf)
        return result

    def planned_ends(self) -> dict[str, tuple[float | None, float, float]]:
        """Finished jobs end at once with their replayed finish; running ones never by the
        environment's own clock."""
        return self._plans

    def wakeup(self, view: DeadlineView, decision: dict[str, int]) -> float | None:
        """Arrival-driven (then every slot, the environment's rounds)."""
        return None
