"""The config DB's past jobs as warm-start history: the final plan's pods, with the memory
the job was measured to need."""

from __future__ import annotations

import math

from stride.api.configdb.v1 import configdb_service_pb2 as configdb_pb
from stride.events.v1 import job_pb2, plan_pb2
from stride.optimizer.adapters.outbound.history import history_entry

GIB = 1024**3


def _record(*profiles: configdb_pb.RuntimeProfile) -> configdb_pb.JobRecord:
    spec = job_pb2.JobSpec(
        name="j",
        user="u",
        model=job_pb2.ModelReference(
            name="dlrm-x", family="dlrm", embedding_dim=16, entrypoint="a:b"
        ),
        dataset=job_pb2.DatasetSpec(name="d", record_count=1000),
        batch_size=10,
        termination=job_pb2.Termination(max_epochs=2),
    )
    plan = plan_pb2.ResourcePlan(
        job_id="j",
        version=2,
        roles=[
            plan_pb2.RoleResources(
                role=plan_pb2.ROLE_WORKER, count=4, cpu=2.0, memory_bytes=16 * GIB
            ),
            plan_pb2.RoleResources(role=plan_pb2.ROLE_PS, count=2, cpu=4.0, memory_bytes=32 * GIB),
        ],
    )
    return configdb_pb.JobRecord(job_id="j", spec=spec, plans=[plan], profiles=list(profiles))


def _usage(
    role: plan_pb2.Role.ValueType, peak_gib: float, samples: int = 3
) -> configdb_pb.RoleUsage:
    return configdb_pb.RoleUsage(
        role=role, pods=2, samples=samples, memory_used_max_bytes=int(peak_gib * GIB)
    )


def test_memory_is_the_measured_peak_with_headroom_over_every_plan_version() -> None:
    record = _record(
        configdb_pb.RuntimeProfile(
            plan_version=1,
            roles=[_usage(plan_pb2.ROLE_WORKER, 3.0), _usage(plan_pb2.ROLE_PS, 6.0)],
        ),
        configdb_pb.RuntimeProfile(
            plan_version=2,
            roles=[_usage(plan_pb2.ROLE_WORKER, 2.5), _usage(plan_pb2.ROLE_PS, 10.0)],
        ),
    )
    job = history_entry(record)
    assert job is not None
    config = job.configuration
    # Workers peaked at 3 GiB (version 1), the busiest PS at 10 GiB (version 2); x 1.1 each.
    assert config.worker_memory_bytes == math.ceil(3 * GIB * 1.1)
    assert config.ps_memory_bytes == math.ceil(10 * GIB * 1.1)
    assert (config.worker_count, config.ps_count) == (4, 2)


def test_without_measured_usage_the_final_plan_memory_stands() -> None:
    record = _record(
        configdb_pb.RuntimeProfile(
            plan_version=2, roles=[_usage(plan_pb2.ROLE_WORKER, 3.0, samples=0)]
        )
    )
    job = history_entry(record)
    assert job is not None
    assert job.configuration.worker_memory_bytes == 16 * GIB
    assert job.configuration.ps_memory_bytes == 32 * GIB
