"""Every DLRM policy on seeds 1-5, and the calibration in 002 Fig. 7's form.

Measured side by side in one run, per seed (1,000 synthetic jobs, 6,000 cores and
40,000 GiB, the `stride sim --env dlrm` default), and for the calibration (40 jobs a seed,
each alone on 002 sec. 6's 640-core cluster, no stragglers, each as long as model-X:
``stride.sim.dlrm.calibration_jobs``). Prints, per policy, the median over seeds of the
median and p90 JCT with their spread (min-max), utilisation, the share of low-utilisation
jobs and OOM failures; Stride's ratios to the like-for-like oracle per seed; and, for the
calibration, the mean over jobs of Stride's JCT over each baseline's beside the ratios 002
reports (17.7 % ahead of ES, 28.5 % of Optimus, 1.4 % behind well-tuned).

    .venv/bin/python bench/dlrm_seeds.py [--jobs 1000] [--seeds 1,2,3,4,5]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from stride.sim import dlrm

COVS = Path(__file__).resolve().parents[2] / "shared" / dlrm.DEFAULT_PAI_COV_PATH
CALIBRATION_JOBS = 40
PAPER = {"es": 1 - 0.177, "optimus": 1 - 0.285, "tuned-static": 1.014}
"""002 sec. 6.1: Stride-like JCT over each baseline's."""


class EsFromTuned(dlrm.EsPolicy):
    """Ablation: ES started from the well-tuned configuration (its per-pod sizes, its PS)
    instead of the request: the papers do not say where their ES started, and 000 sec. 6.3
    sized the baselines' pods by Table 2."""

    name = "es-from-tuned"

    def decide(self, view: dlrm.JobView) -> dlrm.Decision:
        if view.reason == "arrival":
            return dlrm.Decision(dlrm.tuned_static_pods(view.spec))
        return super().decide(view)


class OptimusTunedPods(dlrm.OptimusPolicy):
    """Ablation: Optimus with the well-tuned per-pod sizes (000 sec. 6.3 configured its
    baselines' pods "according to Table 2"), still from one PS and one worker."""

    name = "optimus-tuned-pods"

    def pod_sizes(self, spec: dlrm.DlrmJobSpec) -> dlrm.Pods:
        return dlrm.tuned_static_pods(spec)


ABLATIONS: dict[str, type[dlrm.DlrmPolicy]] = {
    "es-from-tuned": EsFromTuned,
    "optimus-tuned-pods": OptimusTunedPods,
}


def _run(task: tuple[str, int, int, str]) -> tuple[str, int, str, dlrm.DlrmResult]:
    kind, seed, jobs, policy = task
    covs = dlrm.load_straggler_covs(COVS)
    specs = dlrm.generate_jobs(jobs, np.random.default_rng(seed), covs)
    if kind == "calibration":
        calm = dlrm.calibration_jobs(specs)
        ablation = ABLATIONS.get(policy)
        result = dlrm.simulate(
            calm,
            dlrm.CALIBRATION_CPUS,
            dlrm.CALIBRATION_MEMORY_GIB,
            policy,
            seed,
            policy=ablation() if ablation is not None else None,
        )
    elif kind == "large":
        result = dlrm.simulate(specs, 30_000, 300_000, policy, seed)
    else:
        result = dlrm.simulate(specs, 6000, 40000, policy, seed)
    return kind, seed, policy, result


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):>9.4g} [{min(values):.4g}-{max(values):.4g}]"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--seeds", default="1,2,3,4,5")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    policies = list(dlrm.POLICIES)
    calibration = ["static", "tuned-static", "optimus", "es", "stride", *ABLATIONS]
    tasks = [(kind, s, args.jobs, p) for kind in ("load", "large") for s in seeds for p in policies]
    tasks += [("calibration", s, CALIBRATION_JOBS, p) for s in seeds for p in calibration]
    # Longest first, so the two cores finish together.
    tasks.sort(key=lambda t: (t[3] != "optimus", t[0] != "load"))
    results: dict[tuple[str, int, str], dlrm.DlrmResult] = {}
    with ProcessPoolExecutor(max_workers=2) as pool:
        for kind, seed, policy, result in pool.map(_run, tasks):
            results[kind, seed, policy] = result
    for kind, cluster in (("load", "6000 cores, 40000 GiB"), ("large", "30000 cores, 300000 GiB")):
        print(f"{kind}: {args.jobs} synthetic jobs, {cluster}; seeds {seeds}")
        _table(results, kind, seeds, policies)
        print()
    _oracle_and_calibration(results, seeds, calibration)
    return 0


