"""A data worker pod's trainer process (GoldMiner sec. 3.3): the job's stateless
pre-processing, served to its chief as whole ready mini-batches.

The job's entrypoint runs here as in the chief: it calls :meth:`TrainingContext.fit` with
its ``build_model`` and ``make_batch``, and in a data worker that call serves instead of
training. The model is built once to find its data half (GoldMiner's state-aware
partitioning, :func:`stride.trainer.partition.split_model`); the half holds no weights, so
nothing here is ever trained or saved.

Each ``StreamBatches`` call fetches index batches with step ids from the dispatcher
through the pod's agent (the agent names this pod as the data worker: the dispatcher's
leases are this pod's), makes each mini-batch and streams it. Which steps exist, which were
consumed and which must be made again lives at the dispatcher, never here: a data worker
that dies loses nothing but time (its leased steps time out and go to another), and one
that is relaunched starts empty.

Why not the tf.data service's own workers: see the dispatcher's README ("Why not the
tf.data service's own dispatching"): a SIGKILLed tf.data worker loses its samples.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import numpy as np
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from stride.api.dataworker.v1 import dataworker_service_pb2 as pb
from stride.runtime.grpc_server import (
    DEFAULT_MAX_MESSAGE_BYTES,
    RefusedRequest,
    request_limit,
    tolerant_deserializer,
)
from stride.trainer.agent_client import AgentClient
from stride.trainer.batches import BatchError, Producer, to_wire
from stride.vocabulary import echo

DEFAULT_PREFETCH = 4
MAX_PREFETCH = 64
IDLE_POLL_SECONDS = 0.2
"""While every step is dispatched but not all are consumed, how often to ask again (a step
another data worker held may time out and come here)."""
SERVER_THREADS = 8
SERVICE_NAME = pb.DESCRIPTOR.services_by_name["DataWorkerService"].full_name


class DataWorkerApi:
    """Serves one job's ready mini-batches (see the module docstring)."""

    def __init__(self, job_id: str, agent: AgentClient, producer: Producer) -> None:
        self.job_id = job_id
        self.agent = agent
        self.producer = producer
        self.streams = 0
        self.produced = 0

    def StreamBatches(
        self, request: pb.StreamBatchesRequest | RefusedRequest, context: grpc.ServicerContext
    ) -> Iterator[pb.StreamBatchesResponse]:
        request, prefetch = self._checked(request, context)
        self.streams += 1
        try:
            while context.is_active():
                try:
                    reply = self.agent.fetch_batches(request.dataset, prefetch)
                except grpc.RpcError as error:  # the dispatcher's answer, through the agent
                    context.abort(error.code(), error.details() or "")
                for batch in reply.batches:
                    indices = np.asarray(batch.indices, dtype=np.int64)
                    try:
                        ready = to_wire(self.producer.produce(batch.step_id, batch.epoch, indices))
                    except BatchError as error:
                        context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(error))
                    self.produced += 1
                    yield pb.StreamBatchesResponse(batch=ready)
                if not reply.batches:
                    if reply.end_of_data:
                        return
                    time.sleep(IDLE_POLL_SECONDS)
        finally:
            self.streams -= 1

    def _checked(
        self, request: pb.StreamBatchesRequest | RefusedRequest, context: grpc.ServicerContext
    ) -> tuple[pb.StreamBatchesRequest, int]:
        """The request, once valid, and its prefetch; aborts the call otherwise."""
        if isinstance(request, RefusedRequest):
            context.abort(request.code, request.message)
        assert isinstance(request, pb.StreamBatchesRequest)  # abort raised for the others
        if request.job_id != self.job_id:
            context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                f"job_id: this data worker serves job {self.job_id!r}, not {echo(request.job_id)}",
            )
        if not request.dataset:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "dataset: is required")
        prefetch = request.prefetch or DEFAULT_PREFETCH
        if not 1 <= prefetch <= MAX_PREFETCH:
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"prefetch: must be between 1 and {MAX_PREFETCH} (0: {DEFAULT_PREFETCH}), "
                f"got {request.prefetch}",
            )
        return request, prefetch


class DataWorkerServer:
    """The data worker's gRPC server on the pod's port: StreamBatches and health.

    A request that does not decode, or is over the method's ``max_request_bytes``, is
    refused naming the method (the deserializer of :mod:`stride.runtime.grpc_server`, as
    every Stride server does), never answered INTERNAL.
    """

    MAX_RECEIVE_BYTES = DEFAULT_MAX_MESSAGE_BYTES

    def __init__(self, api: DataWorkerApi, port: int) -> None:
        self.api = api
        path = f"/{SERVICE_NAME}/StreamBatches"
        handler = grpc.unary_stream_rpc_method_handler(
            api.StreamBatches,
            request_deserializer=tolerant_deserializer(
                pb.StreamBatchesRequest.FromString, path, request_limit(path)
            ),
            response_serializer=pb.StreamBatchesResponse.SerializeToString,
        )
        self.server = grpc.server(
            futures.ThreadPoolExecutor(
                max_workers=SERVER_THREADS, thread_name_prefix="stride-data"
            ),
            handlers=[
                grpc.method_handlers_generic_handler(SERVICE_NAME, {"StreamBatches": handler})
            ],
            options=[
                ("grpc.max_send_message_length", 64 * 1024 * 1024),
                ("grpc.max_receive_message_length", self.MAX_RECEIVE_BYTES),
            ],
        )
        self.health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        # Every interface, as TensorFlow's servers bind: the pod's port is guarded per job.
        self.port = self.server.add_insecure_port(f"[::]:{port}")

    def start(self) -> None:
        self.server.start()
        for name in ("", SERVICE_NAME):
            self.health.set(name, health_pb2.HealthCheckResponse.SERVING)

    def stop(self, grace: float = 2.0) -> None:
        self.server.stop(grace).wait()


def serve_batches(job_id: str, port: int, agent: AgentClient, producer: Producer, say: Any) -> int:
    """Serve on ``port`` until SIGTERM (or SIGINT); returns the exit code."""
    stop = threading.Event()
    received: list[str] = []

    def stopping(number: int, _frame: Any) -> None:
        received.append(signal.Signals(number).name)
        stop.set()

    for number in (signal.SIGTERM, signal.SIGINT):
        signal.signal(number, stopping)
    api = DataWorkerApi(job_id, agent, producer)
    server = DataWorkerServer(api, port)
    server.start()
    say("data worker serving", port=server.port)
    while not stop.wait(1.0):
        continue
    say("data worker stopping", signal=received[0], produced=api.produced, streams=api.streams)
    server.stop()
    return 0
