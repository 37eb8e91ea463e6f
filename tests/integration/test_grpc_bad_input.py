"""Every method of every gRPC API, fed bad input on the real running services.

The methods come from the proto descriptors (every ``stride.api.<service>.v1`` module), so
a new method or service is covered without touching this file; a new service only needs a
running instance in :class:`Suite`. Each method gets, on one running instance per service:

- bytes that do not decode as its request (and, per string field, invalid UTF-8);
- its request with each field at an extreme (integer limits, NaN and infinities, 100k and
  NUL strings, timestamps and durations out of range, enums out of range, many repeated
  elements, nested messages unset or empty), one field at a time, on top of a request that
  is otherwise valid, so the call gets as deep as it can;
- hypothesis-generated requests (bounded, derandomized), sparse ones and ones merged over
  the valid request.

The answer must be a deliberate status: never INTERNAL or UNKNOWN, and no unary call may
hang. An INVALID_ARGUMENT (or OUT_OF_RANGE) must name the field: the one changed when the
rest of the request was valid, else some field of the request. A request stream carries one
message. The dispatcher's ShardSession answers each call in-band with a SessionError, whose
code is judged the same way.
"""

from __future__ import annotations

import asyncio
import importlib
import math
import os
import pkgutil
import re
import threading
import time
from collections.abc import Callable, Coroutine, Iterator, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import cache
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pytest
from google.protobuf import message_factory
from google.protobuf.descriptor import (
    Descriptor,
    EnumDescriptor,
    FieldDescriptor,
    MethodDescriptor,
    ServiceDescriptor,
)
from google.protobuf.message import Message
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import stride.api
from stride.admission.app import build as build_admission
from stride.admission.settings import AdmissionSettings
from stride.agent.app import build as build_agent
from stride.agent.settings import AgentSettings
from stride.api.admission.v1 import admission_service_pb2 as admission_pb
from stride.api.ckptcache.v1 import ckptcache_service_pb2 as ckpt_pb
from stride.api.dispatcher.v1 import dispatcher_service_pb2 as dispatcher_pb
from stride.ckptcache.app import build as build_ckptcache
from stride.ckptcache.domain.checksum import checksum
from stride.ckptcache.settings import CheckpointCacheSettings
from stride.configdb.app import build as build_configdb
from stride.configdb.settings import ConfigDbSettings
from stride.dispatcher.app import build as build_dispatcher
from stride.dispatcher.settings import DispatcherSettings
from stride.events.v1 import job_pb2, optimization_pb2, shard_pb2
from stride.executor.adapters.convert import dict_to_struct
from stride.executor.app import build as build_executor
from stride.executor.settings import ExecutorSettings
from stride.optimizer.app import build as build_optimizer
from stride.optimizer.settings import OptimizerSettings
from stride.podwatcher.app import build as build_podwatcher
from stride.podwatcher.settings import PodWatcherSettings
from stride.runtime.embedded_nats import NatsServer
from stride.runtime.grpc_server import MAX_STATUS_MESSAGE_BYTES, request_limit
from stride.runtime.lifecycle import ServiceHost
from stride.runtime.settings import ServiceSettings
from stride.runtime.tokens import TokenSource
from stride.testing.channels import job_token_file, pod_key_file, sync_channel
from stride.testing.databases import create_database, drop_database
from stride.testing.inprocess import local_settings, running_service
from stride.trainer.agent_client import AgentClient
from stride.trainer.batches import Producer
from stride.trainer.dataworker import DataWorkerApi, DataWorkerServer

pytestmark = pytest.mark.integration

T = TypeVar("T")
S = TypeVar("S", bound=ServiceSettings)

JOB = "job-fuzz01"
"""The job of the agent's pod, and the caller's job at the checkpoint cache and dispatcher."""
POD = "job-fuzz01-worker-0"
DATASET = "train"
WORKER = "worker-0"
CHECKPOINT = "ckpt-fuzz"
CHECKPOINT_DATA = b"\x00\x00\x80\x3f"
MIB = 1024 * 1024

NEVER = frozenset({grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN})
"""What bad input must never get: both mean "the server failed", not "your request is bad"."""
NAMING = frozenset({grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.OUT_OF_RANGE})
"""Statuses about the request's content, whose message must name the field."""
UNARY_TIMEOUT = 15.0
STREAM_TIMEOUT = 1.0
"""A response stream may legitimately stay open (WatchControl waits for commands); it is
read this long, and DEADLINE_EXCEEDED is then no finding."""
HYPOTHESIS_EXAMPLES = 40
"""Generated requests per method in the test run."""
FUZZ_CASES_ENV = "STRIDE_FUZZ_CASES"
"""Generated requests per *service* instead (``make fuzz``: 10,000), split evenly over its
methods."""


# --- the methods, from the descriptors ----------------------------------------------------


def _api_services() -> list[ServiceDescriptor]:
    services: list[ServiceDescriptor] = []
    for module_info in pkgutil.walk_packages(stride.api.__path__, "stride.api."):
        if not module_info.name.endswith("_pb2"):
            continue
        module = importlib.import_module(module_info.name)
        services.extend(module.DESCRIPTOR.services_by_name.values())
    return sorted(services, key=lambda service: service.full_name)


def service_key(service: ServiceDescriptor) -> str:
    """``stride.api.<key>.v1.XService`` -> ``<key>``: which running instance serves it.
    Admission serves its replay clock only on a stepped clock: another instance does."""
    if service.name == "ReplayClockService":
        return "replay-clock"
    return service.full_name.split(".")[2]


METHODS: list[MethodDescriptor] = [
    method for service in _api_services() for method in service.methods
]


def method_id(method: MethodDescriptor) -> str:
    """``dispatcher.GetShard``."""
    return f"{service_key(method.containing_service)}.{method.name}"


def method_path(method: MethodDescriptor) -> str:
    """The HTTP/2 path of the method, as the server sees it."""
    return f"/{method.containing_service.full_name}/{method.name}"


@cache
def message_class(descriptor: Descriptor) -> type[Message]:
    """The generated class of a message type."""
    return message_factory.GetMessageClass(descriptor)


def clone(message: Message) -> Message:
    """A deep copy."""
    copy = type(message)()
    copy.CopyFrom(message)
    return copy


# --- the running services ----------------------------------------------------------------