def _table(
    results: dict[tuple[str, int, str], dlrm.DlrmResult],
    kind: str,
    seeds: list[int],
    policies: list[str],
) -> None:
    print("median over seeds [min-max]")
    header = (
        f"{'policy':18s} {'jct_median_s':>24s} {'jct_p90_s':>24s} {'cpu_util':>22s} "
        f"{'mem_util':>22s} {'low_util_jobs':>22s} {'oom_failed':>18s}"
    )
    print(header)
    for policy in policies:
        rows = [results[kind, s, policy] for s in seeds]
        print(
            f"{policy:18s} {_spread([r.jct_median_s for r in rows]):>24s} "
            f"{_spread([r.jct_p90_s for r in rows]):>24s} "
            f"{_spread([r.cpu_utilization for r in rows]):>22s} "
            f"{_spread([r.memory_utilization for r in rows]):>22s} "
            f"{_spread([r.low_utilization_jobs for r in rows]):>22s} "
            f"{_spread([float(r.oom_failed) for r in rows]):>18s}"
        )


def _oracle_and_calibration(
    results: dict[tuple[str, int, str], dlrm.DlrmResult], seeds: list[int], calibration: list[str]
) -> None:
    print("stride / tuned-static-dyn (the like-for-like oracle), per seed, 6000 cores")
    met = True
    for seed in seeds:
        stride, oracle = results["load", seed, "stride"], results["load", seed, "tuned-static-dyn"]
        median, p90, ok = dlrm.tail_goal(stride, oracle)
        util_ok = dlrm.utilization_goal(stride)
        met = met and ok and util_ok
        print(
            f"  seed {seed}: median {median:.3f}  p90 {p90:.3f}  "
            f"{'met' if ok else 'NOT met'} (p90 <= 1.05, median <= 1.00);  "
            f"low-util {stride.low_utilization_jobs:.1%}, OOM failed {stride.oom_failed}, "
            f"memory {stride.memory_utilization:.3f}: {'met' if util_ok else 'NOT met'}"
        )
    print()
    print(
        f"calibration (002 Fig. 7 form): {CALIBRATION_JOBS} jobs a seed, one at a time on "
        f"{dlrm.CALIBRATION_CPUS} cores, no stragglers, well-tuned run "
        f"{dlrm.CALIBRATION_TUNED_MINUTES} min"
    )
    print(
        f"{'baseline':14s} {'mean stride/x JCT':>26s} {'002 reports':>12s} {'cpu':>8s} {'mem':>8s}"
    )
    for policy in calibration:
        ratios, cpu, mem = [], [], []
        for seed in seeds:
            mine = np.array(results["calibration", seed, "stride"].jcts)
            theirs = np.array(results["calibration", seed, policy].jcts)
            ratios.append(float(np.nanmean(mine / theirs)))
            cpu.append(results["calibration", seed, policy].cpu_utilization)
            mem.append(results["calibration", seed, policy].memory_utilization)
        paper = PAPER.get(policy)
        print(
            f"{policy:14s} {_spread(ratios):>26s} "
            f"{(f'{paper:.3f}' if paper else '-'):>12s} "
            f"{statistics.median(cpu):>8.3f} {statistics.median(mem):>8.3f}"
        )
    done = sum(1 for r in results.values() if not math.isnan(r.jct_median_s))
    print(f"\n{done} runs; goals {'met on every seed' if met else 'NOT met on every seed'}")


if __name__ == "__main__":
    sys.exit(main())
