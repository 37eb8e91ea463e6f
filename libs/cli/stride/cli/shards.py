"""``stride shards <job>``: the shard queues of a job's datasets, as the dispatcher holds them."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import grpc
import typer
from rich.console import Console
from rich.table import Table

from stride.api.dispatcher.v1 import dispatcher_service_pb2 as pb
from stride.api.dispatcher.v1 import dispatcher_service_pb2_grpc as pb_grpc
from stride.cli import channels
from stride.cli.endpoints import NoSuite, address
from stride.events.v1 import shard_pb2
from stride.runtime.tls import TlsConfigError

RPC_TIMEOUT_SECONDS = 10.0


def _kind(kind: shard_pb2.ShardingKind.ValueType) -> str:
    return shard_pb2.ShardingKind.Name(kind).removeprefix("SHARDING_KIND_").lower()


def queue_tables(
    job_id: str, listed: pb.ListDatasetsResponse, states: list[pb.GetDatasetStateResponse]
) -> list[Table]:
    """One table of the job's datasets and one of each dataset's workers."""
    datasets = Table(title=f"shard queues of {job_id}")
    for column in ("dataset", "kind", "records", "shard", "epoch", "todo", "doing", "done"):
        datasets.add_column(column, justify="left" if column in ("dataset", "kind") else "right")
    datasets.add_column("finished")
    tables = [datasets]
    for summary, state in zip(listed.datasets, states, strict=True):
        p = summary.parameters
        datasets.add_row(
            summary.dataset,
            _kind(p.kind),
            f"{p.record_count:,}" + (f" x {p.partitions}" if p.partitions else ""),
            f"{p.shard_batches} x {p.batch_size}",
            f"{state.epoch + 1}/{p.epochs}",
            str(state.todo),
            str(state.doing),
            str(state.done),
            "yes" if state.finished else "no",
        )
        if not state.workers:
            continue
        workers = Table(title=f"workers on {summary.dataset}")
        for column in ("worker", "holds", "consumed (epoch)", "rate (rec/s)", "straggler"):
            workers.add_column(column, justify="left" if column == "worker" else "right")
        for worker in state.workers:
            workers.add_row(
                worker.worker,
                ", ".join(str(s) for s in worker.shard_ids) or "-",
                f"{worker.records_consumed:,}",
                f"{worker.rate:,.1f}",
                "yes" if worker.straggler else "",
            )
        tables.append(workers)
    return tables


def register(app: typer.Typer, state_dir_default: Path, console: Console, errors: Console) -> None:
    """Add ``stride shards`` to the CLI."""

    @app.command()
    def shards(
        job_id: Annotated[str, typer.Argument(help="The job whose shard queues to show.")],
        state_dir: Annotated[
            Path,
            typer.Option(
                "--state-dir",
                envvar="STRIDE_STATE_DIR",
                help="Where `stride up` keeps its state (default ~/.local/state/stride).",
            ),
        ] = state_dir_default,
    ) -> None:
        """Show the TODO, DOING and done shards of a job's datasets, and who holds what."""
        try:
            target = address("dispatcher", state_dir)
            with channels.channel(target, "dispatcher", state_dir) as channel:
                stub = pb_grpc.DispatcherServiceStub(channel)
                listed = stub.ListDatasets(
                    pb.ListDatasetsRequest(job_id=job_id), timeout=RPC_TIMEOUT_SECONDS
                )
                states = [
                    stub.GetDatasetState(
                        pb.GetDatasetStateRequest(job_id=job_id, dataset=d.dataset),
                        timeout=RPC_TIMEOUT_SECONDS,
                    )
                    for d in listed.datasets
                ]
        except (NoSuite, TlsConfigError) as error:
            errors.print(f"[bold red]error:[/] {error}", highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None
        except grpc.RpcError as error:
            code = error.code()
            details = error.details()
            if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                details = f"cannot reach dispatcher at {target} ({details}); is the suite up?"
            errors.print(f"[bold red]error:[/] {details}", highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None
        if not listed.datasets:
            console.print(f"job {job_id} has no datasets at the dispatcher")
            return
        for table in queue_tables(job_id, listed, states):
            console.print(table)
