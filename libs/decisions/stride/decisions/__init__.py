"""Policy ports: how a service reaches ``stride.policy``, one port per decision kind.

Kubernetes' scheduler splits its decisions into named extension points, and DLRover's Brain
runs its algorithms as plug-ins in a stateless executor pool (sec. 4.3). Stride does both:
every decision a service takes goes through the port of its kind — admit, allocate, place,
adjust (plan), preempt, tune data workers — and each port has two implementations behind
one call:

- :class:`InProcess` runs the algorithm in the service's own process, off the event loop.
  For cheap decisions (a cold-start plan, an admission check) a bus round trip would cost
  more than the decision.
- :class:`ExecutorPool` sends it to the executor pool (``topics.EXECUTOR_RUN``, a NATS queue
  group), for heavy decisions such as the throughput-model fit and NSGA-II, so a CPU-bound
  solve never stalls a service and the pool scales on its own.

Both run the same registered :class:`~stride.policy.registry.AlgorithmSpec` at the same
version, so they decide the same; ``stride sim`` calls the same specs directly. Which
implementation answers is configuration (:func:`parse_routes`): per kind, per algorithm,
or the default, which sends :data:`HEAVY_ALGORITHMS` to the pool and the rest in-process.
"""

from __future__ import annotations

import asyncio
import math
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import structlog
from google.protobuf.struct_pb2 import Struct, Value

from stride.events.v1 import optimization_pb2
from stride.policy.registry import AlgorithmSpec, InvalidRequest, from_dict, to_dict
from stride.policy.serialization import field_path
from stride.runtime.errors import InvalidArgument

if TYPE_CHECKING:
    from stride.bus.client import Bus

log = structlog.get_logger(__name__)

RequestT = TypeVar("RequestT")
ReplyT = TypeVar("ReplyT")


class DecisionKind(Enum):
    """The extension points of Stride's policy, by the question each one answers."""

    ADMIT = "admit"
    """Does a job run, with what guarantee and minimum share (ElasticFlow sec. 4.1)?"""
    ALLOCATE = "allocate"
    """Who gets spare capacity (ElasticFlow sec. 4.2; DLRover-RM weighted greedy)?"""
    PLACE = "place"
    """On which nodes do a job's pods go (buddy / best fit; KOD2 fewest nodes)?"""
    ADJUST = "adjust"
    """How many PS, workers and data workers of what size: the job's plan (DLRover sec. 4)."""
    PREEMPT = "preempt"
    """Which lower-priority jobs scale in for a higher one (KOD2 sec. 4.2)?"""
    TUNE_DATA_WORKERS = "tune_data_workers"
    """How many data workers, and how much CPU for them (GoldMiner sec. 4)?"""


KIND_OF_ALGORITHM: Mapping[str, DecisionKind] = {
    "elasticflow-admission": DecisionKind.ADMIT,
    "elasticflow-allocation": DecisionKind.ALLOCATE,
    "dlrover-weighted-greedy": DecisionKind.ALLOCATE,
    "elasticflow-placement": DecisionKind.PLACE,
    "kod2-placement": DecisionKind.PLACE,
    "cold-start-plan": DecisionKind.ADJUST,
    "dlrover-warm-start": DecisionKind.ADJUST,
    "dlrover-initial-plan": DecisionKind.ADJUST,
    "dlrover-adjust": DecisionKind.ADJUST,
    "dlrover-throughput-fit": DecisionKind.ADJUST,
    "dlrover-throughput-predict": DecisionKind.ADJUST,
    "dlrover-pareto-candidates": DecisionKind.ADJUST,
    "dlrover-oom-predict": DecisionKind.ADJUST,
    "stride-stage-step": DecisionKind.ADJUST,
    "stride-job-fronts": DecisionKind.ALLOCATE,
    "stride-cluster-choose": DecisionKind.ALLOCATE,
    "stride-cluster-round": DecisionKind.ALLOCATE,
    "kod2-schedule": DecisionKind.PREEMPT,
    "goldminer-tune-step": DecisionKind.TUNE_DATA_WORKERS,
    "goldminer-cluster-allocation": DecisionKind.TUNE_DATA_WORKERS,
}
"""Which port each registered algorithm answers for. A test fails when an algorithm is
registered without a kind, so a new plug-in is classified before a service can call it."""

