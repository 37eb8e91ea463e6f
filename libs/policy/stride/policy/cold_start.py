"""The cold-start plan: the first plan of a job that has no history to learn from.

DLRover starts every new job in a *sampling* configuration, "a few parameter servers and a
worker with the default CPU cores C_max and default memory" (DLRover sec. 4.2; sec. 4.1:
"we launch a couple of parameter servers and only one worker at first to estimate w^ and
s^"), and only then optimizes. DLRover-RM calls starting from such a default a cold start
(sec. 3-4) and replaces it with warm start when similar jobs exist (Algorithm 1). This
module is the cold default, so its job is to *measure well*, not to train fast:

- one worker, big enough that its CPU use is the job's true need w^ rather than a cap;
- one or two PS (see :data:`PS_COUNT_DENSE`, :data:`PS_COUNT_WITH_EMBEDDINGS`), big
  enough that one worker does not saturate them, so their use is s^;
- one chief (TensorFlow's ParameterServerStrategy coordinator), small;
- no data workers yet (GoldMiner sec. 3.4.1 sizes them from queue state that a job only
  has once it runs).

Departure from the paper: DLRover samples with the full machine, C_max = 32 cores in its
cluster. That reserves a whole node for one worker whose need is often 2-3 cores (Table 1,
W&D: w^ = 2.5) and cannot be placed at all on a small cluster. Stride samples with
:data:`WORKER_CPU` = 8 cores instead, clamped to the largest pod the cluster can hold.
A worker that saturates it (utilization above 0.9, the same threshold DLRover uses for PS
in sec. 4.2) is grown by the sampling stage, so the cap costs one adjustment for heavy
models (Table 1, xDeepFM: w^ = 19.4) and saves most of a node for every light one. Memory
has no number in the paper ("default memory"); DLRover doubles it on OOM (sec. 4.2), and so
does Stride's post-scaling stage (DLRover-RM sec. 5.3).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from stride.policy.errors import InvalidFeatures
from stride.policy.plans import Plan, Role, RoleResources
from stride.policy.registry import AlgorithmSpec

GIB = 1024**3

ALGORITHM_NAME = "cold-start-plan"
"""Registered name of the algorithm (also a NATS subject token: no dots or spaces)."""
ALGORITHM_VERSION = 1
"""Bump when the defaults below change, so plans say which defaults made them."""
ALGORITHM = f"{ALGORITHM_NAME}/{ALGORITHM_VERSION}"
"""``name/version`` as stored in every plan this module makes."""
REASON = "cold start"
"""The reason every cold-start plan carries."""

SAMPLING_WORKERS = 1
"""DLRover sec. 4.1: "only one worker at first", because the throughput model (eq. 1)
needs the CPU one worker uses (w^) and the PS load that one worker causes (s^)."""
WORKER_CPU = 8.0
"""Cores of the sampling worker: a quarter of DLRover's C_max = 32 (see the module
docstring for why), and still 3x the W&D worker's measured need in Table 1."""
WORKER_MEMORY_BYTES = 4 * GIB
"""The paper's unspecified "default memory": enough for a TensorFlow worker with a batch of
a few thousand samples; doubled on OOM."""
PS_COUNT_DENSE = 1
"""PS for a model without embedding tables: Table 1's sampling rows use N_ps = 1, and dense
parameters of the models Stride targets fit in one PS."""
PS_COUNT_WITH_EMBEDDINGS = 2
"""PS for a model with embedding tables: the paper's "a few PS". Embedding tables dominate
PS memory and lookups (DLRover-RM sec. 4.1, eq. 5); two PS halve each one's share and let
the first samples show an unbalanced partition (a hot PS, DLRover sec. 4.2) at once."""
PS_CPU = 4.0
"""Cores per sampling PS. One worker drove s^ = 5.7 cores of PS for W&D and 3.1 for
xDeepFM (Table 1), so 2 x 4 and 1 x 4 cores leave the PS unsaturated and s^ measurable.
Deliberately not the s = 16 of eq. 10-11: that is the optimize stage's PS size for a job
with many workers, and would idle on a single one."""
PS_MEMORY_BYTES = 4 * GIB
"""Default PS memory; DLRover doubles the PS count when a PS is OOM-killed (sec. 4.2)."""
CHIEF_CPU = 1.0
"""The chief only coordinates (ClusterCoordinator schedules steps on workers); one core."""
CHIEF_MEMORY_BYTES = 2 * GIB
"""The chief holds no parameters; 2 GiB covers TensorFlow's runtime and checkpoint writes."""


