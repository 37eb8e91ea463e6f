"""Calls to the shard dispatcher with retries, backoff and the worker's incarnation token.

Retrying is safe because every dispatcher call is idempotent or fenced: a progress report
keeps the highest offset, a repeated done is a no-op, and a GetShard whose answer was lost
leaves a lease behind that the dispatcher takes back when it lapses. A call that cannot
reach the dispatcher (it restarts, the network blips) is retried with exponential backoff
and jitter until ``RetryPolicy.give_up_after`` seconds have passed.

A FAILED_PRECONDITION answer means the dispatcher fenced this worker or took the shard
back (lease lapsed, worker marked lost, shards restored from a snapshot). The client then
registers again, which gives it a new incarnation, and reports :class:`Revoked` so the
caller drops what it held: those shards are someone else's now.

The hot calls (GetShard, ReportProgress, ReportShardDone, ReportShardFailed) travel over one
``ShardSession`` stream per client (:class:`_Session`): a call on an open stream costs one
message each way, without a new HTTP/2 stream, call setup and interceptor chain, which
halved the hand-out latency in ``bench/dispatcher_vs_dlrover.py``. The stream carries
several calls at once, so a prefetch (:meth:`ShardClient.get_shard_async`) overlaps the
call before it. A refused call comes back as a :class:`SessionCallError` with the code and
message the unary call would have had, so retries and fencing work as for unary calls;
if the stream breaks, every call on it fails UNAVAILABLE and is retried on a new stream.
``ShardClient(session=False)`` uses the unary calls instead.
"""

from __future__ import annotations

import queue
import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc
import structlog

from stride.api.dispatcher.v1 import dispatcher_service_pb2 as pb
from stride.api.dispatcher.v1 import dispatcher_service_pb2_grpc as pb_grpc
from stride.events.v1 import shard_pb2
from stride.runtime import tls
from stride.runtime.tokens import TokenSource

log = structlog.get_logger(__name__)

T = TypeVar("T")

MAX_SHARDS_PER_CALL = 64
"""Most shards one GetShard leases or reports done (the dispatcher's limit)."""
RETRYABLE = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.ABORTED,
    }
)
"""Codes that may say "not now" rather than "no": the dispatcher is restarting or busy (a
database lock, SQLite's or PostgreSQL's, is answered UNAVAILABLE), or rate-limits us. See
:func:`retryable` for RESOURCE_EXHAUSTED."""


def retryable(error: grpc.RpcError) -> bool:
    """Whether a failed call may succeed if made again. RESOURCE_EXHAUSTED is "not now" only
    from the rate limiter, which says when to retry ("retry in 0.120 s"); a quota (a job's
    datasets, ``max_datasets_per_job``) or a request over its size limit stays exhausted, and
    retrying it for two minutes only hid the error."""
    code = error.code()
    if code is grpc.StatusCode.RESOURCE_EXHAUSTED:
        return "retry in" in (error.details() or "")
    return code in RETRYABLE


CHANNEL_OPTIONS = (
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2000),
)
"""gRPC's own reconnect backoff starts at 1 s and grows to 2 minutes; a restarted
dispatcher is back in about a second, so reconnect quickly and never wait long."""


_CODES = {code.value[0]: code for code in grpc.StatusCode}


class SessionCallError(grpc.RpcError):
    """A call within a ShardSession that failed, shaped like a unary call's error."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self._code = code
        self._details = details

    def code(self) -> grpc.StatusCode:
        """The status the unary call would have ended with."""
        return self._code

    def details(self) -> str:
        """The dispatcher's message."""
        return self._details


