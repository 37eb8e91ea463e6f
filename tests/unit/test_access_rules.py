"""Every gRPC method of every service has an access rule (stride.runtime.auth), and the
rules say what each service's docstring promises: a method without one is closed."""

from __future__ import annotations

import pytest
from google.protobuf import descriptor

from stride.admission.adapters.inbound.grpc_api import ACCESS as ADMISSION
from stride.agent.adapters.inbound.grpc_api import ACCESS as AGENT
from stride.api.admission.v1 import admission_service_pb2
from stride.api.agent.v1 import agent_service_pb2
from stride.api.ckptcache.v1 import ckptcache_service_pb2
from stride.api.configdb.v1 import configdb_service_pb2
from stride.api.dispatcher.v1 import dispatcher_service_pb2
from stride.api.executor.v1 import executor_service_pb2
from stride.api.optimizer.v1 import optimizer_service_pb2
from stride.api.podwatcher.v1 import podwatcher_service_pb2
from stride.ckptcache.adapters.inbound.grpc_api import ACCESS as CKPTCACHE
from stride.configdb.adapters.inbound.grpc_api import ACCESS as CONFIGDB
from stride.dispatcher.adapters.inbound.grpc_api import ACCESS as DISPATCHER
from stride.executor.adapters.inbound.grpc_api import ACCESS as EXECUTOR
from stride.optimizer.adapters.inbound.grpc_api import ACCESS as OPTIMIZER
from stride.podwatcher.adapters.inbound.grpc_api import ACCESS as PODWATCHER
from stride.runtime.auth import RateLimiter, Rule

MODULES = {
    "admission": (admission_service_pb2, ADMISSION),
    "agent": (agent_service_pb2, AGENT),
    "ckptcache": (ckptcache_service_pb2, CKPTCACHE),
    "configdb": (configdb_service_pb2, CONFIGDB),
    "dispatcher": (dispatcher_service_pb2, DISPATCHER),
    "executor": (executor_service_pb2, EXECUTOR),
    "optimizer": (optimizer_service_pb2, OPTIMIZER),
    "podwatcher": (podwatcher_service_pb2, PODWATCHER),
}


def methods(module: object) -> list[str]:
    file: descriptor.FileDescriptor = module.DESCRIPTOR  # type: ignore[attr-defined]
    return [
        f"/{service.full_name}/{method.name}"
        for service in file.services_by_name.values()
        for method in service.methods
    ]


@pytest.mark.parametrize("name", sorted(MODULES))
def test_every_method_has_a_rule_and_no_rule_names_a_missing_method(name: str) -> None:
    module, access = MODULES[name]
    assert sorted(access) == sorted(methods(module))


@pytest.mark.parametrize("name", ["dispatcher", "ckptcache", "agent"])
def test_job_scoped_services_take_job_tokens_and_no_plain_users(name: str) -> None:
    _, access = MODULES[name]
    for method, rule in access.items():
        assert rule.jobs, method
        assert not rule.users, f"{method}: a plain user token may not touch a job's data"


@pytest.mark.parametrize("name", ["admission", "optimizer", "podwatcher", "configdb", "executor"])
def test_user_facing_services_take_no_job_tokens(name: str) -> None:
    """A pod's token is for its own job's data, not for submitting or steering jobs."""
    _, access = MODULES[name]
    assert all(not rule.jobs for rule in access.values())


def test_admin_only_methods() -> None:
    admin_only = {
        method
        for access in (ADMISSION, PODWATCHER, CONFIGDB, EXECUTOR)
        for method, rule in access.items()
        if rule.admins and not rule.users
    }
    assert {m.rpartition("/")[2] for m in admin_only} == {
        "SetQuota",
        "DeleteQuota",
        "RevokeTokens",
        "Advance",
        "DrainNode",
        "RestoreNode",
        "ListJobRecords",
        "FindSimilarJobs",
        "RunAlgorithm",
        "ListAlgorithms",
    }


def test_services_that_call_on_the_systems_behalf() -> None:
    by_peer = {
        method.rpartition("/")[2]: rule.services
        for access in MODULES.values()
        for method, rule in access[1].items()
        if rule.services
    }
    assert by_peer == {
        "FindSimilarJobs": frozenset({"admission", "optimizer"}),
        "MarkWorkerLost": frozenset({"podwatcher"}),
        # The operator, for Kubernetes namespaces' jobs only (StrideJobs; issue 38).
        "SubmitJob": frozenset({"podwatcher"}),
        "GetJob": frozenset({"podwatcher"}),
        "CancelJob": frozenset({"podwatcher"}),
        "GetDatasetState": frozenset({"podwatcher"}),
        "ListDatasets": frozenset({"podwatcher"}),
        # The optimizer asks admission for more than a job's share (issue 39).
        "RequestShare": frozenset({"optimizer"}),
    }


def test_a_rule_describes_itself() -> None:
    assert Rule().describe() == "nobody (closed)"
    assert "a job token" in DISPATCHER[next(iter(DISPATCHER))].describe()


def test_a_token_bucket_per_identity() -> None:
    now = [0.0]
    limiter = RateLimiter(2.0, 3, clock=lambda: now[0], max_keys=2)
    assert [limiter.take("alice") for _ in range(3)] == [0.0, 0.0, 0.0]
    assert limiter.take("alice") == pytest.approx(0.5)  # refused: half a second to a token
    assert limiter.take("bob") == 0.0  # another identity has its own bucket
    now[0] = 0.5
    assert limiter.take("alice") == 0.0
    assert limiter.take("alice") == pytest.approx(0.5)
    now[0] = 100.0  # refills up to the burst, no more
    assert [limiter.take("alice") for _ in range(4)][-1] > 0
    limiter.take("carol")
    limiter.take("dave")  # past max_keys the least recently seen (bob) is forgotten
    assert "bob" not in limiter._buckets and len(limiter._buckets) == 2
    assert RateLimiter(0, 1).take("x") == 0.0  # 0: no limit
    with pytest.raises(ValueError, match="rate"):
        RateLimiter(-1, 1)