@dataclass(frozen=True)
class JobFeatures:
    """What is known about a job before it runs: its spec's static features.

    The same features drive warm start's similarity search (DLRover-RM Algorithm 1), so they
    are the spec's, not the cluster's.
    """

    model_name: str
    """The model's name, e.g. "wide-and-deep"."""
    record_count: int
    """Records in one epoch; positive."""
    batch_size: int
    """Global batch size in samples; positive."""
    max_steps: int = 0
    """Stop after this many steps; exactly one of max_steps and max_epochs is positive."""
    max_epochs: int = 0
    """Stop after this many epochs."""
    family: str = ""
    """Model family, e.g. "dlrm"; empty if unknown."""
    embedding_dim: int = 0
    """Embedding dimension; zero if the model has no embedding tables."""

    def __post_init__(self) -> None:
        if not isinstance(self.model_name, str) or not self.model_name:
            raise InvalidFeatures("model_name", "is required")
        for name in ("record_count", "batch_size"):
            value = getattr(self, name)
            if not _is_integer(value) or value <= 0:
                raise InvalidFeatures(name, f"must be a positive whole number, got {value!r}")
        for name in ("max_steps", "max_epochs", "embedding_dim"):
            value = getattr(self, name)
            if not _is_integer(value) or value < 0:
                raise InvalidFeatures(name, f"must be a whole number >= 0, got {value!r}")
        if (self.max_steps > 0) == (self.max_epochs > 0):
            raise InvalidFeatures(
                "max_steps", "exactly one of max_steps and max_epochs must be positive"
            )

    @property
    def has_embeddings(self) -> bool:
        """Whether the model has embedding tables (a recommendation model, mostly)."""
        return self.embedding_dim > 0

    @property
    def total_steps(self) -> int:
        """Global steps until the job ends: max_steps, or epochs times steps per epoch."""
        if self.max_steps > 0:
            return self.max_steps
        return self.max_epochs * math.ceil(self.record_count / self.batch_size)


def _is_integer(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_max_pod_cpu(value: object) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidFeatures("max_pod_cpu", f"must be a positive number of cores, got {value!r}")
    if value <= 0:
        raise InvalidFeatures("max_pod_cpu", f"must be a positive number of cores, got {value!r}")


def cold_start_plan(features: JobFeatures, max_pod_cpu: float | None = None) -> Plan:
    """The sampling plan for a job with no history.

    ``max_pod_cpu`` is the most cores one pod can get in the cluster (its biggest node's
    allocatable CPU); each default is clamped to it so the plan can be placed.
    """
    _check_max_pod_cpu(max_pod_cpu)

    def cores(default: float) -> float:
        return default if max_pod_cpu is None else min(default, float(max_pod_cpu))

    ps_count = PS_COUNT_WITH_EMBEDDINGS if features.has_embeddings else PS_COUNT_DENSE
    return Plan(
        roles=(
            RoleResources(Role.CHIEF, 1, cores(CHIEF_CPU), CHIEF_MEMORY_BYTES),
            RoleResources(Role.PS, ps_count, cores(PS_CPU), PS_MEMORY_BYTES),
            RoleResources(Role.WORKER, SAMPLING_WORKERS, cores(WORKER_CPU), WORKER_MEMORY_BYTES),
        ),
        reason=REASON,
        algorithm=ALGORITHM,
    )


@dataclass(frozen=True)
class ColdStartRequest:
    """The executor's request type for ``cold-start-plan``."""

    features: JobFeatures
    max_pod_cpu: float | None = None
    """Most cores one pod can get; None leaves the defaults unclamped."""

    def __post_init__(self) -> None:
        if not isinstance(self.features, JobFeatures):
            kind = type(self.features).__name__
            raise InvalidFeatures("features", f"must be JobFeatures, got {kind}")
        _check_max_pod_cpu(self.max_pod_cpu)


@dataclass(frozen=True)
class ColdStartReply:
    """The executor's reply type for ``cold-start-plan``."""

    plan: Plan


def run(request: ColdStartRequest) -> ColdStartReply:
    """The registry entry point: the cold-start plan for ``request``."""
    return ColdStartReply(plan=cold_start_plan(request.features, request.max_pod_cpu))


def _specs() -> tuple[AlgorithmSpec[Any, Any], ...]:
    return (
        AlgorithmSpec(
            name=ALGORITHM_NAME,
            version=ALGORITHM_VERSION,
            description=(
                "Sampling plan for a job with no history: one worker, one or two PS, a chief "
                "(DLRover sec. 4.1-4.2)"
            ),
            request_type=ColdStartRequest,
            reply_type=ColdStartReply,
            run=run,
        ),
    )


ALGORITHMS = _specs()
COLD_START = ALGORITHMS[0]
"""The cold-start plan algorithm, as the adjust port takes it."""