class Suite:
    """All eight services in-process, on one event loop in a background thread.

    The test functions are synchronous (so hypothesis drives them directly) and call the
    services over real gRPC channels; the services share one nats-server and one
    PostgreSQL database (each in its own schema, as ``stride up`` runs them).
    """

    def __init__(self, nats_url: str, database_url: str, tmp: Path) -> None:
        self.nats_url = nats_url
        self.database_url = database_url
        self.tmp = tmp
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="services")
        self.stack = AsyncExitStack()
        self.hosts: dict[str, ServiceHost] = {}
        self.settings: dict[str, ServiceSettings] = {}
        self.channels: dict[str, grpc.Channel] = {}
        self.words: dict[str, dict[str, Any]] = {}
        """Per service, plain values for fields by name (ids of things that exist)."""
        self.data_worker: DataWorkerServer | None = None

    def run(self, coroutine: Coroutine[Any, Any, T], timeout: float = 60.0) -> T:
        """Run ``coroutine`` on the services' loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def start(self) -> None:
        """Start every service and open a channel to each."""
        self.thread.start()
        self.run(self._start(), timeout=120)
        for key, host in self.hosts.items():
            self.channels[key] = sync_channel(
                f"127.0.0.1:{host.server.port}",
                "admission" if key == "replay-clock" else key,
                options=[("grpc.max_receive_message_length", 64 * MIB)],
            )
        self._start_data_worker()

    def _start_data_worker(self) -> None:
        """A job pod's data worker (stride.api.dataworker): served by the pod, plain text on
        its per-job guarded port, fetching through the agent above for the agent's job."""
        agent = AgentClient(
            f"127.0.0.1:{self.hosts['agent'].server.port}",
            patience=5.0,
            timeout=5.0,
            token=TokenSource(path=job_token_file(self.tmp, JOB, POD)),
        )
        producer = Producer(lambda indices: [indices.astype("float32"), indices % 2], None)
        self.data_worker = DataWorkerServer(DataWorkerApi(JOB, agent, producer), 0)
        self.data_worker.start()
        self.channels["dataworker"] = grpc.insecure_channel(f"127.0.0.1:{self.data_worker.port}")

    def max_receive_bytes(self, key: str) -> int:
        """The transport limit of the server behind ``key``."""
        if key == "dataworker":
            return DataWorkerServer.MAX_RECEIVE_BYTES
        return self.settings[key].grpc_max_receive_message_bytes

    async def _start(self) -> None:
        common: dict[str, Any] = {
            "nats_url": self.nats_url,
            "health_interval_seconds": 0.5,
            "shutdown_grace_seconds": 2,
        }
        stored = {**common, "database_url": self.database_url}
        await self._run("admission", build_admission, local_settings(AdmissionSettings, **stored))
        stepped = local_settings(
            AdmissionSettings,
            **common,
            database_url=f"sqlite:///{self.tmp / 'replay-clock.db'}",
            replay_stepped=True,
            replay_origin=time.time(),
        )
        await self._run("replay-clock", build_admission, stepped)
        await self._run("optimizer", build_optimizer, local_settings(OptimizerSettings, **stored))
        await self._run("executor", build_executor, local_settings(ExecutorSettings, **common))
        await self._run("configdb", build_configdb, local_settings(ConfigDbSettings, **stored))
        await self._run(
            "podwatcher",
            build_podwatcher,
            local_settings(PodWatcherSettings, **stored, local_state_dir=self.tmp / "pods"),
        )
        await self._run(
            "dispatcher", build_dispatcher, local_settings(DispatcherSettings, **stored)
        )
        cache_settings = local_settings(
            CheckpointCacheSettings,
            **common,
            store_dir=self.tmp / "store",
            shm_dir=self.tmp / "shm",
            shm_min_bytes=0,
            chunk_bytes=64 * 1024,
            max_checkpoint_bytes=64 * MIB,
        )
        await self._run("ckptcache", build_ckptcache, cache_settings)
        agent_settings = local_settings(
            AgentSettings,
            **common,
            job_id=JOB,
            pod_name=POD,
            role="worker",
            dispatcher_address=f"127.0.0.1:{self.hosts['dispatcher'].server.port}",
            ckptcache_address=f"127.0.0.1:{self.hosts['ckptcache'].server.port}",
            upstream_timeout_seconds=5,
            job_token_file=(token_file := job_token_file(self.tmp, JOB, POD)),
            job_key_file=pod_key_file(token_file),
        )
        await self._run("agent", build_agent, agent_settings)

    async def _run(self, key: str, build: Callable[[S], Any], settings_: S) -> None:
        self.settings[key] = settings_
        self.hosts[key] = await self.stack.enter_async_context(running_service(build, settings_))

    def stop(self) -> None:
        """Close the channels, shut every service down in order, end the loop."""
        for channel in self.channels.values():
            channel.close()
        if self.data_worker is not None:
            self.data_worker.stop(grace=0)
        try:
            if self.thread.is_alive():
                self.run(self.stack.aclose(), timeout=60)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
            self.loop.close()

    def channel(self, method: MethodDescriptor) -> grpc.Channel:
        """The channel to the service serving ``method``."""
        key = service_key(method.containing_service)
        if key not in self.channels:
            raise AssertionError(f"no running instance of {key!r}: add it to Suite._start")
        return self.channels[key]

    def serving(self, method: MethodDescriptor) -> bool:
        """Whether the server of ``method`` reports its service SERVING (health)."""
        stub = health_pb2_grpc.HealthStub(self.channel(method))
        request = health_pb2.HealthCheckRequest(service=method.containing_service.full_name)
        reply = stub.Check(request, timeout=UNARY_TIMEOUT)
        return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)

    def call(self, method: MethodDescriptor, payload: bytes) -> Outcome:
        """Send ``payload`` as the request (one message on a request stream)."""
        return invoke(self.channel(method), method, [payload])


@dataclass
class Outcome:
    """How a call ended, with the responses it got before."""

    code: grpc.StatusCode
    details: str
    responses: list[bytes] = field(default_factory=list)


METADATA = (("stride-job-id", JOB),)
"""The checkpoint cache's caller identity; the other services ignore it."""


def _raw(data: bytes) -> bytes:
    return data