HEAVY_ALGORITHMS = frozenset(
    {
        "dlrover-throughput-fit",
        "dlrover-pareto-candidates",
        "stride-stage-step",
        "stride-job-fronts",
    }
)
"""Sent to the executor pool unless configured otherwise: the NNLS fit and NSGA-II take
hundreds of milliseconds to seconds of CPU, which must not run inside a service that also
answers gRPC and bus traffic (DLRover sec. 4.3)."""

IN_PROCESS = "inprocess"
EXECUTOR = "executor"
IMPLEMENTATIONS = (IN_PROCESS, EXECUTOR)

DEFAULT_SILENCE_SECONDS = 10.0
"""How long the replica that took a request may say nothing before the request goes to
another. A replica tells its requester every second that the run goes on
(``RequestTopic.progress_seconds``), so only a replica that died, lost its connection or
has a frozen event loop stays silent this long; a long search is waited for, to the
decision's deadline. Ten missed messages: a loaded node's pause is not taken for a death,
and a killed replica costs a job seconds, not its deadline.

Before, the whole run had to fit in this time (an attempt's length), and each run longer
than that was asked of another replica while it still ran: on a loaded cluster, every
slow NSGA-II search was started again and again, which loaded it further."""
NO_RESPONDERS_PAUSE_SECONDS = 0.25
"""Pause before asking again when no replica is subscribed (the pool is restarting)."""
NO_RESPONDERS_GRACE_SECONDS = 1.0
"""How long a request waits for a replica to subscribe before it fails (retryable): long
enough for a replica's restart to be seen, short enough that a caller with a fallback (the
optimizer runs the step itself) does not wait out the whole deadline for a pool that is
not there."""
DEFAULT_TIMEOUT_SECONDS = 30.0
"""Every decision has a deadline. NSGA-II on a large job takes a few seconds on one core;
thirty leaves room for a busy pool without letting a lost request hang a job forever."""


class DecisionFailed(Exception):
    """The decision could not be made: the algorithm refused or failed, or the pool did not
    answer in time. ``retryable`` is True when asking again may succeed (a timeout, no
    replica), False when the same request will fail the same way."""

    def __init__(self, message: str, *, retryable: bool) -> None:
        super().__init__(message)
        self.retryable = retryable


class WrongKind(ValueError):
    """An algorithm was asked through the port of another decision kind."""


class Implementation(Protocol):
    """Runs one registered algorithm on a typed request."""

    name: str

    async def run(
        self,
        algorithm: AlgorithmSpec[RequestT, ReplyT],
        request: RequestT,
        job_id: str,
        timeout: float,
    ) -> ReplyT:
        """The typed reply, or :class:`DecisionFailed`."""
        ...


class InProcess:
    """Runs the algorithm in this process, in a worker thread so the event loop stays free."""

    name = IN_PROCESS

    async def run(
        self,
        algorithm: AlgorithmSpec[RequestT, ReplyT],
        request: RequestT,
        job_id: str,
        timeout: float,
    ) -> ReplyT:
        """Run ``algorithm`` on ``request`` within ``timeout`` seconds."""
        try:
            return await asyncio.wait_for(asyncio.to_thread(algorithm.run_typed, request), timeout)
        except TimeoutError:
            # The thread cannot be killed; it finishes and its result is dropped.
            raise DecisionFailed(
                f"{algorithm.qualified_name} took longer than {timeout:g}s", retryable=True
            ) from None
        except InvalidRequest as error:
            raise DecisionFailed(
                f"{algorithm.qualified_name}: {error.field}: {error.problem}", retryable=False
            ) from None
        except Exception as error:
            raise DecisionFailed(
                f"{algorithm.qualified_name} failed: {type(error).__name__}: {error}",
                retryable=False,
            ) from error


