"""GoldMiner's JCT gain on real ITP windows: the median and spread, not one lucky window.

Run: ``.venv/bin/python bench/dataworkers_windows.py [--stride K] [--workers N]``.
Recorded: ``bench/results/sim/dataworkers-itp-windows.txt``.

The window rule, fixed before any result was looked at:

- traces: ``itp-raw`` cluster01 to cluster05 (the tuning clusters, shared/traces/README);
- windows: the trace clock cut into 8-hour windows ``[8 h * k, 8 h * (k + 1))`` from
  t = 0 (GoldMiner samples "an 8-hour period" of the Microsoft trace, sec. 5.6); a window
  holds the jobs submitted in it, and they run to completion however long that takes;
- every window with ``k`` a multiple of 5 (``--stride``): a 40-hour stride, so window
  starts rotate through 00:00, 08:00 and 16:00 of the trace's day. Every window would take
  over an hour on this 2-core machine (cluster04's jobs of up to 14 days keep GoldMiner's
  reallocation every simulated minute busy), over the ~15 minutes allowed; the rule's 108
  windows take about 1,600 CPU seconds;
- windows that hold no job are skipped, and counted;
- every window runs all six policies of ``stride sim --env dataworkers`` on the testbed
  (8 x (8 GPU, 64 CPU)) with seed 1 for the jobs' synthetic CPU demands; any window can be
  replayed with ``stride sim --env dataworkers --trace <csv> --window START:END``.

The gain is the environment's own (Table 5's "JCT gain"): the average JCT of
``no-dw-tuned`` over the policy's, i.e. the JCT ratio. Spread: min, quartiles (numpy's
linear interpolation) and max over the windows. The reference is printed beside it:
Table 5's gains on the paper's 64-GPU testbed, and this environment's synthetic load
(``bench/results/sim/dataworkers-100``, 100 jobs, seed 1).

Modelling of trace jobs (``stride.sim.dataworkers``): a GoldMiner job whose data workers
cannot pay with the CPUs no training worker holds as it starts falls back to pre-processing
on its training workers at the hardware ratio (counted per window as fallbacks).
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing import Pool
from pathlib import Path

import numpy as np

from stride.sim.dataworkers import (
    DATAWORKER_POLICIES,
    DataWorkerCluster,
    DataWorkerResult,
    jct_gain,
    run_dataworkers,
    trace_dataworker_jobs,
)
from stride.sim.traces import RawTraceJob, TraceWindow, load_raw_trace, select_window

ROOT = Path(__file__).resolve().parent.parent
TRACES = ROOT.parent / "shared" / "traces" / "itp-raw"
CLUSTERS = ("cluster01", "cluster02", "cluster03", "cluster04", "cluster05")
WINDOW_S = 8 * 3600
STRIDE = 5
SEED = 1
REFERENCE = "no-dw-tuned"
GAINS = ("goldminer-srtf", "goldminer-maxtp", "goldminer-fair", "no-dw-hw", "fixed-dw")
"""Policies whose gain over ``no-dw-tuned`` is summarised, GoldMiner first."""
TABLE_5 = {
    "goldminer-srtf": 2.5,
    "goldminer-maxtp": 2.3,
    "goldminer-fair": 1.5,
    "no-dw-hw": 1.1,
    "fixed-dw": 1.5,
}
"""GoldMiner Table 5, JCT gain over No DW (tuned C/G)."""
SYNTHETIC = {
    "goldminer-srtf": 2.427e4 / 4116,
    "goldminer-maxtp": 2.427e4 / 6319,
    "goldminer-fair": 2.427e4 / 1.032e4,
    "no-dw-hw": 2.427e4 / 1.11e4,
    "fixed-dw": 2.427e4 / 1.753e4,
}
"""The same ratio in bench/results/sim/dataworkers-100/report.md (synthetic, 100 jobs)."""


@dataclass(frozen=True)
class WindowResult:
    """Every policy's result on one window."""

    cluster: str
    index: int
    jobs: int
    max_gpus: int
    results: dict[str, DataWorkerResult]
    cpu_s: float
    """Processor seconds the six runs took."""

    @property
    def span(self) -> str:
        """The window as ``stride sim --window`` takes it."""
        return f"{self.index * WINDOW_S}:{(self.index + 1) * WINDOW_S}"

    def gain(self, policy: str) -> float:
        """The policy's JCT gain over ``no-dw-tuned`` on this window."""
        return jct_gain(self.results[policy], self.results[REFERENCE])

    def queuing_share(self, policy: str) -> float:
        """Average queuing over average JCT (Table 5: 63% for No DW (tuned C/G))."""
        result = self.results[policy]
        return result.avg_queuing_s / result.avg_jct_s


_ROWS: dict[str, list[RawTraceJob]] = {}


def _rows(cluster: str) -> list[RawTraceJob]:
    if cluster not in _ROWS:
        _ROWS[cluster] = load_raw_trace(TRACES / f"{cluster}.csv", TraceWindow(rebase=False))
    return _ROWS[cluster]


