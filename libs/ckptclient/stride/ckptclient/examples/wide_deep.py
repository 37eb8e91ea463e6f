"""A small Wide & Deep model trained with flash checkpoints, as a user's script would be.

    python -m stride.ckptclient.examples.wide_deep --job job-demo --steps 400 --save-every 20

On start it restores the newest checkpoint of the job, if there is one, and continues from
its step; every ``--save-every`` steps it saves the model and optimizer through the cache.
The batches are a pure function of the step (a stand-in for the dispatcher's shard
positions, whose snapshot id rides in the checkpoint), so a restarted run sees exactly the
data it would have seen. Each step's loss goes to ``--log`` as a JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

CATEGORIES = 100
NUMERIC = 8
WIDE = 32
BATCH = 64


def build_model() -> tuple[Any, Any]:
    """The model and its optimizer, built (so the optimizer's slots exist)."""
    import keras

    category = keras.Input((1,), dtype="int32", name="category")
    numeric = keras.Input((NUMERIC,), name="numeric")
    wide_features = keras.Input((WIDE,), name="wide_features")
    embedded = keras.layers.Flatten(name="flatten")(
        keras.layers.Embedding(CATEGORIES, 8, name="embedding")(category)
    )
    deep = keras.layers.Concatenate(name="deep_inputs")([embedded, numeric])
    deep = keras.layers.Dense(32, activation="relu", name="deep_0")(deep)
    deep = keras.layers.Dense(16, activation="relu", name="deep_1")(deep)
    wide = keras.layers.Dense(1, name="wide")(wide_features)
    logit = keras.layers.Dense(1, name="logit")(
        keras.layers.Concatenate(name="wide_and_deep")([wide, deep])
    )
    model = keras.Model([category, numeric, wide_features], logit, name="wide_deep")
    optimizer = keras.optimizers.Adam(learning_rate=0.01)
    optimizer.build(model.trainable_variables)
    return model, optimizer


def batch(step: int, seed: int = 7) -> tuple[list[np.ndarray], np.ndarray]:
    """The batch of ``step``: synthetic click data from a fixed hidden rule."""
    truth = np.random.default_rng(seed)
    category_effect = truth.standard_normal(CATEGORIES)
    numeric_weights = truth.standard_normal(NUMERIC)
    wide_weights = truth.standard_normal(WIDE)
    rng = np.random.default_rng(seed * 1_000_003 + step)
    category = rng.integers(0, CATEGORIES, (BATCH, 1)).astype(np.int32)
    numeric = rng.standard_normal((BATCH, NUMERIC)).astype(np.float32)
    wide = (rng.random((BATCH, WIDE)) < 0.1).astype(np.float32)
    score = category_effect[category[:, 0]] + numeric @ numeric_weights + wide @ wide_weights
    labels = (score + 0.3 * rng.standard_normal(BATCH) > 0).astype(np.float32)[:, None]
    return [category, numeric, wide], labels


def digest(root: Any) -> str:
    """A fingerprint of every variable's name, dtype, shape and bytes (CRC-32C)."""
    import google_crc32c

    from stride.ckptclient.tensorflow import variables_of

    crc = 0
    for name, variable in sorted(variables_of(root).items()):
        value = np.ascontiguousarray(variable.numpy())
        described = f"{name}:{value.dtype.str}:{value.shape}".encode()
        crc = int(google_crc32c.extend(crc, described + value.tobytes()))
    return f"{crc:08x}"


def main(argv: list[str] | None = None) -> int:
    """Train, restoring first and saving every ``--save-every`` steps."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--job", default=os.environ.get("STRIDE_JOB_ID", ""))
    parser.add_argument("--address", default=None, help="the checkpoint cache (host:port)")
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--save-every", type=int, default=20)
    parser.add_argument("--log", type=Path, default=None, help="append JSON lines here")
    args = parser.parse_args(argv)

    import tensorflow as tf

    from stride.ckptclient import CheckpointCacheError, CheckpointClient
    from stride.ckptclient import tensorflow as tf_checkpoints

    log = args.log.open("a", buffering=1) if args.log else sys.stdout

    def record(**fields: Any) -> None:
        log.write(json.dumps({"pid": os.getpid(), **fields}) + "\n")

    model, optimizer = build_model()
    state = tf.train.Checkpoint(model=model, optimizer=optimizer)
    loss_fn = tf.keras.losses.BinaryCrossentropy(from_logits=True)

    def eager_step(inputs: list[tf.Tensor], labels: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(inputs, training=True))
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))
        return loss

    train_step = tf.function(eager_step)
    client = CheckpointClient(args.address, args.job or None)
    start = 0
    try:
        started = time.perf_counter()
        restored = tf_checkpoints.restore(client, state)
        start = restored.step
        record(
            event="restored",
            step=start,
            digest=digest(state),
            transport=restored.transport,
            snapshot=restored.shard_snapshot_id,
            seconds=round(time.perf_counter() - started, 4),
        )
    except CheckpointCacheError as error:
        if error.code.name != "NOT_FOUND":
            raise
        record(event="fresh", step=0)
    for step in range(start + 1, args.steps + 1):
        inputs, labels = batch(step)
        loss = float(train_step([tf.constant(x) for x in inputs], tf.constant(labels)))
        record(event="step", step=step, loss=loss)
        if step % args.save_every == 0:
            record(event="saving", step=step, digest=digest(state))
            saved = tf_checkpoints.save(client, state, step, shard_snapshot_id=f"data-step-{step}")
            record(
                event="saved",
                step=step,
                transport=saved.transport,
                blocking_seconds=round(saved.blocking_seconds, 5),
            )
    record(event="done", step=args.steps)
    client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