def invoke(channel: grpc.Channel, method: MethodDescriptor, payloads: Sequence[bytes]) -> Outcome:
    """Call ``method`` with raw request messages (only the first unless the method takes a
    stream); a response stream is read to its end, or for :data:`STREAM_TIMEOUT`."""
    path = method_path(method)
    responses: list[bytes] = []
    timeout = STREAM_TIMEOUT if method.server_streaming else UNARY_TIMEOUT
    try:
        if method.client_streaming and method.server_streaming:
            call = channel.stream_stream(path, _raw, _raw)
            for response in call(iter(payloads), timeout=timeout, metadata=METADATA):
                responses.append(response)
        elif method.server_streaming:
            call_stream = channel.unary_stream(path, _raw, _raw)
            for response in call_stream(payloads[0], timeout=timeout, metadata=METADATA):
                responses.append(response)
        elif method.client_streaming:
            call_unary = channel.stream_unary(path, _raw, _raw)
            responses.append(call_unary(iter(payloads), timeout=timeout, metadata=METADATA))
        else:
            call_plain = channel.unary_unary(path, _raw, _raw)
            responses.append(call_plain(payloads[0], timeout=timeout, metadata=METADATA))
    except grpc.RpcError as error:
        return Outcome(error.code(), error.details() or "", responses)
    return Outcome(grpc.StatusCode.OK, "", responses)


@pytest.fixture(scope="module")
def suite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Suite]:
    """One running instance of every service for the whole module, with things to find:
    a submitted job, a dataset with a registered worker, a stored checkpoint."""
    nats_server = NatsServer().start()
    database_url = create_database()
    running = Suite(nats_server.url, database_url, tmp_path_factory.mktemp("bad-input"))
    try:
        running.start()
        _populate(running)
        yield running
    finally:
        try:
            running.stop()
        finally:
            drop_database(database_url)
            nats_server.stop()


def method_named(identifier: str) -> MethodDescriptor:
    """The method ``service.Method`` (``dispatcher.GetShard``)."""
    return next(method for method in METHODS if method_id(method) == identifier)


def _unary(suite: Suite, identifier: str, request: Message) -> bytes:
    outcome = suite.call(method_named(identifier), request.SerializeToString())
    assert outcome.code == grpc.StatusCode.OK, (identifier, outcome)
    return outcome.responses[0]


def _populate(suite: Suite) -> None:
    submitted = admission_pb.SubmitJobResponse.FromString(
        _unary(
            suite,
            "admission.SubmitJob",
            admission_pb.SubmitJobRequest(spec=valid_spec(), request_id="fuzz-setup"),
        )
    )
    admitted_job = submitted.job.job_id
    _unary(
        suite,
        "dispatcher.CreateDataset",
        dispatcher_pb.CreateDatasetRequest(
            job_id=JOB, dataset=DATASET, parameters=valid_parameters()
        ),
    )
    registered = dispatcher_pb.RegisterWorkerResponse.FromString(
        _unary(
            suite,
            "dispatcher.RegisterWorker",
            dispatcher_pb.RegisterWorkerRequest(job_id=JOB, worker=WORKER),
        )
    )
    snapshot = dispatcher_pb.SnapshotShardsResponse.FromString(
        _unary(
            suite,
            "dispatcher.SnapshotShards",
            dispatcher_pb.SnapshotShardsRequest(job_id=JOB, dataset=DATASET),
        )
    )
    save = method_named("ckptcache.SaveCheckpoint")
    saved = invoke(
        suite.channel(save),
        save,
        [
            ckpt_pb.SaveCheckpointRequest(header=valid_header()).SerializeToString(),
            ckpt_pb.SaveCheckpointRequest(data=CHECKPOINT_DATA).SerializeToString(),
        ],
    )
    assert saved.code == grpc.StatusCode.OK, saved
    shared = {
        "dataset": DATASET,
        "worker": WORKER,
        "data_worker": "data-worker-0",
        "checkpoint_id": CHECKPOINT,
        "segment_name": "fuzz.seg",
        "incarnation": registered.incarnation,
        "snapshot": snapshot.snapshot,
        "user": "alice",
        "dtype": "float32",
    }
    for key in [*suite.hosts, "dataworker"]:
        # Admission's job lives on through the optimizer, configdb and the podwatcher; the
        # agent's pod job is the one the dispatcher and the cache know.
        known_job = admitted_job if key in JOB_FOLLOWERS else JOB
        suite.words[key] = {**shared, "job_id": known_job}


JOB_FOLLOWERS = frozenset({"admission", "optimizer", "configdb", "podwatcher"})


# --- valid requests to start from ---------------------------------------------------------


def valid_spec() -> job_pb2.JobSpec:
    """A spec admission accepts."""
    return job_pb2.JobSpec(
        name="wide-deep",
        user="alice",
        model=job_pb2.ModelReference(
            name="wide-and-deep", entrypoint="trainers.wide_deep:main", embedding_dim=8
        ),
        dataset=job_pb2.DatasetSpec(name="criteo-mini", record_count=100_000),
        batch_size=512,
        hyperparameters={"learning_rate": "0.01"},
        termination=job_pb2.Termination(max_epochs=2),
    )


def valid_parameters() -> dispatcher_pb.DatasetParameters:
    """Dataset parameters the dispatcher accepts: 10 shards of 100 records."""
    return dispatcher_pb.DatasetParameters(
        record_count=1000,
        batch_size=10,
        shard_batches=10,
        epochs=1,
        seed=7,
        kind=shard_pb2.SHARDING_KIND_INDEX_RANGE,
    )


def valid_header() -> ckpt_pb.CheckpointHeader:
    """The header of a 4-byte, one-tensor checkpoint."""
    return ckpt_pb.CheckpointHeader(
        checkpoint_id=CHECKPOINT,
        step=1,
        size_bytes=len(CHECKPOINT_DATA),
        tensors=[
            ckpt_pb.TensorEntry(
                name="w", dtype="float32", shape=[1], offset=0, length=len(CHECKPOINT_DATA)
            )
        ],
        crc32c=checksum(CHECKPOINT_DATA),
        shard_index=0,
        shard_count=1,
    )


def valid_algorithm_request() -> optimization_pb2.AlgorithmRequest:
    """A cold-start plan request the executor runs."""
    features = {
        "model_name": "wide-and-deep",
        "record_count": 100_000,
        "batch_size": 512,
        "max_epochs": 2,
        "embedding_dim": 8,
    }
    return optimization_pb2.AlgorithmRequest(
        request_id="fuzz",
        algorithm="cold-start-plan",
        job_id=JOB,
        arguments=dict_to_struct({"features": features}),
    )