class _Session:
    """One ShardSession stream, shared by the client's threads; reopened when it breaks.

    Requests go out through a queue the gRPC sender thread drains; a receiver thread
    matches each response to its request's future by sequence number.
    """

    def __init__(self, stub: pb_grpc.DispatcherServiceStub) -> None:
        self._stub = stub
        self._lock = threading.Lock()
        self._requests: queue.SimpleQueue[pb.ShardSessionRequest | None] | None = None
        self._call: Any = None
        self._pending: dict[int, Future[pb.ShardSessionResponse]] = {}
        self._sequence = 0
        self._closed = False

    def submit(self, **call: Any) -> Future[pb.ShardSessionResponse]:
        """Send one call (``get_shard=...``, ``done=...``, ...); its answer arrives later."""
        future: Future[pb.ShardSessionResponse] = Future()
        with self._lock:
            if self._closed:
                raise ClientClosed("the shard session was closed")
            if self._requests is None:
                self._open()
            assert self._requests is not None
            self._sequence += 1
            self._pending[self._sequence] = future
            self._requests.put(pb.ShardSessionRequest(sequence=self._sequence, **call))
        return future

    def call(self, timeout: float, **call: Any) -> pb.ShardSessionResponse:
        """Send one call and wait for its answer (raises its error)."""
        return self.wait(self.submit(**call), timeout)

    def wait(
        self, future: Future[pb.ShardSessionResponse], timeout: float
    ) -> pb.ShardSessionResponse:
        """The answer of a submitted call; a stream silent for ``timeout`` is abandoned."""
        try:
            return future.result(timeout)
        except FutureTimeout:
            self._abandon()
            raise SessionCallError(
                grpc.StatusCode.DEADLINE_EXCEEDED, f"no answer within {timeout:g} s"
            ) from None

    def close(self) -> None:
        """End the stream; calls still waiting fail UNAVAILABLE."""
        with self._lock:
            self._closed = True
        self._abandon()

    def _abandon(self) -> None:
        with self._lock:
            call = self._call
        if call is not None:
            call.cancel()  # the receiver fails what is pending and clears the stream

    def _open(self) -> None:
        requests: queue.SimpleQueue[pb.ShardSessionRequest | None] = queue.SimpleQueue()

        def outgoing() -> Iterator[pb.ShardSessionRequest]:
            while (request := requests.get()) is not None:
                yield request

        responses = self._stub.ShardSession(outgoing())
        self._requests, self._call = requests, responses
        threading.Thread(
            target=self._receive, args=(responses, requests), name="shard-session", daemon=True
        ).start()

    def _receive(
        self, responses: Any, requests: queue.SimpleQueue[pb.ShardSessionRequest | None]
    ) -> None:
        failure = SessionCallError(grpc.StatusCode.UNAVAILABLE, "the shard session ended")
        try:
            for reply in responses:
                with self._lock:
                    future = self._pending.pop(reply.sequence, None)
                if future is None:
                    continue
                if reply.WhichOneof("result") == "error":
                    code = _CODES.get(reply.error.code, grpc.StatusCode.UNKNOWN)
                    future.set_exception(SessionCallError(code, reply.error.message))
                else:
                    future.set_result(reply)
        except grpc.RpcError as error:
            code = error.code()
            if code is not grpc.StatusCode.CANCELLED:  # cancelled: abandoned by us, retry
                failure = SessionCallError(code, error.details() or "")
            else:
                failure = SessionCallError(grpc.StatusCode.UNAVAILABLE, "the session was reset")
        with self._lock:
            if self._requests is requests:
                self._requests, self._call = None, None
                pending, self._pending = self._pending, {}
            else:
                pending = {}
        requests.put(None)
        for future in pending.values():
            if not future.done():
                future.set_exception(failure)


_UNARY = {
    "get_shard": "GetShard",
    "progress": "ReportProgress",
    "done": "ReportShardDone",
    "failed": "ReportShardFailed",
}
"""Session call field -> the unary RPC of the same meaning."""


class ClientClosed(Exception):
    """A call after :meth:`ShardClient.close`."""


