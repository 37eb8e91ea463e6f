"""The policy ports: every algorithm has a kind, routes are validated, and a port refuses
an algorithm of another kind."""

from __future__ import annotations

from dataclasses import replace

import pytest

from stride.decisions import (
    EXECUTOR,
    HEAVY_ALGORITHMS,
    IN_PROCESS,
    KIND_OF_ALGORITHM,
    DecisionFailed,
    DecisionKind,
    WrongKind,
    build_decisions,
    parse_routes,
)
from stride.policy.cold_start import (
    COLD_START,
    ColdStartReply,
    ColdStartRequest,
    JobFeatures,
    cold_start_plan,
)
from stride.policy.elasticflow import ALGORITHMS as ELASTICFLOW
from stride.policy.elasticflow.admission import AdmissionRequest, DeadlineJob
from stride.policy.elasticflow.curves import ScalingCurve
from stride.policy.registry import default_registry

FEATURES = JobFeatures(model_name="wdl", record_count=10_000, batch_size=100, max_epochs=1)


def test_every_registered_algorithm_answers_exactly_one_kind() -> None:
    registered = {spec.name for spec in default_registry().list()}
    assert registered == set(KIND_OF_ALGORITHM), (
        "classify new algorithms in stride.decisions.KIND_OF_ALGORITHM: "
        f"{sorted(registered ^ set(KIND_OF_ALGORITHM))}"
    )
    assert {kind for kind in KIND_OF_ALGORITHM.values()} == set(DecisionKind)
    assert registered >= HEAVY_ALGORITHMS


async def test_in_process_decides_what_the_algorithm_decides() -> None:
    decisions = build_decisions({}, bus=None)
    reply = await decisions.adjust.decide(COLD_START, ColdStartRequest(FEATURES, 2.0), "job-1")
    assert reply.plan == cold_start_plan(FEATURES, 2.0)
    admitted = await decisions.admit.decide(ELASTICFLOW[0], admission_request())
    assert admitted.decision.value == "admitted"


async def test_a_port_refuses_another_kinds_algorithm() -> None:
    decisions = build_decisions({}, bus=None)
    with pytest.raises(WrongKind, match="cold-start-plan/1 answers adjust decisions, not admit"):
        await decisions.admit.decide(COLD_START, ColdStartRequest(FEATURES))


def test_routes_go_by_algorithm_then_kind_then_default() -> None:
    decisions = build_decisions({"adjust": EXECUTOR, "cold-start-plan": IN_PROCESS}, bus=None)
    assert decisions.adjust.routes["cold-start-plan"] == IN_PROCESS
    assert decisions.adjust.implementation_for("cold-start-plan") == IN_PROCESS
    defaults = build_decisions({}, bus=None)
    assert defaults.adjust.implementation_for("cold-start-plan") == IN_PROCESS
    with pytest.raises(DecisionFailed, match="no bus"):
        defaults.adjust.implementation_for("dlrover-pareto-candidates")
    with pytest.raises(DecisionFailed, match="no bus"):
        decisions.adjust.implementation_for("dlrover-adjust")


@pytest.mark.parametrize(
    ("routes", "message"),
    [
        ({"adjst": "executor"}, "'adjst' is neither a decision kind"),
        ({"adjust": "gpu"}, "adjust: 'gpu' is not one of inprocess, executor"),
    ],
)
def test_bad_routes_name_the_problem(routes: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_routes(routes)


async def test_a_failing_algorithm_is_a_decision_failure_that_is_not_retried() -> None:
    def broken(request: ColdStartRequest) -> ColdStartReply:
        raise ZeroDivisionError("division by zero")

    spec = replace(COLD_START, version=99, run=broken)
    decisions = build_decisions({}, bus=None)
    with pytest.raises(
        DecisionFailed, match="cold-start-plan/99 failed: ZeroDivisionError"
    ) as raised:
        await decisions.adjust.decide(spec, ColdStartRequest(FEATURES))
    assert not raised.value.retryable


def admission_request() -> AdmissionRequest:
    """A deadline job that fits: 3,600 iterations due in an hour on 8 GPUs."""
    curve = ScalingCurve((1, 2, 4), (1.0, 1.9, 3.6))
    return AdmissionRequest(8, 0.0, 300.0, DeadlineJob("job-1", curve, 3600.0, 3600.0))