def valid_profile() -> Message:
    """A CPU job's scaling profile: one point, both roles sized."""
    return job_pb2.ScalingProfile(
        kind=job_pb2.RESOURCE_KIND_CPU,
        points=[job_pb2.ProfilePoint(workers=1, ps=1, steps_per_second=10.0)],
        worker_cpu=1.0,
        worker_memory_bytes=2 * 1024**3,
        ps_cpu=1.0,
        ps_memory_bytes=2 * 1024**3,
    )


VALID_MESSAGES: dict[str, Callable[[], Message]] = {
    "stride.events.v1.JobSpec": valid_spec,
    "stride.events.v1.ScalingProfile": valid_profile,
    "stride.api.dispatcher.v1.DatasetParameters": valid_parameters,
    "stride.api.ckptcache.v1.CheckpointHeader": valid_header,
    "stride.events.v1.AlgorithmRequest": valid_algorithm_request,
}
"""Messages whose generic filling would be refused outright; extremes start from these."""

TIMESTAMP = "google.protobuf.Timestamp"
DURATION = "google.protobuf.Duration"
STRUCT = "google.protobuf.Struct"
WELL_KNOWN_LEAVES = frozenset({TIMESTAMP, DURATION, STRUCT})
"""Judged as one field: their parts are not fields a user names."""


def _enum_numbers(field_: FieldDescriptor) -> list[int]:
    enum: EnumDescriptor | None = field_.enum_type
    assert enum is not None, field_.full_name
    return [value.number for value in enum.values]


def _entry_fields(field_: FieldDescriptor) -> tuple[FieldDescriptor, FieldDescriptor]:
    """The key and value fields of a map field."""
    entry: Descriptor | None = field_.message_type
    assert entry is not None, field_.full_name
    return entry.fields_by_name["key"], entry.fields_by_name["value"]


def _first_enum_value(field_: FieldDescriptor) -> int:
    numbers = [number for number in _enum_numbers(field_) if number != 0]
    return numbers[0] if numbers else 0


def _is_map(field_: FieldDescriptor) -> bool:
    return bool(field_.message_type is not None and field_.message_type.GetOptions().map_entry)


def _is_repeated(field_: FieldDescriptor) -> bool:
    return bool(field_.is_repeated)


def _real_oneof(field_: FieldDescriptor) -> bool:
    oneof = field_.containing_oneof
    # proto3 ``optional`` is a synthetic one-field oneof named after the field.
    return oneof is not None and not (len(oneof.fields) == 1 and oneof.name == f"_{field_.name}")


def _plain_value(field_: FieldDescriptor, words: dict[str, Any]) -> Any:
    if field_.name in words:
        return words[field_.name]
    if field_.type == FieldDescriptor.TYPE_STRING:
        return "fuzz"
    if field_.type == FieldDescriptor.TYPE_BYTES:
        return b"fuzz"
    if field_.type == FieldDescriptor.TYPE_BOOL:
        return False
    if field_.type in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return 1.0
    if field_.type == FieldDescriptor.TYPE_ENUM:
        return _first_enum_value(field_)
    return 1


def filled(descriptor: Descriptor, words: dict[str, Any], depth: int = 0) -> Message:
    """A plausible request: known-good messages where there are some, else every field set
    to a plain value (ids of things that exist, by field name), the first of each oneof."""
    make_valid = VALID_MESSAGES.get(descriptor.full_name)
    if make_valid is not None:
        return make_valid()
    message = message_class(descriptor)()
    if descriptor.full_name == TIMESTAMP:
        message.FromDatetime(datetime.now(UTC) + timedelta(days=1))  # type: ignore[attr-defined]
        return message
    if descriptor.full_name == DURATION:
        message.FromTimedelta(timedelta(seconds=1))  # type: ignore[attr-defined]
        return message
    if descriptor.full_name == STRUCT or depth > 4:
        return message
    for field_ in descriptor.fields:
        oneof = field_.containing_oneof
        if oneof is not None and _real_oneof(field_) and field_ is not oneof.fields[0]:
            continue
        container = getattr(message, field_.name)
        if _is_map(field_):
            _, value_field = _entry_fields(field_)
            if value_field.message_type is None:
                container["key"] = _plain_value(value_field, words)
        elif field_.message_type is not None:
            element = filled(field_.message_type, words, depth + 1)
            if _is_repeated(field_):
                container.add().CopyFrom(element)
            else:
                container.CopyFrom(element)
        elif _is_repeated(field_):
            container.append(_plain_value(field_, words))
        else:
            setattr(message, field_.name, _plain_value(field_, words))
    return message


# --- extremes ------------------------------------------------------------------------------

INT64 = (2**63 - 1, -(2**63), -1, 0)
INT32 = (2**31 - 1, -(2**31), -1, 0)
UINT64 = (2**64 - 1, 0)
UINT32 = (2**32 - 1, 0)
DOUBLES = (math.nan, math.inf, -math.inf, -1.0, 0.0, 1e308)
FLOATS = (math.nan, math.inf, -math.inf, -1.0, 3.4e38)
STRINGS = ("", "x" * 100_000, "\x00", "a\x00b", "é\u202e😀\ufffe", "../..")
BYTES = (b"", bytes(range(256)) * 400)
TIMESTAMPS = (
    ("year 9999", 253_402_300_799, 999_999_999),
    ("year 0001", -62_135_596_800, 0),
    ("year 10000", 253_402_300_800, 0),
    ("before year 0001", -62_135_596_801, 0),
    ("negative nanos", 1_700_000_000, -1),
    ("nanos 1e9", 1_700_000_000, 1_000_000_000),
    ("int64 max seconds", 2**63 - 1, 0),
    ("int64 min seconds", -(2**63), 0),
)
DURATIONS = (
    ("10000 years", 315_576_000_000, 0),
    ("over 10000 years", 315_576_000_001, 0),
    ("negative", -1, 0),
    ("negative nanos", 0, -1),
    ("nanos 1e9", 0, 1_000_000_000),
    ("mixed signs", 1, -1),
    ("int64 max seconds", 2**63 - 1, 0),
)
STRUCT_VALUES: tuple[tuple[str, Any], ...] = (
    ("NaN", math.nan),
    ("inf", math.inf),
    ("-inf", -math.inf),
    ("-1", -1),
    ("1e300", 1e300),
    ("2**70", float(2**70)),
    ("0.5", 0.5),
    ("empty string", ""),
    ("100k string", "x" * 100_000),
    ("null", None),
    ("true", True),
    ("empty list", []),
    ("empty struct", {}),
    ("list of 10000", [1] * 10_000),
)
MANY = 10_000
MANY_MESSAGES = 1_000


