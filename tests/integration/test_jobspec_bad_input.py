"""Every field of a job spec, with bad values, through both doors: `stride submit` and gRPC.

One admission service (real NATS, a real database) serves the whole table. For each bad
value the CLI prints exactly one error line naming the field and exits 2, SubmitJob answers
INVALID_ARGUMENT naming the field, and nothing is stored: no new job, no new event on the
jobs stream. Most CLI cases are refused before any network call (the CLI applies the same
rules); the ``request-id-too-long`` row is refused by the server and shown through the CLI.
After the table: a retried submit of the same file finds the same job, ``--new`` makes a
second one.
"""

from __future__ import annotations

import asyncio
import os
import re
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import nats
import pytest
import pytest_asyncio
import yaml

from stride.admission.app import build
from stride.admission.settings import AdmissionSettings
from stride.api.admission.v1 import admission_service_pb2 as pb
from stride.api.admission.v1 import admission_service_pb2_grpc as pb_grpc
from stride.bus import topics
from stride.events.v1 import job_pb2
from stride.runtime.embedded_nats import NatsServer
from stride.runtime.lifecycle import ServiceHost
from stride.testing.channels import aio_channel
from stride.testing.databases import create_database, drop_database
from stride.testing.inprocess import local_settings, running_service
from stride.testing.streams import stream_messages

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

ROOT = Path(__file__).resolve().parents[2]
DELETE = object()
"""A change that removes the field."""

BASE: dict[str, Any] = {
    "name": "bad-input",
    "user": "alice",
    "model": {
        "name": "wide-and-deep",
        "family": "dlrm",
        "entrypoint": "trainers.wide_deep:main",
        "embedding_dim": 16,
        "parameter_count": 1_000_000,
    },
    "dataset": {
        "name": "criteo-mini",
        "uri": "file:///data/criteo-mini",
        "record_count": 100_000,
        "format": 1,
    },
    "batch_size": 512,
    "hyperparameters": {"learning_rate": "0.001", "optimizer": "adam"},
    "termination": {"max_epochs": 2},
    "priority": 2,
}
"""A valid spec, written the same way as YAML and as a message."""

FUTURE = 1_900_000_000
"""2030-03-17: a valid deadline's seconds for the cases that break another part of it."""


@dataclass(frozen=True)
class Case:
    """One bad value: its changes to :data:`BASE` (dotted path -> value) for each door."""

    id: str
    field: str
    """The field both doors must name (``cli_field`` / ``grpc_field`` override it)."""
    changes: dict[str, object]
    grpc_changes: dict[str, object] | None = None
    """Changes for the message when YAML and the wire spell the value differently."""
    cli: bool = True
    """False when a file cannot express the value (nanos, unknown field numbers)."""
    grpc: bool = True
    """False when the wire cannot carry the value (31 digits, words for an enum)."""
    cli_field: str | None = None
    grpc_field: str | None = None
    request_id: str = ""
    """Sent with the request (``--request-id`` for the CLI)."""
    words: str = ""
    """Words the error must contain on both doors."""
    raw_tail: bytes = b""
    """Bytes appended to the serialized message (unknown fields)."""


