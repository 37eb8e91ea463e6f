"""What one user may submit (issue 37): the spec fields only an admin or a granting quota
may set, the default cap on a user's active jobs, the quota fields that grant, and
SubmitJob's request limit, which is the spec's plus a small envelope."""

from __future__ import annotations

import pytest

from stride.admission.domain.limits import (
    Submitter,
    active_cap,
    over_active_cap,
    privilege_refusal,
    user_class,
)
from stride.admission.domain.quotas import Quota, make_quota, quotas_from_config
from stride.admission.settings import SUBMIT_REQUEST_BYTES, AdmissionSettings
from stride.api.admission.v1 import admission_service_pb2 as pb
from stride.runtime.errors import InvalidArgument
from stride.runtime.grpc_server import request_limit
from stride.vocabulary.jobspec import MAX_SPEC_BYTES, Priority

ALICE = Submitter("alice", trusted=False)
ADMIN = Submitter("alice", trusted=True)
LOW, NORMAL, HIGH, UNSPECIFIED = 1, 2, 3, 0
GRANTS_HIGH = Quota("user:alice", max_priority=Priority.HIGH)
GRANTS_SIMULATED = Quota("team:ml", members=("alice", "bob"), allow_simulated=True)


@pytest.mark.parametrize("priority", [UNSPECIFIED, LOW, NORMAL])
def test_every_user_may_ask_for_normal_and_below(priority: int) -> None:
    assert privilege_refusal(ALICE, priority, False, ()) is None


def test_high_priority_needs_an_admin_or_a_granting_quota() -> None:
    refusal = privilege_refusal(ALICE, HIGH, False, ())
    assert refusal is not None and refusal.field == "spec.priority"
    assert refusal.problem.startswith("high is above user 'alice''s class (normal)")
    assert "max_priority high" in refusal.problem
    assert privilege_refusal(ADMIN, HIGH, False, ()) is None
    assert privilege_refusal(ALICE, HIGH, False, (GRANTS_HIGH,)) is None
    assert user_class((GRANTS_SIMULATED, GRANTS_HIGH)) is Priority.HIGH
    assert user_class(()) is Priority.NORMAL


def test_simulated_needs_an_admin_or_a_granting_quota() -> None:
    refusal = privilege_refusal(ALICE, NORMAL, True, (GRANTS_HIGH,))
    assert refusal is not None and refusal.field == "spec.simulated"
    assert "allow_simulated" in refusal.problem and "admin" in refusal.problem
    assert privilege_refusal(ADMIN, NORMAL, True, ()) is None
    assert privilege_refusal(ALICE, NORMAL, True, (GRANTS_SIMULATED,)) is None


def test_an_unknown_priority_number_is_left_to_the_spec_rules() -> None:
    assert privilege_refusal(ALICE, 9, False, ()) is None


def test_the_default_cap_yields_to_the_users_own_active_quota_only() -> None:
    assert active_cap("alice", (), 50) == 50
    assert active_cap("alice", (Quota("user:alice", max_active_jobs=80),), 50) == 0
    # A submissions-only quota or a team's quota leaves the default in force.
    assert active_cap("alice", (Quota("user:alice", max_submissions=9),), 50) == 50
    assert active_cap("alice", (Quota("team:t", 3, members=("alice",)),), 50) == 50
    assert active_cap("alice", (), 0) == 0


def test_the_cap_refusal_names_the_limit_and_the_count() -> None:
    assert over_active_cap("alice", 49, 50, "SETTING") is None
    assert over_active_cap("alice", 99, 0, "SETTING") is None
    refusal = over_active_cap("alice", 50, 50, "SETTING")
    assert refusal is not None and refusal.field == "max_active_jobs"
    assert refusal.problem.startswith(
        "user 'alice' holds 50 active (admitted or queued) jobs, at the default limit of 50 "
        "a user (SETTING)"
    )


def test_a_quota_may_grant_without_limiting() -> None:
    quota = make_quota("user:alice", max_priority="high", allow_simulated=True)
    assert quota.max_priority is Priority.HIGH and quota.allow_simulated
    assert quota.max_active_jobs == 0 and quota.max_submissions == 0


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({}, "quota"),
        ({"max_priority": "low"}, "quota.max_priority"),
        ({"max_priority": "normal"}, "quota.max_priority"),
        ({"max_priority": "urgent"}, "quota.max_priority"),
        ({"allow_simulated": "yes"}, "quota.allow_simulated"),
    ],
)
def test_a_quota_that_grants_nothing_it_can_is_refused(
    kwargs: dict[str, object], field: str
) -> None:
    with pytest.raises(InvalidArgument) as raised:
        make_quota("user:alice", **kwargs)  # type: ignore[arg-type]
    assert raised.value.field == field


def test_the_quotas_file_grants() -> None:
    (quota,) = quotas_from_config(
        {"quotas": [{"scope": "user:ops", "max_priority": "high", "allow_simulated": True}]}
    )
    assert quota.max_priority is Priority.HIGH and quota.allow_simulated
    assert quota.source == "config"


def test_submit_jobs_request_limit_is_the_specs_and_a_small_envelope() -> None:
    method = "/stride.api.admission.v1.AdmissionService/SubmitJob"
    assert SUBMIT_REQUEST_BYTES == MAX_SPEC_BYTES + 8 * 1024
    assert request_limit(method) == SUBMIT_REQUEST_BYTES
    assert AdmissionSettings().grpc_max_receive_message_bytes == SUBMIT_REQUEST_BYTES
    # No admission method takes more than the server does.
    for name in pb.DESCRIPTOR.services_by_name["AdmissionService"].methods_by_name:
        limit = request_limit(f"/stride.api.admission.v1.AdmissionService/{name}")
        assert limit is not None and limit <= SUBMIT_REQUEST_BYTES, name
    # The request's own fields at their largest fit the envelope.
    request = pb.SubmitJobRequest(request_id="é" * 200)
    request.spec.hyperparameters["blob"] = "x" * MAX_SPEC_BYTES
    assert request.ByteSize() - request.spec.ByteSize() < 8 * 1024