def _scalar_extremes(field_: FieldDescriptor) -> Sequence[Any]:
    kind = field_.type
    if kind in (
        FieldDescriptor.TYPE_INT64,
        FieldDescriptor.TYPE_SINT64,
        FieldDescriptor.TYPE_SFIXED64,
    ):
        return INT64
    if kind in (
        FieldDescriptor.TYPE_INT32,
        FieldDescriptor.TYPE_SINT32,
        FieldDescriptor.TYPE_SFIXED32,
    ):
        return INT32
    if kind in (FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_FIXED64):
        return UINT64
    if kind in (FieldDescriptor.TYPE_UINT32, FieldDescriptor.TYPE_FIXED32):
        return UINT32
    if kind == FieldDescriptor.TYPE_DOUBLE:
        return DOUBLES
    if kind == FieldDescriptor.TYPE_FLOAT:
        return FLOATS
    if kind == FieldDescriptor.TYPE_STRING:
        return STRINGS
    if kind == FieldDescriptor.TYPE_BYTES:
        return BYTES
    if kind == FieldDescriptor.TYPE_BOOL:
        return (True, False)
    if kind == FieldDescriptor.TYPE_ENUM:
        return (max(_enum_numbers(field_)) + 1, 999, -1, 0)
    raise AssertionError(f"no extremes for field type {kind} of {field_.full_name}")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:30]}...({len(text)} chars)"


Edit = Callable[[Message], None]
Locate = Callable[[Message], Message]


@dataclass(frozen=True)
class Case:
    """One bad request: what was changed, the field a refusal must name, the bytes sent."""

    label: str
    field: str
    payload: bytes
    related: frozenset[str] = frozenset()
    """Other fields a refusal may name instead: those beside ``field`` (a rule across
    fields) and, for a message field, its own fields."""


def _set_scalar(name: str, value: Any) -> Edit:
    def edit(message: Message) -> None:
        setattr(message, name, value)

    return edit


def _set_repeated(name: str, values: Sequence[Any]) -> Edit:
    def edit(message: Message) -> None:
        container = getattr(message, name)
        del container[:]
        container.extend(values)

    return edit


def _set_time(name: str, seconds: int, nanos: int) -> Edit:
    def edit(message: Message) -> None:
        value = getattr(message, name)
        value.seconds = seconds
        value.nanos = nanos

    return edit


def _clear(name: str) -> Edit:
    def edit(message: Message) -> None:
        message.ClearField(name)

    return edit


def _empty(name: str) -> Edit:
    def edit(message: Message) -> None:
        message.ClearField(name)
        getattr(message, name).SetInParent()

    return edit


def _many_messages(name: str) -> Edit:
    def edit(message: Message) -> None:
        container = getattr(message, name)
        element = clone(container[0]) if len(container) else None
        del container[:]
        for _ in range(MANY_MESSAGES):
            added = container.add()
            if element is not None:
                added.CopyFrom(element)

    return edit


def _set_map(name: str, entries: dict[str, str]) -> Edit:
    def edit(message: Message) -> None:
        container = getattr(message, name)
        container.clear()
        container.update(entries)

    return edit


def _struct_edits(name: str, sample: Message) -> Iterator[tuple[str, str, Edit]]:
    """Edits of a Struct field: each top-level key's value replaced by an extreme (nested
    structs followed), whole odd structs, keyed by the path and leaf a refusal names."""

    def replace(keys: tuple[str, ...], value: Any) -> Edit:
        def edit(message: Message) -> None:
            struct = getattr(message, name)
            for key in keys[:-1]:
                struct = struct[key]
            struct[keys[-1]] = value

        return edit

    def walk(struct: Any, keys: tuple[str, ...]) -> Iterator[tuple[str, str, Edit]]:
        for key in list(struct.keys()):
            path = (*keys, key)
            inner = struct[key]
            for label, value in STRUCT_VALUES:
                yield f"{'.'.join(path)} = {label}", key, replace(path, value)
            if hasattr(inner, "keys"):
                yield from walk(inner, path)

    def nested(message: Message) -> None:
        struct = getattr(message, name)
        # Deep, yet within protobuf's nesting limit of 100 (three levels per struct), so
        # it reaches the service rather than failing to decode.
        for _ in range(30):
            struct = struct.get_or_create_struct("deeper")

    def many_keys(message: Message) -> None:
        getattr(message, name).update({f"key{index}": index for index in range(MANY)})

    yield from walk(getattr(sample, name), ())
    yield "30 nested structs", name, nested
    yield f"{MANY} keys", name, many_keys
    yield "NaN under an unknown key", name, replace(("unknown",), math.nan)


def _field_edits(field_: FieldDescriptor, sample: Message) -> Iterator[tuple[str, str, Edit]]:
    """(what, leaf field name, edit) for one field of ``sample``."""
    name = field_.name
    sub = field_.message_type
    if _is_map(field_):
        yield f"{MANY} entries", name, _set_map(name, {f"k{i}": "v" for i in range(MANY)})
        for text in STRINGS:
            yield f"key and value {_short(text)}", name, _set_map(name, {text or "": text})
        return
    if _is_repeated(field_):
        if sub is not None:
            yield f"{MANY_MESSAGES} elements", name, _many_messages(name)
            yield "one empty element", name, _set_repeated(name, [message_class(sub)()])
            return
        extremes = _scalar_extremes(field_)
        yield f"{MANY} elements", name, _set_repeated(name, [extremes[0]] * MANY)
        for value in extremes:
            yield f"[{_short(value)}]", name, _set_repeated(name, [value])
        return
    if sub is not None:
        if sub.full_name == TIMESTAMP:
            for label, seconds, nanos in TIMESTAMPS:
                yield label, name, _set_time(name, seconds, nanos)
        elif sub.full_name == DURATION:
            for label, seconds, nanos in DURATIONS:
                yield label, name, _set_time(name, seconds, nanos)
        elif sub.full_name == STRUCT:
            yield from _struct_edits(name, sample)
        yield "unset", name, _clear(name)
        if sub.full_name != STRUCT:
            yield "empty", name, _empty(name)
        return
    for value in _scalar_extremes(field_):
        yield _short(value), name, _set_scalar(name, value)
    if field_.has_presence:
        yield "unset", name, _clear(name)


