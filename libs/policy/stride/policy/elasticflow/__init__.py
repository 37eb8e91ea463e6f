"""ElasticFlow (ASPLOS'23) sec. 4: admission, allocation and placement of deadline jobs.

- :mod:`.curves`: concave scaling curves, the measured-table loader and the envelope that
  makes a measured table usable (sec. 3.2);
- :mod:`.admission`: Minimum Satisfactory Share by progressive filling (sec. 4.1,
  Algorithm 1), with soft-deadline and best-effort jobs and quotas (sec. 4.4, :mod:`.quotas`);
- :mod:`.allocation`: greedy allocation of spare devices by marginal return (sec. 4.2,
  Algorithm 2);
- :mod:`.placement`: best fit on a topology tree and buddy allocation (sec. 4.3).

"Devices" are whatever the caller counts: GPUs, or CPU shares for CPU jobs.
"""

from __future__ import annotations

from typing import Any

from stride.policy.elasticflow import admission, allocation, placement
from stride.policy.registry import AlgorithmSpec

ALGORITHMS: tuple[AlgorithmSpec[Any, Any], ...] = (
    AlgorithmSpec(
        name=admission.ALGORITHM_NAME,
        version=admission.ALGORITHM_VERSION,
        description=(
            "Admit a deadline job by Minimum Satisfactory Share with progressive filling "
            "over time slots (ElasticFlow sec. 4.1, Algorithm 1; sec. 4.4 quotas)"
        ),
        request_type=admission.AdmissionRequest,
        reply_type=admission.AdmissionReply,
        run=admission.run,
    ),
    AlgorithmSpec(
        name=allocation.ALGORITHM_NAME,
        version=allocation.ALGORITHM_VERSION,
        description=(
            "Give spare devices to the job with the highest marginal return "
            "(ElasticFlow sec. 4.2, Algorithm 2)"
        ),
        request_type=allocation.AllocationRequest,
        reply_type=allocation.AllocationReply,
        run=allocation.run,
    ),
    AlgorithmSpec(
        name=placement.ALGORITHM_NAME,
        version=placement.ALGORITHM_VERSION,
        description=(
            "Place a job on a topology tree by best fit or buddy allocation (ElasticFlow sec. 4.3)"
        ),
        request_type=placement.PlacementRequest,
        reply_type=placement.PlacementReply,
        run=placement.run,
    ),
)
"""The ElasticFlow algorithms for :func:`stride.policy.registry.default_registry`."""