CASES = [
    # name (1)
    Case("name-missing", "spec.name", {"name": DELETE}, words="is required"),
    Case("name-with-space", "spec.name", {"name": "has space"}),
    Case("name-too-long", "spec.name", {"name": "n" * 129}),
    # user (1): a spec without one is its submitter's (the token's; test_authorization.py)
    Case("user-with-slash", "spec.user", {"user": "a/b"}),
    # model (3)
    Case("model-missing", "spec.model.name", {"model": DELETE}),
    Case("model-image-and-entrypoint", "spec.model", {"model.image": "reg.io/t:1"}),
    Case("model-neither-image-nor-entrypoint", "spec.model", {"model.entrypoint": DELETE}),
    Case("model-name-empty", "spec.model.name", {"model.name": ""}),
    Case("model-name-megabyte-ish", "spec.model.name", {"model.name": "m" * 5000}, words="5000"),
    Case("model-name-control-char", "spec.model.name", {"model.name": "a\tb"}, words="control"),
    Case(
        "model-image-upper-case",
        "spec.model.image",
        {"model.entrypoint": DELETE, "model.image": "Registry/UPPER:1"},
    ),
    Case(
        "model-image-too-long",
        "spec.model.image",
        {"model.entrypoint": DELETE, "model.image": "a" * 600},
    ),
    Case("model-entrypoint-words", "spec.model.entrypoint", {"model.entrypoint": "not one"}),
    Case("model-entrypoint-double-dot", "spec.model.entrypoint", {"model.entrypoint": "a..b:c"}),
    Case("model-family-too-long", "spec.model.family", {"model.family": "f" * 65}),
    Case(
        "embedding-dim-negative",
        "spec.model.embedding_dim",
        {"model.embedding_dim": -7},
        words="must not be negative, got -7",
    ),
    Case("embedding-dim-huge", "spec.model.embedding_dim", {"model.embedding_dim": 10**6}),
    Case(
        "embedding-dim-31-digits",
        "spec.model.embedding_dim",
        {"model.embedding_dim": 10**30},
        grpc=False,
    ),
    Case("parameter-count-negative", "spec.model.parameter_count", {"model.parameter_count": -1}),
    Case("parameter-count-huge", "spec.model.parameter_count", {"model.parameter_count": 10**15}),
    # dataset (4)
    Case("dataset-missing", "spec.dataset.name", {"dataset": DELETE}),
    Case("dataset-name-empty", "spec.dataset.name", {"dataset.name": ""}),
    Case("dataset-name-with-space", "spec.dataset.name", {"dataset.name": "a b"}),
    Case("dataset-uri-without-scheme", "spec.dataset.uri", {"dataset.uri": "no scheme"}),
    Case("dataset-uri-too-long", "spec.dataset.uri", {"dataset.uri": "s3://" + "b" * 3000}),
    Case("record-count-missing", "spec.dataset.record_count", {"dataset.record_count": DELETE}),
    Case("record-count-negative", "spec.dataset.record_count", {"dataset.record_count": -1}),
    Case("record-count-huge", "spec.dataset.record_count", {"dataset.record_count": 10**13}),
    Case("format-unknown-number", "spec.dataset.format", {"dataset.format": 99}),
    Case("format-unknown-word", "spec.dataset.format", {"dataset.format": "zip"}, grpc=False),
    # batch_size (5)
    Case("batch-size-missing", "spec.batch_size", {"batch_size": DELETE}),
    Case("batch-size-negative", "spec.batch_size", {"batch_size": -4}),
    Case("batch-size-huge", "spec.batch_size", {"batch_size": 10**8}),
    Case("batch-size-over-dataset", "spec.batch_size", {"batch_size": 200_000}),
    Case("batch-size-31-digits", "spec.batch_size", {"batch_size": 10**30}, grpc=False),
    Case("batch-size-text", "spec.batch_size", {"batch_size": "lots"}, grpc=False),
    # hyperparameters (6)
    Case(
        "hyperparameters-too-many",
        "spec.hyperparameters",
        {"hyperparameters": {f"k{i}": "1" for i in range(101)}},
    ),
    Case("hyperparameter-key-with-space", "spec.hyperparameters", {"hyperparameters.bad key": "1"}),
    Case("hyperparameter-key-empty", "spec.hyperparameters", {"hyperparameters.": "1"}),
    Case(
        "hyperparameter-value-too-long",
        "spec.hyperparameters.note",
        {"hyperparameters.note": "v" * 1025},
    ),
    Case(
        "hyperparameters-too-many-bytes",
        "spec.hyperparameters",
        {"hyperparameters": {f"k{i}": "v" * 1000 for i in range(20)}},
    ),
    Case(
        "learning-rate-word",
        "spec.hyperparameters.learning_rate",
        {"hyperparameters.learning_rate": "fast"},
    ),
    Case(
        "learning-rate-negative",
        "spec.hyperparameters.learning_rate",
        {"hyperparameters.learning_rate": "-0.1"},
    ),
    Case(
        "learning-rate-nan",
        "spec.hyperparameters.learning_rate",
        {"hyperparameters.learning_rate": "nan"},
    ),
    Case(
        "momentum-above-one", "spec.hyperparameters.momentum", {"hyperparameters.momentum": "1.5"}
    ),
    Case(
        "hyperparameter-list",
        "spec.hyperparameters.optimizer",
        {"hyperparameters.optimizer": ["adam"]},
        grpc=False,
    ),
    # termination (7)
    Case("termination-missing", "spec.termination", {"termination": DELETE}),
    Case("termination-both", "spec.termination", {"termination.max_steps": 10}),
    Case(
        "max-steps-negative",
        "spec.termination.max_steps",
        {"termination": {"max_steps": -1}},
    ),
    Case("max-epochs-negative", "spec.termination.max_epochs", {"termination.max_epochs": -2}),
    Case("max-steps-huge", "spec.termination.max_steps", {"termination": {"max_steps": 10**12}}),
    Case("max-epochs-huge", "spec.termination.max_epochs", {"termination.max_epochs": 10**6}),
    # deadline (8)
    Case(
        "deadline-in-the-past",
        "spec.deadline",
        {"deadline": "2020-01-01T00:00:00Z"},
        grpc_changes={"deadline": (1_577_836_800, 0)},
        words="not in the future",
    ),
    Case(
        "deadline-year-9999",
        "spec.deadline",
        {"deadline": "9999-12-31T23:59:59Z"},
        grpc_changes={"deadline": (253_402_300_799, 0)},
        words="more than 10 years ahead",
    ),
    Case(
        "deadline-overflowing",
        "spec.deadline",
        {"deadline": "+99999999d"},
        grpc_changes={"deadline": (10**12, 0)},
    ),
    Case(
        "deadline-negative-nanos",
        "spec.deadline",
        {},
        grpc_changes={"deadline": (FUTURE, -5)},
        cli=False,
        words="nanos",
    ),
    Case("deadline-word", "spec.deadline", {"deadline": "tomorrow"}, grpc=False),
    # soft_deadline (9)
    Case("soft-deadline-without-deadline", "spec.soft_deadline", {"soft_deadline": True}),
    Case("soft-deadline-word", "spec.soft_deadline", {"soft_deadline": "maybe"}, grpc=False),
    # priority (10)
    Case("priority-unknown-number", "spec.priority", {"priority": 7}),
    Case("priority-negative", "spec.priority", {"priority": -1}),
    Case("priority-unknown-word", "spec.priority", {"priority": "urgent"}, grpc=False),
    # simulated (11): a bool; only a file can spell it wrong
    Case("simulated-word", "spec.simulated", {"simulated": "maybe"}, grpc=False),
    # profile (12): a declared scaling curve, judged with its field paths
    Case(
        "profile-without-points",
        "spec.profile.points",
        {"profile": {"kind": 2, "worker_cpu": 1, "worker_memory_bytes": 1024, "ps_cpu": 1}},
        words="at least one point",
    ),
    Case(
        "profile-point-without-ps",
        "spec.profile.points[0].ps",
        {
            "profile": {
                "kind": 2,
                "worker_cpu": 1,
                "worker_memory_bytes": 1024,
                "ps_cpu": 1,
                "ps_memory_bytes": 1024,
                "points": [{"workers": 1, "steps_per_second": 2.0}],
            }
        },
        words="parameter servers",
        grpc=False,  # the table's message builder sets no lists; gRPC: test_admission_guarantees
    ),
    # resource_kind (13)
    Case("resource-kind-unknown-number", "spec.resource_kind", {"resource_kind": 7}),
    Case("resource-kind-unknown-word", "spec.resource_kind", {"resource_kind": "tpu"}, grpc=False),
    # the whole spec
    Case(
        "spec-over-256-kib",
        "spec",
        # Over the spec's 256 KiB, inside SubmitJob's transport limit (test_jobspec_limits
        # sends one over that too).
        {"hyperparameters.blob": "x" * (260 * 1024)},
        words="over the 262,144-byte limit for a job spec",
    ),
    Case(
        "spec-asks-for-workers",
        "spec",
        {"workers": 8},
        grpc_changes={},
        raw_tail=b"\xa0\x06\x08",  # field 100, varint 8: what a newer client would send
        cli_field="spec.workers",
        grpc_field="spec",
    ),
    # refused by the server, not the CLI: the CLI leaves request ids to admission
    Case("request-id-too-long", "request_id", {}, request_id="r" * 201),
]