def _child(locate: Locate, field_: FieldDescriptor) -> Locate:
    def child(root: Message) -> Message:
        container = getattr(locate(root), field_.name)
        if _is_repeated(field_):
            return container[0] if len(container) else container.add()  # type: ignore[no-any-return]
        return container  # type: ignore[no-any-return]

    return child


def extreme_cases(root: Message, words: dict[str, Any]) -> Iterator[Case]:
    """One case per field and extreme, nested messages included, each on a copy of ``root``.

    A nested message that ``root`` leaves unset (another member of a oneof, say) is first
    filled like a valid one, so its fields' extremes are judged on their own.
    """
    seen: set[bytes] = {root.SerializeToString()}

    def walk(
        base: Message, locate: Locate, descriptor: Descriptor, prefix: str, depth: int
    ) -> Iterator[Case]:
        sample = locate(clone(base))
        siblings = frozenset(field_.name for field_ in descriptor.fields) | frozenset(
            oneof.name for oneof in descriptor.oneofs
        )
        for field_ in descriptor.fields:
            path = f"{prefix}{field_.name}"
            sub = field_.message_type
            # A rule across fields may name a sibling; emptying a message, one of its fields.
            accepted = siblings | (field_names(sub) if sub is not None else frozenset())
            for what, leaf, edit in _field_edits(field_, sample):
                copy = clone(base)
                edit(locate(copy))
                payload = copy.SerializeToString()
                if payload in seen:
                    continue
                seen.add(payload)
                label = f"{path}: {what}" if leaf == field_.name else f"{path}.{what}"
                yield Case(label, leaf, payload, accepted)
            if sub is None or _is_map(field_) or sub.full_name in WELL_KNOWN_LEAVES or depth >= 4:
                continue
            child = _child(locate, field_)
            inner_base = base
            if not _is_repeated(field_) and not sample.HasField(field_.name):
                inner_base = clone(base)
                child(inner_base).CopyFrom(filled(sub, words))
            yield from walk(inner_base, child, sub, f"{path}.", depth + 1)

    descriptor: Descriptor = root.DESCRIPTOR  # type: ignore[assignment]
    yield from walk(root, lambda message: message, descriptor, "", 0)


def field_names(descriptor: Descriptor) -> frozenset[str]:
    """Every field and oneof name a message and its nested messages have."""
    names: set[str] = set()
    pending = [descriptor]
    visited: set[str] = set()
    while pending:
        current = pending.pop()
        if current.full_name in visited:
            continue
        visited.add(current.full_name)
        names.update(oneof.name for oneof in current.oneofs)
        for field_ in current.fields:
            names.add(field_.name)
            if field_.message_type is not None:
                pending.append(field_.message_type)
    return frozenset(names)


# --- judging an answer ---------------------------------------------------------------------

_FIELD_PREFIX = re.compile(r"^([A-Za-z_][\w.\[\]\-\"'? ]*?):\s")
"""A field path; ``?`` stands for an unprintable character of a caller's key."""


def names_a_field(details: str, names: frozenset[str]) -> bool:
    """Whether ``details`` starts with a field path of the request (``spec.batch_size: ...``,
    ``chunk.header.job_id: ...``) or the metadata key it concerns."""
    match = _FIELD_PREFIX.match(details)
    if match is None:
        return False
    prefix = match.group(1)
    if prefix.startswith("metadata "):
        return True
    parts = [part for part in re.split(r"[.\[\]\s]+", prefix) if part]
    return any(part in names for part in parts)


def _embedded_statuses(
    method: MethodDescriptor, responses: list[bytes]
) -> Iterator[tuple[int, str]]:
    """(code, message) of in-band errors (the dispatcher's SessionError) in the responses."""
    response_class = message_class(method.output_type)
    for raw in responses:
        response = response_class.FromString(raw)
        for field_, value in response.ListFields():
            sub = field_.message_type
            if sub is None or _is_repeated(field_):
                continue
            if {"code", "message"} <= set(sub.fields_by_name):
                yield int(value.code), str(value.message)


def judge(method: MethodDescriptor, outcome: Outcome, case: Case, strict_field: bool) -> str | None:
    """What is wrong with ``outcome`` as an answer to ``case``, or None."""
    names = field_names(method.input_type)
    answers = [(outcome.code, outcome.details)]
    answers += [
        (_status_code(code), message)
        for code, message in _embedded_statuses(method, outcome.responses)
    ]
    for code, details in answers:
        if code in NEVER:
            return f"{case.label}: {code.name} {details[:300]!r}"
        if "metadata size exceeds" in details:
            # The status did not reach the client: its message outgrew the trailer.
            return f"{case.label}: the status message was too long to send: {details!r}"
        if len(details.encode()) > MAX_STATUS_MESSAGE_BYTES:
            return f"{case.label}: a {len(details):,}-character status message"
        if code == grpc.StatusCode.DEADLINE_EXCEEDED and not method.server_streaming:
            return f"{case.label}: no answer within {UNARY_TIMEOUT:g}s"
        if code not in NAMING:
            continue
        if strict_field and case.field:
            if case.field not in details and not names_a_field(details, case.related):
                return f"{case.label}: {code.name} does not name {case.field}: {details[:300]!r}"
        elif not names_a_field(details, names):
            return f"{case.label}: {code.name} does not name the field: {details[:300]!r}"
    return None


def _status_code(number: int) -> grpc.StatusCode:
    for code in grpc.StatusCode:
        if code.value[0] == number:
            return code
    return grpc.StatusCode.UNKNOWN


# --- the tests -----------------------------------------------------------------------------


