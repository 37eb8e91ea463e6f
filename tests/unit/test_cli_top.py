"""`stride top`'s numbers: how far a job is, its samples/s and ETA, from the step metrics
the optimizer holds and the shards the dispatcher counts."""

from __future__ import annotations

import pytest

from stride.api.admission.v1 import admission_service_pb2 as admission_pb
from stride.api.dispatcher.v1 import dispatcher_service_pb2 as dispatcher_pb
from stride.api.optimizer.v1 import optimizer_service_pb2 as optimizer_pb
from stride.cli.running import (
    Progress,
    Speed,
    data_consumed,
    measure,
    speed_cells,
    total_samples,
)
from stride.events.v1 import job_pb2

RUNNING = admission_pb.JOB_STATE_ADMITTED


def job(
    records: int = 1_000_000, epochs: int = 2, steps: int = 0, batch: int = 500
) -> admission_pb.Job:
    return admission_pb.Job(
        job_id="job-1",
        state=RUNNING,
        spec=job_pb2.JobSpec(
            dataset=job_pb2.DatasetSpec(name="d", record_count=records),
            batch_size=batch,
            termination=job_pb2.Termination(max_epochs=epochs, max_steps=steps),
        ),
    )


def plan(rate: float = 0.0, consumed: int = 0) -> optimizer_pb.GetPlanResponse:
    return optimizer_pb.GetPlanResponse(samples_per_second=rate, samples_consumed=consumed)


@pytest.mark.parametrize(
    ("epochs", "steps", "total"),
    [(2, 0, 2_000_000), (0, 0, 1_000_000), (0, 300, 150_000), (3, 300, 150_000)],
)
def test_the_total_is_what_the_termination_says(epochs: int, steps: int, total: int) -> None:
    # Steps are global batches; no termination at all is the trainer's one epoch.
    assert total_samples(job(epochs=epochs, steps=steps).spec) == total


def test_the_dispatcher_counts_whole_epochs_and_done_shards_of_the_current_one() -> None:
    spec = job().spec
    state = dispatcher_pb.GetDatasetStateResponse(epoch=1, todo=5, doing=2, done=3)
    assert data_consumed(state, spec) == 1.3 * 1_000_000
    assert data_consumed(dispatcher_pb.GetDatasetStateResponse(), spec) == 0.0
    assert data_consumed(dispatcher_pb.GetDatasetStateResponse(finished=True), spec) == 2_000_000


def test_a_job_read_by_steps_counts_every_step_up_to_the_consumed_one() -> None:
    # GoldMiner's data-worker mode: the shards are never cut, the consumed step says it all.
    spec = job().spec
    per_epoch = -(-spec.dataset.record_count // spec.batch_size)
    state = dispatcher_pb.GetDatasetStateResponse(consumed_step=per_epoch + 9)
    assert data_consumed(state, spec) == 1_000_000 + 10 * spec.batch_size
    assert data_consumed(dispatcher_pb.GetDatasetStateResponse(consumed_step=-1), spec) == 0.0
    last = dispatcher_pb.GetDatasetStateResponse(consumed_step=2 * per_epoch - 1)
    assert data_consumed(last, spec) == 2_000_000


def test_a_simulated_job_is_as_far_and_as_fast_as_its_step_metrics_say() -> None:
    # No dataset at the dispatcher: the optimizer's view counts the consumed samples.
    speed = measure(job(), plan(400.0, 200_000), None, Progress(), now=10.0)
    assert speed == Speed(2_000_000, 200_000.0, 400.0)
    assert speed.done == 0.1
    assert speed.eta_seconds == 1_800_000 / 400.0
    assert speed_cells(speed, RUNNING) == ("10%", "400", "1h15m")


def test_a_training_job_is_as_far_as_the_dispatcher_says_at_the_measured_rate() -> None:
    # Training pods leave the count to the dispatcher (their metrics carry 0 consumed).
    data = dispatcher_pb.GetDatasetStateResponse(epoch=0, todo=3, doing=1, done=6)
    speed = measure(job(), plan(1234.5), data, Progress(), now=10.0)
    assert speed == Speed(2_000_000, 600_000.0, 1234.5)
    progress, rate, eta = speed_cells(speed, RUNNING, " (epoch 1/2)")
    assert (progress, rate, eta) == ("30% (epoch 1/2)", "1,234", "18m54s")
    assert speed.eta_seconds == 1_400_000 / 1234.5  # 1,134.1 s


def test_the_first_frame_has_the_rate_and_the_eta_already() -> None:
    # What made them "-": the rate was only the change between two frames.
    cells = speed_cells(measure(job(), plan(50.0, 1), None, Progress(), now=0.0), RUNNING)
    assert cells[1:] == ("50", "11h06m")


def test_without_a_measured_rate_the_rate_comes_from_the_count_over_the_frames() -> None:
    progress = Progress()
    data = dispatcher_pb.GetDatasetStateResponse(epoch=0, todo=10, done=0)
    first = measure(job(), None, data, progress, now=100.0)
    assert (first.samples_per_second, first.eta_seconds) == (0.0, None)
    assert speed_cells(first, RUNNING) == ("0%", "-", "-")
    moved = dispatcher_pb.GetDatasetStateResponse(epoch=0, todo=8, done=2)
    later = measure(job(), plan(0.0), moved, progress, now=120.0)
    assert later.samples_per_second == 200_000 / 20.0
    assert later.eta_seconds == 1_800_000 / 10_000.0
    # A count that went back (a restore from a checkpoint) starts over.
    back = dispatcher_pb.GetDatasetStateResponse(epoch=0, todo=9, done=1)
    assert measure(job(), None, back, progress, now=130.0).samples_per_second == 0.0


def test_nothing_known_stays_a_dash_and_a_finished_job_is_done() -> None:
    unknown = measure(job(), None, None, Progress(), now=0.0)
    assert speed_cells(unknown, RUNNING) == ("-", "-", "-")
    rate_only = measure(job(), plan(10.0), None, Progress(), now=0.0)
    assert speed_cells(rate_only, RUNNING) == ("-", "10", "-")
    finished = dispatcher_pb.GetDatasetStateResponse(finished=True)
    done = measure(job(), plan(10.0), finished, Progress(), now=0.0)
    assert speed_cells(done, RUNNING) == ("100%", "10", "done")
    # An ended job shows how far it got, and no speed.
    assert speed_cells(done, admission_pb.JOB_STATE_SUCCEEDED) == ("100%", "-", "done")
    part = Speed(100, 40.0, 5.0)
    assert speed_cells(part, admission_pb.JOB_STATE_CANCELLED) == ("40%", "-", "-")


def test_an_empty_dataset_has_no_progress_rather_than_a_division_by_zero() -> None:
    speed = measure(job(records=0), plan(10.0, 5), None, Progress(), now=0.0)
    assert (speed.done, speed.eta_seconds) == (None, None)