def _apply(document: dict[str, Any], changes: dict[str, object]) -> None:
    for path, value in changes.items():
        if path.startswith("hyperparameters."):
            # Keys may hold anything, dots and spaces included.
            parents, leaf = ["hyperparameters"], path.removeprefix("hyperparameters.")
        else:
            *parents, leaf = path.split(".")
        target = document
        for name in parents:
            target = target.setdefault(name, {})
        if value is DELETE:
            target.pop(leaf, None)
        else:
            target[leaf] = value


def case_yaml(case: Case) -> str:
    document = yaml.safe_load(yaml.safe_dump(BASE))
    _apply(document, case.changes)
    return yaml.safe_dump(document, width=10**9)


def case_message(case: Case) -> job_pb2.JobSpec:
    document = yaml.safe_load(yaml.safe_dump(BASE))
    _apply(document, case.changes if case.grpc_changes is None else case.grpc_changes)
    message = job_pb2.JobSpec()
    for name, value in document.items():
        if name == "deadline":
            message.deadline.seconds, message.deadline.nanos = value
        elif name == "hyperparameters":
            message.hyperparameters.update(value)
        elif isinstance(value, dict):
            for key, item in value.items():
                setattr(getattr(message, name), key, item)
        else:
            setattr(message, name, value)
    if case.raw_tail:
        message.MergeFromString(case.raw_tail)
    return message