@pytest.mark.parametrize("method", METHODS, ids=method_id)
def test_undecodable_requests_are_invalid_argument_naming_the_method(
    suite: Suite, method: MethodDescriptor
) -> None:
    words = suite.words[service_key(method.containing_service)]
    baseline = filled(method.input_type, words)
    cases = [Case("bytes that are no protobuf", "", b"\xff\xff\xff\xff\x0f\x01")]
    cases.append(Case("a truncated field", "", b"\x0a\x05ab"))
    # Invalid UTF-8 in each string field (protobuf refuses it while decoding): the field
    # is set to a placeholder whose bytes are then replaced by as many invalid ones.
    placeholder = "\ue000"
    for path, locate, field_ in _string_fields(baseline):
        copy = clone(baseline)
        setattr(locate(copy), field_.name, placeholder)
        payload = copy.SerializeToString().replace(placeholder.encode(), b"\xff\xfe\xfd")
        cases.append(Case(f"{path}: invalid UTF-8", "", payload))
    failures = []
    for case in cases:
        outcome = suite.call(method, case.payload)
        if outcome.code != grpc.StatusCode.INVALID_ARGUMENT or not (
            method_path(method) in outcome.details and "could not be decoded" in outcome.details
        ):
            failures.append(f"{case.label}: {outcome.code.name} {outcome.details[:300]!r}")
    assert not failures, "\n".join(failures)


def _string_fields(root: Message) -> Iterator[tuple[str, Locate, FieldDescriptor]]:
    def walk(
        locate: Locate, descriptor: Descriptor, prefix: str, depth: int
    ) -> Iterator[tuple[str, Locate, FieldDescriptor]]:
        for field_ in descriptor.fields:
            if _is_repeated(field_) or _is_map(field_):
                continue
            if field_.type == FieldDescriptor.TYPE_STRING:
                yield f"{prefix}{field_.name}", locate, field_
            sub = field_.message_type
            if sub is not None and sub.full_name not in WELL_KNOWN_LEAVES and depth < 4:
                yield from walk(_child(locate, field_), sub, f"{prefix}{field_.name}.", depth + 1)

    descriptor: Descriptor = root.DESCRIPTOR  # type: ignore[assignment]
    yield from walk(lambda message: message, descriptor, "", 0)


@pytest.mark.parametrize("method", METHODS, ids=method_id)
def test_extreme_field_values_get_a_deliberate_status_naming_the_field(
    suite: Suite, method: MethodDescriptor
) -> None:
    words = suite.words[service_key(method.containing_service)]
    baseline = filled(method.input_type, words)
    base_outcome = suite.call(method, baseline.SerializeToString())
    # When the valid request is accepted, a refusal of a one-field change must name that
    # field; when it is refused anyway, naming any field of the request is all one can ask.
    strict = base_outcome.code not in NAMING
    empty = Case("the empty request", "", b"")
    unknown = Case(
        "an unknown field (number 1999)", "", baseline.SerializeToString() + b"\xf8\x7c\x01"
    )
    failures = []
    for case in [empty, unknown, *extreme_cases(baseline, words)]:
        problem = judge(method, suite.call(method, case.payload), case, strict)
        if problem is not None:
            failures.append(problem)
    assert not failures, f"{len(failures)} bad answers:\n" + "\n".join(failures)


# --- hypothesis ----------------------------------------------------------------------------

_INTEGER_RANGES = {
    FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SINT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SINT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_ENUM: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1),
    FieldDescriptor.TYPE_FIXED64: (0, 2**64 - 1),
    FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_FIXED32: (0, 2**32 - 1),
}


def _scalar_strategy(field_: FieldDescriptor, words: dict[str, Any]) -> st.SearchStrategy[Any]:
    kind = field_.type
    plain = st.just(_plain_value(field_, words))
    if kind in _INTEGER_RANGES:
        low, high = _INTEGER_RANGES[kind]
        if kind == FieldDescriptor.TYPE_ENUM:
            defined = st.sampled_from(_enum_numbers(field_))
            return defined | st.integers(low, high)
        return plain | st.sampled_from(_scalar_extremes(field_)) | st.integers(low, high)
    if kind == FieldDescriptor.TYPE_DOUBLE:
        return plain | st.floats()
    if kind == FieldDescriptor.TYPE_FLOAT:
        return plain | st.floats(width=32)
    if kind == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if kind == FieldDescriptor.TYPE_STRING:
        return plain | st.sampled_from(STRINGS[:1] + STRINGS[2:]) | st.text(max_size=40)
    if kind == FieldDescriptor.TYPE_BYTES:
        return plain | st.binary(max_size=64)
    raise AssertionError(f"no strategy for field type {kind} of {field_.full_name}")


def _build(descriptor: Descriptor, values: dict[str, Any]) -> Message:
    message = message_class(descriptor)()
    for name, value in values.items():
        field_ = descriptor.fields_by_name[name]
        container = getattr(message, name)
        if _is_map(field_):
            for key, item in value.items():
                if isinstance(item, Message):
                    container[key].CopyFrom(item)
                else:
                    container[key] = item
        elif _is_repeated(field_):
            container.extend(value)
        elif isinstance(value, Message):
            container.CopyFrom(value)
        else:
            setattr(message, name, value)
    return message


def message_strategy(
    descriptor: Descriptor, words: dict[str, Any], depth: int = 0
) -> st.SearchStrategy[Message]:
    """Messages of ``descriptor``'s type with any subset of fields set to any value."""
    cls = message_class(descriptor)
    if descriptor.full_name in (TIMESTAMP, DURATION):
        return st.builds(
            lambda seconds, nanos: cls(seconds=seconds, nanos=nanos),
            st.integers(-(2**63), 2**63 - 1) | st.integers(-62_135_596_900, 253_402_300_900),
            st.integers(-(2**31), 2**31 - 1) | st.integers(-2, 1_000_000_001),
        )
    if depth > 3:
        return st.just(cls())
    optional: dict[str, st.SearchStrategy[Any]] = {}
    for field_ in descriptor.fields:
        if _is_map(field_):
            key_field, value_field = _entry_fields(field_)
            optional[field_.name] = st.dictionaries(
                _field_strategy(key_field, words, depth + 1),
                _field_strategy(value_field, words, depth + 1),
                max_size=3,
            )
        elif _is_repeated(field_):
            optional[field_.name] = st.lists(_field_strategy(field_, words, depth + 1), max_size=3)
        else:
            optional[field_.name] = _field_strategy(field_, words, depth + 1)
    return st.fixed_dictionaries({}, optional=optional).map(
        lambda values: _build(descriptor, values)
    )


def _field_strategy(
    field_: FieldDescriptor, words: dict[str, Any], depth: int
) -> st.SearchStrategy[Any]:
    if field_.message_type is not None:
        return message_strategy(field_.message_type, words, depth)
    return _scalar_strategy(field_, words)