class Revoked(Exception):
    """The dispatcher no longer counts this worker's shard (or token) as held; drop it."""


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with full jitter for calls the dispatcher could not answer."""

    first_delay: float = 0.05
    """The first retry waits up to 50 ms: a restarting dispatcher is back in about a second."""
    max_delay: float = 2.0
    """Waits never exceed 2 s, so a worker notices a recovered dispatcher quickly."""
    give_up_after: float = 120.0
    """Two minutes of failures is an outage, not a blip: raise and let the pod restart."""

    def delay(self, attempt: int) -> float:
        """How long to wait before retry number ``attempt`` (1-based)."""
        return random.uniform(0, min(self.max_delay, self.first_delay * 2 ** (attempt - 1)))


@dataclass(frozen=True)
class LeasedShard:
    """A shard leased to this worker."""

    dataset: str
    shard_id: int
    epoch: int
    start: int
    end: int
    offset: int
    indices: tuple[int, ...] = ()
    """Explicit indices (index-list datasets); empty for ranges and streams."""
    partition: int = 0
    straggler: bool = False
    lease: int = 0
    """The hand-out number; reports carry it so a stale view of the shard is refused."""

    @property
    def size(self) -> int:
        """Records in the shard."""
        return self.end - self.start

    def record(self, position: int) -> int:
        """The sample index (or stream offset) at ``position`` within the shard."""
        if self.indices:
            return self.indices[position]
        return self.start + position

    @classmethod
    def from_proto(
        cls, dataset: str, shard: shard_pb2.Shard, straggler: bool, lease: int
    ) -> LeasedShard:
        """From the wire form."""
        return cls(
            dataset=dataset,
            shard_id=shard.shard_id,
            epoch=shard.epoch,
            start=shard.start,
            end=shard.end,
            offset=shard.offset,
            indices=tuple(shard.indices),
            partition=shard.partition,
            straggler=straggler,
            lease=lease,
        )


@dataclass(frozen=True)
class ShardReply:
    """GetShard's answer: a shard (and, from :meth:`ShardClient.get_shards`, the ones
    leased after it), the end of the data, or wait and ask again."""

    shard: LeasedShard | None
    end_of_data: bool = False
    retry_after: float = 0.0
    more: tuple[LeasedShard, ...] = ()
    """The shards leased after ``shard``, in hand-out order."""

    @property
    def shards(self) -> tuple[LeasedShard, ...]:
        """Every shard leased, in hand-out order (empty if none)."""
        return () if self.shard is None else (self.shard, *self.more)


@dataclass(frozen=True)
class Committed:
    """Records the dispatcher accepted as consumed: positions ``[first, last)`` of a shard."""

    shard: LeasedShard
    first: int
    last: int


@dataclass
class _Token:
    incarnation: int | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)


class ShardClient:
    """One worker's connection to the dispatcher (thread-safe)."""

    def __init__(
        self,
        address: str,
        job_id: str,
        worker: str,
        *,
        timeout: float = 10.0,
        retry: RetryPolicy | None = None,
        channel: grpc.Channel | None = None,
        session: bool = True,
        identity: str = "trainer",
        token: tls.Token | None = None,
    ) -> None:
        """``token``: the pod's job token (default: the file ``STRIDE_JOB_TOKEN_FILE`` names,
        which the pod watcher keeps fresh); the dispatcher takes the job from it."""
        self.address = address
        self.job_id = job_id
        self.worker = worker
        self.timeout = timeout
        self.retry = retry or RetryPolicy()
        self._own_channel = channel is None
        self.channel = channel or tls.sync_channel(
            address,
            server="dispatcher",
            identity=identity,
            options=CHANNEL_OPTIONS,
            token=token or TokenSource.for_pod(),
        )
        self.stub = pb_grpc.DispatcherServiceStub(self.channel)
        self._session = _Session(self.stub) if session else None
        self._token = _Token()
        self.lease_seconds = 0.0
        self.closed = False

    def close(self) -> None:
        """Stop: no call is made or retried after this, and the channel (if ours) closes."""
        self.closed = True
        if self._session is not None:
            self._session.close()
        if self._own_channel:
            self.channel.close()

    def __enter__(self) -> ShardClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def call(self, rpc: Callable[[], T]) -> T:
        """Run ``rpc`` with retries on transient failures."""
        started = time.monotonic()
        attempt = 0
        while True:
            if self.closed:
                raise ClientClosed(f"the client of worker {self.worker!r} was closed")
            try:
                return rpc()
            except grpc.RpcError as error:
                code = error.code()
                attempt += 1
                if not retryable(error) or time.monotonic() - started > self.retry.give_up_after:
                    raise
                delay = self.retry.delay(attempt)
                if attempt == 1 or attempt % 20 == 0:
                    log.warning(
                        "dispatcher unreachable; retrying",
                        address=self.address,
                        code=code.name,
                        attempt=attempt,
                    )
                time.sleep(delay)

    @property
    def incarnation(self) -> int | None:
        """The current token (None before the first registration)."""
        return self._token.incarnation

    def register(self, stale: int | None = None) -> int:
        """Register (again, if ``stale`` is the current token) and return the token."""
        with self._token.lock:
            if self._token.incarnation is not None and self._token.incarnation != stale:
                return self._token.incarnation
            reply = self.call(
                lambda: self.stub.RegisterWorker(
                    pb.RegisterWorkerRequest(job_id=self.job_id, worker=self.worker),
                    timeout=self.timeout,
                )
            )
            self._token.incarnation = int(reply.incarnation)
            self.lease_seconds = reply.lease.ToTimedelta().total_seconds()
            log.info("registered", worker=self.worker, incarnation=self._token.incarnation)
            return self._token.incarnation

    def _ref(self, dataset: str, incarnation: int) -> pb.WorkerRef:
        return pb.WorkerRef(
            job_id=self.job_id, dataset=dataset, worker=self.worker, incarnation=incarnation
        )

    def _fenced(self, rpc: Callable[[int], T]) -> T:
        incarnation = self.incarnation or self.register()
        try:
            return self.call(lambda: rpc(incarnation))
        except grpc.RpcError as error:
            self._raise_revoked(error, incarnation)
            raise

    def _raise_revoked(self, error: grpc.RpcError, incarnation: int) -> None:
        """Raise :class:`Revoked` if ``error`` says the shard or token was taken back."""
        if error.code() != grpc.StatusCode.FAILED_PRECONDITION:
            return
        details = error.details() or ""
        # The token itself was fenced ("... register again", "... call RegisterWorker"),
        # not just this shard taken back: only then is a new incarnation needed.
        if "register" in details.lower():
            self.register(stale=incarnation)
        raise Revoked(details) from None

    def _invoke(self, kind: str, request: Any) -> Any:
        """One hot call: over the session (``kind`` is its field name) or unary."""
        if self._session is None:
            return getattr(self.stub, _UNARY[kind])(request, timeout=self.timeout)
        reply = self._session.call(self.timeout, **{kind: request})
        return getattr(reply, kind)

    def _get_request(
        self, dataset: str, incarnation: int, done: LeasedShard | None
    ) -> pb.GetShardRequest:
        request = pb.GetShardRequest(worker=self._ref(dataset, incarnation))
        if done is not None:
            request.done_shard_id = done.shard_id
            request.done_lease = done.lease
        return request

    def get_shard_async(self, dataset: str, done: LeasedShard | None = None) -> PendingShard:
        """Like :meth:`get_shard`, but the call is sent now and answered later: a prefetch.

        Over the session the request goes out at once, alongside other calls; without a
        session, or if the pipelined call fails for a transient reason, ``result()`` makes
        the call (with retries) instead.
        """
        if self._session is None or self.closed:
            return PendingShard(self, dataset, done, None, 0)
        incarnation = self.incarnation or self.register()
        future = self._session.submit(get_shard=self._get_request(dataset, incarnation, done))
        return PendingShard(self, dataset, done, future, incarnation)

    def _shard_reply(self, dataset: str, reply: pb.GetShardResponse) -> ShardReply:
        if reply.HasField("shard"):
            return ShardReply(
                LeasedShard.from_proto(dataset, reply.shard, reply.straggler, reply.lease),
                more=tuple(
                    LeasedShard.from_proto(dataset, item.shard, False, item.lease)
                    for item in reply.more_shards
                ),
            )
        if reply.end_of_data:
            return ShardReply(None, end_of_data=True)
        return ShardReply(None, retry_after=reply.retry_after.ToTimedelta().total_seconds())

    def get_shard(self, dataset: str, done: LeasedShard | None = None) -> ShardReply:
        """Lease the next shard, completing ``done`` first in the same call.

        Raises :class:`Revoked` if the token was fenced (the client has registered again;
        every shard it held is void, including ``done``).
        """

        def rpc(incarnation: int) -> pb.GetShardResponse:
            reply: pb.GetShardResponse = self._invoke(
                "get_shard", self._get_request(dataset, incarnation, done)
            )
            return reply

        return self._shard_reply(dataset, self._fenced(rpc))

    def get_shards(
        self, dataset: str, done: Sequence[LeasedShard] = (), count: int = 1
    ) -> ShardReply:
        """Report every shard of ``done`` finished and lease up to ``count`` more, in one
        call and one commit (``reply.shards``; a straggler gets one). For workers that take
        shards faster than a round trip: one call per ``count`` shards instead of one per
        shard. Keep the ones not yet started alive with ``report_progress(...,
        renew_held=True)``. Raises :class:`Revoked` as :meth:`get_shard` does (every shard
        held, ``done`` included, is then void)."""

        def rpc(incarnation: int) -> pb.GetShardResponse:
            request = pb.GetShardRequest(
                worker=self._ref(dataset, incarnation),
                max_shards=count,
                done_shards=[pb.ShardDone(shard_id=s.shard_id, lease=s.lease) for s in done],
            )
            reply: pb.GetShardResponse = self._invoke("get_shard", request)
            return reply

        return self._shard_reply(dataset, self._fenced(rpc))

    def report_progress(self, shard: LeasedShard, offset: int, renew_held: bool = False) -> None:
        """Heartbeat: records of the shard consumed so far; with ``renew_held``, also renew
        every other shard this worker holds in the dataset. Raises :class:`Revoked`."""
        self._fenced(
            lambda incarnation: self._invoke(
                "progress",
                pb.ReportProgressRequest(
                    worker=self._ref(shard.dataset, incarnation),
                    shard_id=shard.shard_id,
                    offset=offset,
                    lease=shard.lease,
                    renew_held=renew_held,
                ),
            )
        )

    def report_done(self, shard: LeasedShard) -> None:
        """The shard is consumed to its end. Raises :class:`Revoked`."""
        self._fenced(
            lambda incarnation: self._invoke(
                "done",
                pb.ReportShardDoneRequest(
                    worker=self._ref(shard.dataset, incarnation),
                    shard_id=shard.shard_id,
                    lease=shard.lease,
                ),
            )
        )

    def report_failed(self, shard: LeasedShard, reason: str) -> None:
        """Give a shard back at its last reported offset. Raises :class:`Revoked`."""
        self._fenced(
            lambda incarnation: self._invoke(
                "failed",
                pb.ReportShardFailedRequest(
                    worker=self._ref(shard.dataset, incarnation),
                    shard_id=shard.shard_id,
                    reason=reason,
                    lease=shard.lease,
                ),
            )
        )

    def fetch_batches(
        self, dataset: str, data_worker: str, max_batches: int = 8
    ) -> pb.FetchBatchesResponse:
        """Data-worker mode: index batches tagged with step ids for ``data_worker``."""
        return self.call(
            lambda: self.stub.FetchBatches(
                pb.FetchBatchesRequest(
                    job_id=self.job_id,
                    dataset=dataset,
                    data_worker=data_worker,
                    max_batches=max_batches,
                ),
                timeout=self.timeout,
            )
        )

    def report_consumed(self, dataset: str, step_id: int) -> int:
        """Data-worker mode: every step up to ``step_id`` was consumed; the dispatcher's view."""
        reply = self.call(
            lambda: self.stub.ReportConsumed(
                pb.ReportConsumedRequest(job_id=self.job_id, dataset=dataset, step_id=step_id),
                timeout=self.timeout,
            )
        )
        return int(reply.consumed_step)

    def create_dataset(self, dataset: str, parameters: pb.DatasetParameters) -> bool:
        """Create a dataset of this client's job (a no-op if it exists identically)."""
        reply = self.call(
            lambda: self.stub.CreateDataset(
                pb.CreateDatasetRequest(job_id=self.job_id, dataset=dataset, parameters=parameters),
                timeout=self.timeout,
            )
        )
        return bool(reply.created)

    def snapshot_shards(self, dataset: str) -> pb.SnapshotShardsResponse:
        """The dataset's shard state now (SnapshotShards), to keep with a checkpoint. Retried
        like every call: a dispatcher whose database is busy answers UNAVAILABLE, and a
        snapshot taken on the next attempt is as good (DLRover sec. 5.3)."""
        reply: pb.SnapshotShardsResponse = self.call(
            lambda: self.stub.SnapshotShards(
                pb.SnapshotShardsRequest(job_id=self.job_id, dataset=dataset),
                timeout=self.timeout,
            )
        )
        return reply

    def restore_shards(self, dataset: str, snapshot: bytes) -> int:
        """Put the dataset's shards back to ``snapshot`` (RestoreShards); the leases revoked.
        Retried: a restore is idempotent (the same snapshot gives the same queue)."""
        reply: pb.RestoreShardsResponse = self.call(
            lambda: self.stub.RestoreShards(
                pb.RestoreShardsRequest(job_id=self.job_id, dataset=dataset, snapshot=snapshot),
                timeout=self.timeout,
            )
        )
        return int(reply.revoked)

    def dataset_state(self, dataset: str) -> pb.GetDatasetStateResponse:
        """Queue sizes, epoch and per-worker progress."""
        return self.call(
            lambda: self.stub.GetDatasetState(
                pb.GetDatasetStateRequest(job_id=self.job_id, dataset=dataset),
                timeout=self.timeout,
            )
        )


class PendingShard:
    """A GetShard sent ahead (a prefetch); :meth:`result` waits for and returns its answer."""

    def __init__(
        self,
        client: ShardClient,
        dataset: str,
        done: LeasedShard | None,
        future: Future[pb.ShardSessionResponse] | None,
        incarnation: int,
    ) -> None:
        self._client = client
        self._dataset = dataset
        self._done = done
        self._future = future
        self._incarnation = incarnation

    def done(self) -> bool:
        """Whether the answer is in (always False when the call is made in ``result``)."""
        return self._future is not None and self._future.done()

    def result(self) -> ShardReply:
        """The answer. Raises :class:`Revoked` as :meth:`ShardClient.get_shard` does."""
        client = self._client
        if self._future is not None and client._session is not None:
            try:
                reply = client._session.wait(self._future, client.timeout)
                return client._shard_reply(self._dataset, reply.get_shard)
            except grpc.RpcError as error:
                client._raise_revoked(error, self._incarnation)
                if not retryable(error):
                    raise
                # A transient failure: make the call again, with the client's retries. The
                # lost call's lease (if it was granted) lapses; a repeated done is harmless.
        return client.get_shard(self._dataset, self._done)