class ExecutorPool:
    """Sends the algorithm to the executor pool as an ``AlgorithmRequest`` and types the
    reply back; any replica of the queue group answers.

    A request is retried until its deadline: when no replica is subscribed, after a short
    pause and for at most :data:`NO_RESPONDERS_GRACE_SECONDS`; and when the replica that
    took it falls silent for ``silence_seconds`` (it was killed or lost its connection), at
    once, so another replica answers. Executors are stateless, so running a request twice
    is harmless.
    """

    name = EXECUTOR

    def __init__(self, bus: Bus, silence_seconds: float = DEFAULT_SILENCE_SECONDS) -> None:
        self.bus = bus
        self.silence_seconds = silence_seconds

    async def run(
        self,
        algorithm: AlgorithmSpec[RequestT, ReplyT],
        request: RequestT,
        job_id: str,
        timeout: float,
    ) -> ReplyT:
        """Ask the pool to run ``algorithm`` (pinned to its version) within ``timeout``."""
        import nats.errors

        from stride.bus import topics

        message = optimization_pb2.AlgorithmRequest(
            request_id=uuid.uuid4().hex,
            algorithm=algorithm.name,
            version=algorithm.version,
            job_id=job_id,
            arguments=dict_to_struct(to_dict(request)),
        )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        attempts = 0
        while True:
            attempts += 1
            remaining = deadline - loop.time()
            try:
                payload = await self.bus.request(
                    topics.EXECUTOR_RUN,
                    algorithm.name,
                    message,
                    timeout=max(0.001, remaining),
                    silence=self.silence_seconds,
                )
                break
            except nats.errors.NoRespondersError:
                waited = timeout - (deadline - loop.time())
                if waited >= NO_RESPONDERS_GRACE_SECONDS or (
                    deadline - loop.time() <= NO_RESPONDERS_PAUSE_SECONDS
                ):
                    raise DecisionFailed(
                        f"no executor replica answers {algorithm.qualified_name}", retryable=True
                    ) from None
                await asyncio.sleep(NO_RESPONDERS_PAUSE_SECONDS)
            except (nats.errors.TimeoutError, TimeoutError):
                if deadline - loop.time() <= 0:
                    raise DecisionFailed(
                        f"the executor pool did not answer {algorithm.qualified_name} within "
                        f"{timeout:g}s ({attempts} attempts)",
                        retryable=True,
                    ) from None
                log.warning(
                    "executor replica fell silent; asking another",
                    algorithm=algorithm.qualified_name,
                    request_id=message.request_id,
                    attempt=attempts,
                )
        reply = optimization_pb2.AlgorithmReply.FromString(payload)
        if reply.status != optimization_pb2.ALGORITHM_STATUS_OK:
            status = optimization_pb2.AlgorithmStatus.Name(reply.status)
            raise DecisionFailed(
                f"{algorithm.qualified_name}: {status}: {reply.error}",
                retryable=reply.status == optimization_pb2.ALGORITHM_STATUS_UNSPECIFIED,
            )
        try:
            return from_dict(algorithm.reply_type, struct_to_dict(reply.result, "result"))
        except InvalidArgument as error:
            raise DecisionFailed(
                f"{algorithm.qualified_name}: the pool's reply is not JSON: {error}",
                retryable=False,
            ) from None
        except InvalidRequest as error:
            raise DecisionFailed(
                f"{algorithm.qualified_name}: the pool's reply does not parse: "
                f"{error.field}: {error.problem}",
                retryable=False,
            ) from None


class DecisionPort:
    """The port of one decision kind: routes each algorithm to its implementation."""

    def __init__(
        self,
        kind: DecisionKind,
        in_process: Implementation,
        pool: Implementation | None,
        routes: Mapping[str, str],
        timeout: float = DEFAULT_TIMEOUT_SECONDS,
    ) -> None:
        self.kind = kind
        self._implementations = {IN_PROCESS: in_process}
        if pool is not None:
            self._implementations[EXECUTOR] = pool
        self.routes = dict(routes)
        self.timeout = timeout

    def implementation_for(self, algorithm: str) -> str:
        """Which implementation answers ``algorithm``: its own route, its kind's, or the
        default (the pool for :data:`HEAVY_ALGORITHMS`, in-process for the rest)."""
        default = EXECUTOR if algorithm in HEAVY_ALGORITHMS else IN_PROCESS
        chosen = self.routes.get(algorithm, self.routes.get(self.kind.value, default))
        if chosen not in self._implementations:
            # Only reachable without a bus (a tool, a unit test): say so rather than guess.
            raise DecisionFailed(
                f"{algorithm} is routed to the {chosen} but no bus was given", retryable=False
            )
        return chosen

    async def decide(
        self, algorithm: AlgorithmSpec[RequestT, ReplyT], request: RequestT, job_id: str = ""
    ) -> ReplyT:
        """Run ``algorithm`` on ``request`` where the configuration says; the typed reply."""
        kind = KIND_OF_ALGORITHM.get(algorithm.name)
        if kind is not self.kind:
            raise WrongKind(
                f"{algorithm.qualified_name} answers {kind.value if kind else 'no'} decisions, "
                f"not {self.kind.value}"
            )
        chosen = self.implementation_for(algorithm.name)
        log.debug("decision", kind=self.kind.value, algorithm=algorithm.name, by=chosen)
        return await self._implementations[chosen].run(algorithm, request, job_id, self.timeout)