def expected(case: Case, door: str) -> str:
    override = case.cli_field if door == "cli" else case.grpc_field
    return override or case.field


# --- One admission for the whole table -----------------------------------------------------


@pytest.fixture(scope="module")
def module_nats() -> Iterator[NatsServer]:
    server = NatsServer().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def module_database() -> Iterator[str]:
    """A PostgreSQL database for the module: the table is about refusals, which must
    store nothing."""
    url = create_database()
    try:
        yield url
    finally:
        drop_database(url)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def admission(module_nats: NatsServer, module_database: str) -> AsyncIterator[ServiceHost]:
    # The cluster `stride up` gives admission on a 2-core machine (four virtual nodes of
    # its cores), so the example's +6h deadline is guaranteed whatever machine runs this.
    settings = local_settings(
        AdmissionSettings,
        nats_url=module_nats.url,
        database_url=module_database,
        cluster_cpu=8.0,
        cluster_memory_gib=32.0,
    )
    async with running_service(build, settings) as host:
        yield host


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def stub(admission: ServiceHost) -> AsyncIterator[pb_grpc.AdmissionServiceAsyncStub]:
    async with aio_channel(f"127.0.0.1:{admission.server.port}", "admission") as channel:
        yield pb_grpc.AdmissionServiceStub(channel)


