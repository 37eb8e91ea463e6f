"""Benchmark: contended growth settled by the weighted greedy, against dropping it.

Run: ``.venv/bin/python bench/contention.py`` (writes ``bench/results/contention.txt``).

When the cluster cannot hold a job's next plan, Stride keeps it as a claim and settles
the open claims together whenever capacity frees (``stride.policy.contention``: DLRover-RM's
weighted greedy, eq. 11-14, rho 2.5). The reference is the naive way the simulator and the
optimizer ran before: drop the growth, and let the job ask again at its next tick, so freed
capacity goes to whichever job ticks first. Both run in one process, on the same seeded DLRM
populations (``stride sim --env dlrm``), on clusters from roomy to tight, and the ratio of
Stride's JCT median and p90 to the reference's is printed (below 1: claims help).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
from suite import record

from stride.sim.dlrm import (
    Decision,
    JobView,
    StridePolicy,
    generate_jobs,
    load_straggler_covs,
    simulate,
)
from stride.testing import SHARED_TRACES

RESULTS = Path(__file__).parent / "results" / "contention.txt"
COVS = SHARED_TRACES / "pai-minibatch-time" / "coefficient_variation.csv"


class DropPolicy(StridePolicy):
    """Stride's stage step with contended growth dropped (no claims): the reference."""

    name = "stride-drop"

    def decide(self, view: JobView) -> Decision:
        return replace(super().decide(view), claim=None)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--cpus", type=int, nargs="+", default=[6000, 2000, 1500])
    args = parser.parse_args()
    covs = load_straggler_covs(COVS)
    lines = [
        "$ .venv/bin/python bench/" + Path(__file__).name + " " + " ".join(sys.argv[1:]),
        f"DLRM population of {args.jobs} jobs per seed; memory 40,000 GiB; Stride's stage "
        "step in both; claims = contended growth kept and settled by the weighted greedy, "
        "drop = contended growth dropped (asked again at the next tick)",
        "",
        f"{'cores':>6} {'seed':>4} {'median claims':>14} {'median drop':>12} {'ratio':>6} "
        f"{'p90 claims':>11} {'p90 drop':>9} {'ratio':>6} {'granted':>8} {'time':>6}",
    ]
    for cpus in args.cpus:
        medians, p90s = [], []
        for seed in args.seeds:
            jobs = generate_jobs(args.jobs, np.random.default_rng(seed), covs)
            began = time.perf_counter()
            claims = simulate(jobs, cpus, 40_000, "stride", seed)
            drop = simulate(jobs, cpus, 40_000, "stride", seed, policy=DropPolicy())
            took = time.perf_counter() - began
            assert claims.completed == drop.completed == args.jobs
            medians.append(claims.jct_median_s / drop.jct_median_s)
            p90s.append(claims.jct_p90_s / drop.jct_p90_s)
            lines.append(
                f"{cpus:>6} {seed:>4} {claims.jct_median_s:>14,.0f} {drop.jct_median_s:>12,.0f} "
                f"{medians[-1]:>6.3f} {claims.jct_p90_s:>11,.0f} {drop.jct_p90_s:>9,.0f} "
                f"{p90s[-1]:>6.3f} {claims.claims_granted:>8} {took:>5.0f}s"
            )
        lines.append(
            f"{cpus:>6}  all  median ratio {statistics.mean(medians):.3f} (mean over "
            f"seeds), p90 ratio {statistics.mean(p90s):.3f}"
        )
        lines.append("")
    record(RESULTS, lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
