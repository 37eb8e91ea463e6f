"""The TensorFlow integration's zero-copy snapshot: it is a view of the variables' buffers,
and it stays exactly as taken while training updates the variables (TensorFlow copies a
variable before updating it in place while a snapshot holds its buffer), which is what
lets ``save`` skip ``variable.numpy()``'s copy and ``save_in_background`` overlap a step.

TensorFlow runs in a child process, so collecting the suite stays fast.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.e2e

SCRIPT = textwrap.dedent(
    """
    import keras
    import numpy as np
    import tensorflow as tf

    from stride.ckptclient import tensorflow as tf_checkpoints

    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4)])
    optimizer = keras.optimizers.Adam(0.1)
    optimizer.build(model.trainable_variables)
    state = tf.train.Checkpoint(model=model, optimizer=optimizer)
    counter = tf.Variable(np.arange(1000, dtype=np.float32))

    def train_step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(tf.ones((2, 8))) ** 2)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        counter.assign_add(tf.ones_like(counter))

    train_step()
    taken = tf_checkpoints.snapshot(state)
    expected = {name: np.array(value) for name, value in taken.items()}
    plain = tf_checkpoints.snapshot(tf.train.Checkpoint(counter=counter))["counter"]
    # Zero-copy: a second snapshot shares the first one's memory; read-only.
    again = tf_checkpoints.snapshot(tf.train.Checkpoint(counter=counter))["counter"]
    assert np.shares_memory(plain, again) and not plain.flags.writeable
    for _ in range(3):
        train_step()
    for name, value in taken.items():
        assert np.array_equal(value, expected[name]), name
    assert np.array_equal(plain, np.arange(1000, dtype=np.float32) + 1)  # as taken
    assert float(counter[0]) == 4.0  # while the variable went on
    current = tf_checkpoints.snapshot(state)
    assert any(not np.array_equal(current[k], expected[k]) for k in expected)  # it trained
    del current

    class Recorder:
        def save(self, step, arrays, **options):
            self.saved = (step, {k: np.array(v) for k, v in arrays.items()}, options)
            return "saved"

    recorder = Recorder()
    before = {k: np.array(v) for k, v in tf_checkpoints.snapshot(state).items()}
    future = tf_checkpoints.save_in_background(recorder, state, 7, shard_snapshot_id="s")
    train_step()
    assert future.result(timeout=60) == "saved"
    step, arrays, options = recorder.saved
    assert step == 7 and options == {"shard_snapshot_id": "s"}
    assert arrays.keys() == before.keys()
    assert all(np.array_equal(arrays[k], before[k]) for k in before)
    print("ok")
    """
)


def test_the_snapshot_is_zero_copy_and_unchanged_by_later_training_steps() -> None:
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-3000:]