@pytest.fixture(scope="module")
def cli_env(admission: ServiceHost, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STRIDE_")}
    env.update(
        {
            "STRIDE_ADMISSION_ADDRESS": f"127.0.0.1:{admission.server.port}",
            "STRIDE_TLS_DIR": os.environ["STRIDE_TLS_DIR"],
            "STRIDE_TOKEN": os.environ["STRIDE_TOKEN"],
            "STRIDE_STATE_DIR": str(tmp_path_factory.mktemp("cli-state")),
            "COLUMNS": "80",
        }
    )
    return env


@dataclass(frozen=True)
class CliResult:
    returncode: int
    stdout: str
    stderr: str


async def stride(env: dict[str, str], *args: str) -> CliResult:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "stride.cli",
        *args,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    stdout, stderr = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode is not None
    return CliResult(process.returncode, stdout.decode(), stderr.decode())


async def stored(stub: pb_grpc.AdmissionServiceAsyncStub, nats_url: str) -> tuple[int, int]:
    """(jobs admission lists, messages on the jobs stream) right now."""
    jobs = len((await stub.ListJobs(pb.ListJobsRequest(page_size=1000))).jobs)
    connection = await nats.connect(nats_url)
    try:
        try:
            info = await connection.jetstream().stream_info(topics.JOBS.name)
        except nats.js.errors.NotFoundError:
            return jobs, 0
        return jobs, info.state.messages
    finally:
        await connection.close()


# --- The table -----------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
async def test_bad_value_is_refused_naming_the_field_and_nothing_is_stored(
    case: Case,
    stub: pb_grpc.AdmissionServiceAsyncStub,
    module_nats: NatsServer,
    cli_env: dict[str, str],
    tmp_path: Path,
) -> None:
    before = await stored(stub, module_nats.url)
    if case.grpc:
        field = expected(case, "grpc")
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await stub.SubmitJob(
                pb.SubmitJobRequest(spec=case_message(case), request_id=case.request_id)
            )
        details = raised.value.details() or ""
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT, details
        assert details.startswith(f"{field}: "), details
        assert case.words in details
        assert len(details) < 400, "a bad value is echoed in a few dozen characters"
    if case.cli:
        field = expected(case, "cli")
        path = tmp_path / "job.yaml"
        path.write_text(case_yaml(case))
        args = ["submit", str(path)]
        if case.request_id:
            args += ["--request-id", case.request_id]
        result = await stride(cli_env, *args)
        assert result.returncode == 2, result.stdout + result.stderr
        assert "Traceback" not in result.stderr
        lines = result.stderr.splitlines()
        assert len(lines) == 1, result.stderr
        assert lines[0].startswith(f"error: {path}: {field}: "), lines[0]
        assert case.words in lines[0]
        assert result.stdout == ""
    assert await stored(stub, module_nats.url) == before


async def test_the_table_covers_every_field_of_the_spec() -> None:
    named = {case.field.split(".")[1] for case in CASES if case.field.startswith("spec.")}
    assert named == {f.name for f in job_pb2.JobSpec.DESCRIPTOR.fields}
    for message in (job_pb2.ModelReference, job_pb2.DatasetSpec, job_pb2.Termination):
        prefix = {
            job_pb2.ModelReference: "spec.model.",
            job_pb2.DatasetSpec: "spec.dataset.",
            job_pb2.Termination: "spec.termination.",
        }[message]
        covered = {c.field.removeprefix(prefix) for c in CASES if c.field.startswith(prefix)}
        assert {f.name for f in message.DESCRIPTOR.fields} <= covered, message.DESCRIPTOR.name


async def test_the_whole_table_stored_nothing(
    stub: pb_grpc.AdmissionServiceAsyncStub, module_nats: NatsServer
) -> None:
    assert (await stub.ListJobs(pb.ListJobsRequest())).jobs == []
    assert await stream_messages(module_nats.url, topics.JOBS.subjects[0]) == []


# --- Submitting the same spec twice --------------------------------------------------------

JOB_ID = re.compile(r"job-[0-9a-f]{12}")


def job_id_of(result: CliResult) -> str:
    assert result.returncode == 0, result.stdout + result.stderr
    found = JOB_ID.search(result.stdout)
    assert found, result.stdout
    return found.group(0)


async def test_a_retried_submit_finds_the_same_job_and_new_makes_another(
    stub: pb_grpc.AdmissionServiceAsyncStub, cli_env: dict[str, str], tmp_path: Path
) -> None:
    spec_file = str(ROOT / "examples" / "wide-deep.yaml")  # a relative deadline: +6h
    first = job_id_of(await stride(cli_env, "submit", spec_file))
    retried = await stride(cli_env, "submit", spec_file)
    assert job_id_of(retried) == first
    again = await stride(cli_env, "submit", spec_file, "--new")
    second = job_id_of(again)
    assert second != first
    listed = {job.job_id for job in (await stub.ListJobs(pb.ListJobsRequest())).jobs}
    assert listed == {first, second}

    keyed = [await stride(cli_env, "submit", spec_file, "--request-id", "r-1") for _ in "ab"]
    assert job_id_of(keyed[0]) == job_id_of(keyed[1]) not in (first, second)
