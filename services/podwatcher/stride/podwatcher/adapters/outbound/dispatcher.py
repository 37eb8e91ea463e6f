"""The dispatcher's read of a job's datasets, for a StrideJob's progress.

The pod watcher calls as itself; the dispatcher lets that identity read (never change) any
job's dataset state (``ListDatasets``, ``GetDatasetState``).
"""

from __future__ import annotations

import grpc

from stride.api.dispatcher.v1 import dispatcher_service_pb2 as pb
from stride.api.dispatcher.v1 import dispatcher_service_pb2_grpc as pb_grpc
from stride.podwatcher.domain.progress import DataProgress
from stride.runtime import tls

CALL_SECONDS = 5.0


class DispatcherClient:
    """A job's progress through its (first) dataset."""

    def __init__(self, address: str) -> None:
        self._channel = tls.aio_channel(address, server="dispatcher", identity="podwatcher")
        self._stub = pb_grpc.DispatcherServiceStub(self._channel)

    async def progress(self, job_id: str) -> DataProgress | None:
        """None while the job has no dataset (its trainer has not started), or when the
        dispatcher cannot say now (the status keeps what it said before)."""
        try:
            listed = await self._stub.ListDatasets(
                pb.ListDatasetsRequest(job_id=job_id), timeout=CALL_SECONDS
            )
            if not listed.datasets:
                return None
            dataset = listed.datasets[0]
            state = await self._stub.GetDatasetState(
                pb.GetDatasetStateRequest(job_id=job_id, dataset=dataset.dataset),
                timeout=CALL_SECONDS,
            )
        except grpc.aio.AioRpcError:
            return None
        parameters = dataset.parameters
        per_shard = parameters.batch_size * parameters.shard_batches
        # An epoch's shards are made as they are needed: count them from the parameters.
        shards = (
            -(-parameters.record_count // per_shard)
            if per_shard > 0
            else state.todo + state.doing + state.done
        )
        return DataProgress(
            epoch=state.epoch,
            epochs=parameters.epochs,
            done=state.done,
            shards=shards,
            finished=state.finished,
        )

    async def close(self) -> None:
        await self._channel.close(None)
