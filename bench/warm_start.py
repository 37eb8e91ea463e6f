"""Benchmark: warm-start accuracy on held history (DLRover-RM sec. 4.3 stage 1, Alg. 1).

Run: ``.venv/bin/python bench/warm_start.py`` (writes ``bench/results/warm_start.txt``).

The DLRM environment's seeded population is split: 80 % of the jobs are the history (each
finished with its best-found configuration: the cheapest grid configuration within 95 % of
the best throughput under its true model, which is where Stride's model-based step leads),
and the other 20 % are new jobs. For each new job the stage step's arrival decision (the
live optimizer's warm start on the config DB's similar jobs, blended by Algorithm 1) picks
its first pods (``stride.sim.dlrm.warm_start_accuracy``). Measured, side by side:

- **warm start**: RMSLE of the throughput of the warm-started pods against the best-found
  configuration's throughput, both under the job's true model; and how close the worker and
  PS counts come to the best-found ones (the paper reports 92 % and 85 %);
- **reference, cold start**: the same for the job's cold default (its request), what a job
  without history starts from.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np
from suite import record

from stride.sim.dlrm import generate_jobs, load_straggler_covs, warm_start_accuracy

RESULTS = Path(__file__).parent / "results" / "warm_start.txt"
TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"
COVS = TRACES / "pai-minibatch-time" / "coefficient_variation.csv"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--held-out", type=float, default=0.2)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    specs = generate_jobs(args.jobs, np.random.default_rng(args.seed), load_straggler_covs(COVS))
    warm, cold, history, new = warm_start_accuracy(specs, args.held_out, args.seed)
    lines = [
        f"$ .venv/bin/python bench/warm_start.py --jobs {args.jobs} --held-out {args.held_out:g} "
        f"--seed {args.seed}",
        f"machine: {os.cpu_count()} cores; DLRM population of {args.jobs}: {history} finished "
        f"jobs as history, {new} new jobs held out",
        "",
        "first pods against the best-found configuration (true model)",
        "                     throughput RMSLE   workers within   PS within",
    ]
    for label, accuracy in (("warm start", warm), ("cold start (ref)", cold)):
        lines.append(
            f"  {label:18s} {accuracy.throughput_rmsle:16.3f}   "
            f"{accuracy.workers_within:14.0%}   {accuracy.ps_within:9.0%}"
        )
    lines += [
        f"  ratio warm / cold RMSLE: {warm.throughput_rmsle / cold.throughput_rmsle:.2f}",
        "  (the paper reports warm-started workers within 92 % and PS within 85 % of the final)",
    ]
    record(RESULTS, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
