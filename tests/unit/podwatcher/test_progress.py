"""A StrideJob's progress in words, from the dispatcher's epoch and shards."""

from __future__ import annotations

from stride.podwatcher.domain.progress import DataProgress, describe


def test_an_epoch_bounded_job_is_that_far_through_all_its_epochs() -> None:
    assert describe(DataProgress(epoch=1, epochs=2, done=25, shards=100, finished=False)) == (
        "epoch 2/2, 25% of its shards",
        62,
    )
    assert describe(DataProgress(0, 3, 0, 10, False)) == ("epoch 1/3, 0% of its shards", 0)


def test_finished_is_all_and_unfinished_never_says_100() -> None:
    assert describe(DataProgress(1, 2, 100, 100, True)) == ("all 2 epochs done", 100)
    assert describe(DataProgress(1, 2, 100, 100, False))[1] == 99


def test_a_job_without_epochs_or_shards_says_what_it_knows() -> None:
    assert describe(DataProgress(0, 0, 0, 0, False)) == ("epoch 1/0, 0% of its shards", None)
    assert describe(DataProgress(7, 2, 1, 4, False))[0] == "epoch 2/2, 25% of its shards"