@dataclass(frozen=True)
class Decisions:
    """A service's ports, one per decision kind."""

    admit: DecisionPort
    allocate: DecisionPort
    place: DecisionPort
    adjust: DecisionPort
    preempt: DecisionPort
    tune_data_workers: DecisionPort


def parse_routes(routes: Mapping[str, str]) -> dict[str, str]:
    """Validated routes: keys are decision kinds or algorithm names, values ``inprocess`` or
    ``executor``. Raises ValueError naming the bad key or value."""
    kinds = {kind.value for kind in DecisionKind}
    parsed: dict[str, str] = {}
    for key, value in routes.items():
        if key not in kinds and key not in KIND_OF_ALGORITHM:
            raise ValueError(
                f"{key!r} is neither a decision kind ({', '.join(sorted(kinds))}) "
                "nor a registered algorithm"
            )
        if value not in IMPLEMENTATIONS:
            raise ValueError(f"{key}: {value!r} is not one of {', '.join(IMPLEMENTATIONS)}")
        parsed[key] = value
    return parsed


def build_decisions(
    routes: Mapping[str, str],
    bus: Bus | None,
    timeout: float = DEFAULT_TIMEOUT_SECONDS,
    silence_seconds: float = DEFAULT_SILENCE_SECONDS,
) -> Decisions:
    """Every port, routed as ``routes`` says (see :func:`parse_routes`). Without a bus only
    in-process decisions can be made, and a route to the pool fails when it is used."""
    parsed = parse_routes(routes)
    in_process = InProcess()
    pool = ExecutorPool(bus, silence_seconds) if bus is not None else None

    def port(kind: DecisionKind) -> DecisionPort:
        return DecisionPort(kind, in_process, pool, parsed, timeout)

    return Decisions(
        admit=port(DecisionKind.ADMIT),
        allocate=port(DecisionKind.ALLOCATE),
        place=port(DecisionKind.PLACE),
        adjust=port(DecisionKind.ADJUST),
        preempt=port(DecisionKind.PREEMPT),
        tune_data_workers=port(DecisionKind.TUNE_DATA_WORKERS),
    )


def struct_to_dict(struct: Struct, field: str = "arguments") -> dict[str, Any]:
    """A Struct as a plain dict, as algorithm requests and replies travel. Numbers come back
    as floats; the registry restores ints.

    A Struct can carry NaN and infinities, which no JSON value and no algorithm argument
    can be: InvalidArgument names the value's dotted path under ``field`` (the Struct's own
    name in its message, so the path reads like the registry's own argument errors).
    """
    return {key: _plain(value, field_path(field, key)) for key, value in struct.fields.items()}


def _plain(value: Value, path: str) -> Any:
    kind = value.WhichOneof("kind")
    if kind == "number_value":
        if not math.isfinite(value.number_value):
            raise InvalidArgument(path, f"{value.number_value} is not a finite number")
        return value.number_value
    if kind == "string_value":
        return value.string_value
    if kind == "bool_value":
        return value.bool_value
    if kind == "struct_value":
        return struct_to_dict(value.struct_value, path)
    if kind == "list_value":
        return [
            _plain(item, f"{path}[{index}]") for index, item in enumerate(value.list_value.values)
        ]
    return None  # null_value, or no kind set: JSON's null either way


def dict_to_struct(values: Mapping[str, Any]) -> Struct:
    """A plain dict of JSON-compatible values as a Struct."""
    struct = Struct()
    struct.update(dict(values))
    return struct