def _job_count(cluster: str, index: int) -> int:
    return sum(int(row.submission_time // WINDOW_S) == index for row in _rows(cluster))


def run_window(task: tuple[str, int]) -> WindowResult:
    """All six policies on one window of one cluster."""
    cluster, index = task
    started = time.process_time()
    window = TraceWindow(index * WINDOW_S, (index + 1) * WINDOW_S)
    jobs = trace_dataworker_jobs(select_window(_rows(cluster), window, cluster), SEED)
    testbed = DataWorkerCluster()
    results = {
        policy: run_dataworkers(len(jobs), testbed, policy, SEED, jobs=jobs)
        for policy in DATAWORKER_POLICIES
    }
    return WindowResult(
        cluster,
        index,
        len(jobs),
        max(job.gpus for job in jobs),
        results,
        time.process_time() - started,
    )


def windows(stride: int) -> tuple[list[tuple[str, int]], dict[str, tuple[int, int]]]:
    """The rule's windows, and per cluster (rule windows, of which empty)."""
    tasks: list[tuple[str, int]] = []
    counts: dict[str, tuple[int, int]] = {}
    for cluster in CLUSTERS:
        occupied = {int(row.submission_time // WINDOW_S) for row in _rows(cluster)}
        chosen = range(0, max(occupied) + 1, stride)
        kept = [index for index in chosen if index in occupied]
        tasks.extend((cluster, index) for index in kept)
        counts[cluster] = (len(chosen), len(chosen) - len(kept))
    return tasks, counts


def spread(values: Sequence[float]) -> str:
    """min, q1, median, q3, max."""
    low, q1, median, q3, high = np.percentile(np.asarray(values), [0, 25, 50, 75, 100])
    return f"{low:6.2f} {q1:6.2f} {median:6.2f} {q3:6.2f} {high:6.2f}"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the rule's windows and print the per-window gains and their spread."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stride", type=int, default=STRIDE, help="every k-th window")
    parser.add_argument("--workers", type=int, default=2, help="processes")
    options = parser.parse_args(argv)
    if options.stride < 1 or options.workers < 1:
        parser.error("--stride and --workers must be >= 1")
    started = time.monotonic()
    tasks, counts = windows(options.stride)
    # Windows with more jobs first, so the last ones to finish are likely short.
    order = sorted(tasks, key=lambda task: -_job_count(*task))
    done: list[WindowResult] = []
    with Pool(options.workers) as pool:
        for result in pool.imap_unordered(run_window, order):
            done.append(result)
            print(
                f"  {len(done)}/{len(tasks)} {result.cluster} k={result.index} "
                f"({time.monotonic() - started:.0f} s)",
                file=sys.stderr,
                flush=True,
            )
    done.sort(key=lambda result: (result.cluster, result.index))
    print(
        f"GoldMiner (004) data workers on itp-raw windows: every {options.stride}-th 8-hour "
        f"window [8h*k, 8h*(k+1)) of {', '.join(CLUSTERS)} with a job; testbed 8 x (8 GPU, "
        f"64 CPU); seed {SEED} for the synthetic CPU demands; gain = avg JCT of {REFERENCE} "
        "/ avg JCT of the policy (Table 5's JCT gain)."
    )
    for cluster, (chosen, empty) in counts.items():
        print(f"{cluster}: {chosen} windows by the rule, {empty} empty (skipped)")
    print()
    header = (
        f"{'cluster':9} {'k':>4} {'window (s)':>17} {'jobs':>5} {'maxGPU':>6} "
        f"{'fallbk':>6} " + " ".join(f"{name:>15}" for name in GAINS) + "  queue% tuned/srtf"
    )
    print(header)
    for result in done:
        print(
            f"{result.cluster:9} {result.index:4d} {result.span:>17} {result.jobs:5d} "
            f"{result.max_gpus:6d} {result.results['goldminer-srtf'].fallback_jobs:6d} "
            + " ".join(f"{result.gain(name):15.2f}" for name in GAINS)
            + f"  {100 * result.queuing_share(REFERENCE):5.1f}/"
            f"{100 * result.queuing_share('goldminer-srtf'):.1f}"
        )
    print()
    print("JCT gain over no-dw-tuned: min q1 median q3 max, beside Table 5 and the synthetic load")
    groups = {cluster: [r for r in done if r.cluster == cluster] for cluster in CLUSTERS}
    groups["all"] = done
    for name in GAINS:
        print(f"{name} (Table 5 {TABLE_5[name]:.1f}x, synthetic 100 jobs {SYNTHETIC[name]:.2f}x)")
        for group, members in groups.items():
            if not members:
                continue
            gains = [member.gain(name) for member in members]
            below = sum(gain < 1.0 for gain in gains)
            print(
                f"  {group:9} n={len(members):3d}  {spread(gains)}   "
                f"median/Table 5 {np.median(gains) / TABLE_5[name]:.2f}  "
                f"windows with gain < 1: {below}"
            )
    srtf_hw = [
        jct_gain(member.results["goldminer-srtf"], member.results["no-dw-hw"]) for member in done
    ]
    print(f"goldminer-srtf over no-dw-hw (Table 5 2.3x): all n={len(done)}  {spread(srtf_hw)}")
    tuned = [member.queuing_share(REFERENCE) for member in done]
    srtf = [member.queuing_share("goldminer-srtf") for member in done]
    print(
        f"queuing share of JCT, median over windows: {REFERENCE} {100 * np.median(tuned):.1f}% "
        f"(Table 5: 63%), goldminer-srtf {100 * np.median(srtf):.1f}% (Table 5: 0%)"
    )
    fallbacks = sum(member.results["goldminer-srtf"].fallback_jobs for member in done)
    jobs = sum(member.jobs for member in done)
    print(f"goldminer-srtf fallbacks (no data workers): {fallbacks} of {jobs} jobs")
    print(
        f"wall time {time.monotonic() - started:.0f} s with {options.workers} processes; "
        f"simulation CPU time {sum(member.cpu_s for member in done):.0f} s"
    )
    print(f"command: {shlex.join([Path(sys.executable).name, *sys.argv])}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