def _merged(baseline: Message, change: Message) -> Message:
    merged = clone(baseline)
    merged.MergeFrom(change)
    return merged


# The services run on another thread and draw span ids from the global ``random``
# (OpenTelemetry's id generator) while hypothesis draws here; it takes that for a strategy
# using ``random`` and warns. The strategies below use none.
def examples_for(method: MethodDescriptor) -> int:
    """How many generated requests ``method`` gets (see :data:`FUZZ_CASES_ENV`)."""
    per_service = int(os.environ.get(FUZZ_CASES_ENV, "0") or 0)
    if per_service <= 0:
        return HYPOTHESIS_EXAMPLES
    key = service_key(method.containing_service)
    siblings = sum(1 for other in METHODS if service_key(other.containing_service) == key)
    return max(1, math.ceil(per_service / siblings))


@pytest.mark.filterwarnings("ignore:Do not use the `random` module inside strategies")
@pytest.mark.parametrize("method", METHODS, ids=method_id)
def test_generated_requests_get_a_deliberate_status(suite: Suite, method: MethodDescriptor) -> None:
    """Generated requests: a deliberate status for each, and the service still SERVING."""
    words = suite.words[service_key(method.containing_service)]
    baseline = filled(method.input_type, words)
    generated = message_strategy(method.input_type, words)

    @settings(
        max_examples=examples_for(method),
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(request=generated | generated.map(lambda change: _merged(baseline, change)))
    def answered(request: Message) -> None:
        case = Case("generated request", "", request.SerializeToString())
        problem = judge(method, suite.call(method, case.payload), case, strict_field=False)
        assert problem is None, problem

    answered()
    assert suite.serving(method), f"{method_id(method)}: its service is no longer SERVING"


# --- message size limits -------------------------------------------------------------------


def test_each_server_applies_its_services_message_limits(suite: Suite) -> None:
    for key, host in suite.hosts.items():
        configured = suite.settings[key]
        assert host.server.max_receive_message_bytes == configured.grpc_max_receive_message_bytes
        assert host.server.max_send_message_bytes == configured.grpc_max_send_message_bytes
    assert suite.settings["optimizer"].grpc_max_receive_message_bytes == 1 * MIB
    assert suite.settings["ckptcache"].grpc_max_receive_message_bytes == 16 * MIB


def test_a_request_over_the_servers_limit_is_resource_exhausted(suite: Suite) -> None:
    method = method_named("executor.RunAlgorithm")  # its own limit is the server's
    limit = suite.settings["executor"].grpc_max_receive_message_bytes
    assert request_limit(method_path(method)) == limit
    baseline = filled(method.input_type, suite.words["executor"]).SerializeToString()
    outcome = suite.call(method, padded(baseline, limit + 16))
    assert outcome.code == grpc.StatusCode.RESOURCE_EXHAUSTED, outcome
    assert "larger than max" in outcome.details, outcome.details


def padded(payload: bytes, size: int) -> bytes:
    """``payload`` with an unknown length-delimited field (number 999, which no request
    uses: decoders keep it aside) that makes it exactly ``size`` bytes."""

    def varint(value: int) -> bytes:
        out = bytearray()
        while True:
            byte, value = value & 0x7F, value >> 7
            out.append(byte | (0x80 if value else 0))
            if not value:
                return bytes(out)

    key = varint((999 << 3) | 2)
    length = max(0, size - len(payload) - len(key) - 1)
    while len(payload) + len(key) + len(varint(length)) + length > size and length:
        length -= 1
    result = payload + key + varint(length) + b"x" * length
    assert len(result) == size, (len(result), size)
    return result


@pytest.mark.parametrize("method", METHODS, ids=method_id)
def test_each_method_applies_its_own_request_limit(suite: Suite, method: MethodDescriptor) -> None:
    """Every method's limit is its proto's ``max_request_bytes`` (64 KiB unset): a request
    one byte over it is RESOURCE_EXHAUSTED naming the method and the limit, before it is
    decoded; one at the limit is not refused for its size."""
    key = service_key(method.containing_service)
    limit = request_limit(method_path(method))
    assert limit is not None
    server = suite.max_receive_bytes(key)
    assert limit <= server, f"{method.full_name}: {limit:,} is over its server's {server:,}"
    if limit == server:
        return  # the server's own limit answers first (the test above)
    baseline = filled(method.input_type, suite.words[key]).SerializeToString()
    over = suite.call(method, padded(baseline, limit + 1))
    assert over.code == grpc.StatusCode.RESOURCE_EXHAUSTED, over
    assert over.details == (
        f"{method_path(method)}: the request is {limit + 1:,} bytes, over the method's limit "
        f"of {limit:,} (max_request_bytes in its proto)"
    )
    at = suite.call(method, padded(baseline, limit))
    assert at.code != grpc.StatusCode.RESOURCE_EXHAUSTED or "over the method" not in at.details


# --- after the fuzz: nothing lost ----------------------------------------------------------


def test_after_everything_above_every_job_is_decided_and_no_shard_is_lost(suite: Suite) -> None:
    """Runs last in this module: whatever the requests above did, every stored job has its
    decision, every service still answers SERVING, and the populated dataset's shards of
    the current epoch are all accounted for (waiting, leased or done; or none yet, before
    the epoch is cut)."""
    for method in METHODS:
        assert suite.serving(method), method_id(method)
    listed = admission_pb.ListJobsResponse.FromString(
        _unary(suite, "admission.ListJobs", admission_pb.ListJobsRequest(page_size=1000))
    )
    assert listed.jobs
    for job in listed.jobs:
        assert job.state != admission_pb.JOB_STATE_SUBMITTED, job.job_id
        assert job.decision.outcome != job_pb2.ADMISSION_OUTCOME_UNSPECIFIED, job.job_id
    state = dispatcher_pb.GetDatasetStateResponse.FromString(
        _unary(
            suite,
            "dispatcher.GetDatasetState",
            dispatcher_pb.GetDatasetStateRequest(job_id=JOB, dataset=DATASET),
        )
    )
    parameters = valid_parameters()
    shards = math.ceil(parameters.record_count / (parameters.batch_size * parameters.shard_batches))
    accounted = state.todo + state.doing + state.done
    # An epoch is cut on its first GetShard: a dataset the requests above rewound shows no
    # shards until then, and none was handed out.
    assert state.finished or accounted in (0, shards), state
