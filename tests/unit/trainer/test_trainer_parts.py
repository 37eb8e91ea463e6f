"""The trainer's pure parts: synthetic data, entrypoints, settings."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from pydantic import ValidationError
from stride_examples import criteo

from stride.ckptclient.client import CheckpointCacheError
from stride.trainer.cluster import ClusterChange, classify
from stride.trainer.entrypoint import EntrypointError, load
from stride.trainer.loop import SAVE_ATTEMPTS, PendingAck, after_save_failure
from stride.trainer.settings import TrainerSettings, parse_cluster

CLUSTER = '{"chief": ["127.0.0.1:1"], "ps": ["127.0.0.1:2"], "worker": ["127.0.0.1:3"]}'


def test_a_sample_depends_on_its_index_alone() -> None:
    dense, ids, labels = criteo.make_batch(np.arange(100, 164))
    assert dense.shape == (64, criteo.DENSE) and dense.dtype == np.float32
    assert ids.shape == (64, criteo.CATEGORICAL) and ids.dtype == np.int32
    assert labels.shape == (64, 1) and set(np.unique(labels)) <= {0.0, 1.0}
    assert ids.min() >= 0 and ids.max() < criteo.VOCABULARY
    again = criteo.make_batch(np.array([130, 101]))
    np.testing.assert_array_equal(again[0], dense[[30, 1]])
    np.testing.assert_array_equal(again[1], ids[[30, 1]])


def test_labels_come_from_a_model_that_can_be_learned() -> None:
    dense, _, labels = criteo.make_batch(np.arange(40_000))
    y = labels.ravel()
    assert 0.2 < y.mean() < 0.8
    # The hidden model's logit separates the classes far better than chance.
    logit = dense @ criteo._DENSE_WEIGHTS
    high = y[logit > np.quantile(logit, 0.8)].mean()
    low = y[logit < np.quantile(logit, 0.2)].mean()
    assert high - low > 0.3


def test_entrypoints_load_or_name_the_problem() -> None:
    assert load("stride_examples.criteo:make_batch") is criteo.make_batch
    with pytest.raises(EntrypointError, match=r"not package\.module:function"):
        load("no colon")
    with pytest.raises(EntrypointError, match=r"module 'no_such_pkg\.mod' does not import"):
        load("no_such_pkg.mod:train")
    with pytest.raises(EntrypointError, match="has no function 'missing'"):
        load("stride_examples.criteo:missing")


@pytest.mark.parametrize(
    ("cluster", "problem"),
    [
        ("{", "is not JSON"),
        ("[]", "must be an object"),
        ('{"chief": ["a:1"], "ps": ["b:2"], "worker": ["c:3"], "boss": []}', "unknown role"),
        ('{"chief": ["a:1"], "ps": ["b"], "worker": ["c:3"]}', "is not host:port"),
        ('{"chief": [], "ps": ["b:2"], "worker": ["c:3"]}', "exactly one chief"),
        ('{"chief": ["a:1"], "ps": [], "worker": ["c:3"]}', "at least one ps"),
    ],
)
def test_bad_clusters_are_refused(cluster: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        parse_cluster(cluster)


def test_settings_need_the_pods_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STRIDE_TRAINER_ROLE", "chief")
    monkeypatch.setenv("STRIDE_TRAINER_JOB_ID", "job-1")
    monkeypatch.setenv("STRIDE_TRAINER_POD_NAME", "job-1-chief-0")
    monkeypatch.setenv("STRIDE_TRAINER_CLUSTER_JSON", CLUSTER)
    settings = TrainerSettings()  # type: ignore[call-arg]
    assert settings.cluster["worker"] == ["127.0.0.1:3"]
    monkeypatch.setenv("STRIDE_TRAINER_ROLE", "boss")
    with pytest.raises(ValidationError, match="role"):
        TrainerSettings()  # type: ignore[call-arg]


def test_a_chief_whose_entrypoint_does_not_import_exits_2_with_one_line() -> None:
    env = {
        "PATH": "/usr/bin:/bin",
        "STRIDE_TRAINER_ROLE": "chief",
        "STRIDE_TRAINER_JOB_ID": "job-1",
        "STRIDE_TRAINER_POD_NAME": "job-1-chief-0",
        "STRIDE_TRAINER_CLUSTER_JSON": CLUSTER,
        "STRIDE_TRAINER_SPEC_JSON": '{"model": {"entrypoint": "nowhere_at_all:train"}}',
        "STRIDE_TLS_DIR": os.environ["STRIDE_TLS_DIR"],
    }
    done = subprocess.run(
        [sys.executable, "-m", "stride.trainer"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert (
        done.stderr.strip()
        .splitlines()[-1]
        .startswith(
            "error: entrypoint nowhere_at_all:train: module 'nowhere_at_all' does not import"
        )
    )


def test_missing_settings_exit_2_naming_the_variable() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "stride.trainer"],
        env={"PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "STRIDE_TRAINER_ROLE" in done.stderr and "STRIDE_TRAINER_CLUSTER_JSON" in done.stderr


def _cluster(
    chief: str = "h:1", ps: tuple[str, ...] = ("h:2",), workers: tuple[str, ...] = ("h:3",)
) -> dict[str, list[str]]:
    return {"chief": [chief], "ps": list(ps), "worker": list(workers)}


@pytest.mark.parametrize(
    ("new", "change"),
    [
        (_cluster(), ClusterChange.NONE),
        (_cluster(workers=("h:3", "h:4", "h:5")), ClusterChange.WORKERS),  # scale out
        (_cluster(workers=("h:6",)), ClusterChange.WORKERS),  # the worker moved
        (_cluster(ps=("h:2", "h:7")), ClusterChange.PARAMETER_SERVERS),  # a second PS
        (_cluster(ps=("h:8",)), ClusterChange.PARAMETER_SERVERS),  # the PS moved
        (_cluster(chief="h:9"), ClusterChange.CHIEF_MOVED),
        (_cluster(chief="h:9", ps=("h:2", "h:7")), ClusterChange.CHIEF_MOVED),
        # The old PS's server would have to become a worker: a context cannot change task.
        (_cluster(ps=("h:7",), workers=("h:2",)), ClusterChange.INCOMPATIBLE),
    ],
)
def test_a_new_cluster_is_followed_the_cheapest_way_it_allows(
    new: dict[str, list[str]], change: ClusterChange
) -> None:
    assert classify(_cluster(), new) is change


def test_scale_in_keeps_the_workers_that_stay_at_their_index() -> None:
    three = _cluster(workers=("h:3", "h:4", "h:5"))
    assert classify(three, _cluster()) is ClusterChange.WORKERS
    # Worker h:5 taking index 1 would rename a task in place.
    shifted = _cluster(workers=("h:3", "h:5"))
    assert classify(three, shifted) is ClusterChange.INCOMPATIBLE


def test_a_pending_ack_survives_re_execution() -> None:
    pending = PendingAck("reconfigure", 7, 1700000000.25, "step-120")
    again = PendingAck.decode(pending.encode())
    assert (again.plan_version, again.paused_at, again.checkpoint_id) == (
        7,
        1700000000.25,
        "step-120",
    )


@pytest.mark.parametrize(
    ("code", "moving", "attempt", "action"),
    [
        ("UNAVAILABLE", False, 1, "retry"),
        ("UNAVAILABLE", True, 1, "retry"),
        ("UNAVAILABLE", False, SAVE_ATTEMPTS, "skip"),
        ("UNAVAILABLE", True, SAVE_ATTEMPTS, "raise"),
        # #37: a cache at its memory budget, the job's quota or its uploads at once.
        ("RESOURCE_EXHAUSTED", False, 1, "skip"),
        ("RESOURCE_EXHAUSTED", True, 1, "raise"),
        ("INVALID_ARGUMENT", False, 1, "raise"),
        ("PERMISSION_DENIED", False, 1, "raise"),
    ],
)
def test_a_refused_save_is_retried_skipped_or_fatal(
    code: str, moving: bool, attempt: int, action: str
) -> None:
    """An interval checkpoint the cache is away or full for is skipped (it only bounds what
    a crash repeats); the checkpoint a move needs, or any other refusal, ends the chief."""
    import grpc

    error = CheckpointCacheError(getattr(grpc.StatusCode, code), "refused")
    assert after_save_failure(error, moving, attempt) == action


def test_a_small_tables_gradient_goes_dense_and_a_large_ones_stays_sparse() -> None:
    import keras
    import tensorflow as tf

    from stride.trainer.loop import DENSE_GRADIENT_BYTES, _dense_if_small

    rows = DENSE_GRADIENT_BYTES // (8 * 4)  # float32 rows of 8: exactly the limit
    small = keras.Variable(keras.ops.zeros((rows, 8)))
    large = keras.Variable(keras.ops.zeros((rows + 1, 8)))
    lookups = tf.constant([3, 3, 5])
    values = tf.ones((3, 8))
    dense = _dense_if_small(tf.IndexedSlices(values, lookups, tf.constant([rows, 8])), small)
    assert not isinstance(dense, tf.IndexedSlices)
    # Repeated rows are summed, as the sparse update would have applied them.
    assert dense.shape == (rows, 8) and dense[3, 0] == 2.0 and dense[5, 0] == 1.0
    assert float(tf.reduce_sum(dense)) == 24.0
    sparse = tf.IndexedSlices(values, lookups, tf.constant([rows + 1, 8]))
    assert _dense_if_small(sparse, large) is sparse
    already = tf.ones((2, 2))
    assert _dense_if_small(already, small) is already
