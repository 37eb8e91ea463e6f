"""Wide & Deep (Cheng et al., 2016) for click-through prediction on the synthetic
Criteo-like data: the job of ``examples/wide-deep.yaml``.

``train(ctx)`` is the job's entrypoint (``model.entrypoint: stride_examples.wide_deep:train``).
It builds the model inside the job's ParameterServerStrategy and hands it to Stride's
standard loop; the variables (the embedding tables above all) live on the parameter servers.
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
import tensorflow as tf

from stride.trainer.loop import TrainingContext, say
from stride_examples import criteo


def build_model(ctx: TrainingContext) -> Any:
    """The Wide & Deep model: a linear part over the ids and an MLP over embeddings and
    dense features, summed into one logit. ``vocabulary`` (hyperparameter) sets the ids per
    feature, so the same job can carry a large state (the migration benchmark's 1 GiB)."""
    dimension = int(ctx.spec.model.embedding_dim or ctx.hyperparameters.get("embedding_dim", 8))
    vocabulary = int(ctx.hyperparameters.get("vocabulary", criteo.VOCABULARY))
    ids_total = criteo.CATEGORICAL * vocabulary
    dense_in = keras.Input((criteo.DENSE,), name="dense_features")
    ids_in = keras.Input((criteo.CATEGORICAL,), dtype="int32", name="categorical_ids")
    offsets = tf.constant(np.arange(criteo.CATEGORICAL) * vocabulary, dtype=tf.int32)
    shifted = keras.layers.Lambda(
        lambda ids: ids + offsets, output_shape=(criteo.CATEGORICAL,), name="feature_offsets"
    )(ids_in)
    wide = keras.layers.Embedding(ids_total, 1, name="wide_weights")(shifted)
    wide = keras.layers.Lambda(
        lambda w: tf.reduce_sum(w, axis=1), output_shape=(1,), name="wide_sum"
    )(wide)
    embedded = keras.layers.Embedding(ids_total, dimension, name="deep_embeddings")(shifted)
    deep = deep_tower(embedded, dense_in, "deep_logit")
    logit = keras.layers.Add(name="logit")([wide, deep])
    return keras.Model([dense_in, ids_in], logit, name="wide_and_deep")


def deep_tower(embedded: Any, dense: Any, name: str) -> Any:
    """The deep part: an MLP over the flattened embeddings and the dense features, to one
    logit named ``name``."""
    deep = keras.layers.Concatenate(name="deep_input")(
        [keras.layers.Flatten(name="deep_flatten")(embedded), dense]
    )
    deep = keras.layers.Dense(64, activation="relu", name="deep_1")(deep)
    deep = keras.layers.Dense(32, activation="relu", name="deep_2")(deep)
    return keras.layers.Dense(1, name=name)(deep)


def train(ctx: TrainingContext) -> None:
    """The job's entrypoint."""

    vocabulary = int(ctx.hyperparameters.get("vocabulary", criteo.VOCABULARY))

    def make_batch(indices: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return criteo.make_batch(indices, vocabulary=vocabulary)

    ctx.fit(build_model, make_batch)


def train_own_loop(ctx: TrainingContext) -> None:
    """The same model in a loop of one's own (``model.entrypoint:
    stride_examples.wide_deep:train_own_loop``): what an entrypoint gets besides
    :meth:`~stride.trainer.loop.TrainingContext.fit` is the strategy, its coordinator and a
    ``tf.data`` dataset of the job's sample indices from the dispatcher. (Such a loop moves
    to a new cluster by re-execution, and checkpoints are its own to make.)"""
    vocabulary = int(ctx.hyperparameters.get("vocabulary", criteo.VOCABULARY))
    strategy, coordinator = ctx.strategy, ctx.coordinator
    ctx.agent.watch_control()
    ctx.create_dataset()
    with strategy.scope():
        model = build_model(ctx)
        optimizer = keras.optimizers.Adam(float(ctx.hyperparameters.get("learning_rate", 0.001)))
        optimizer.build(model.trainable_variables)

    @tf.function  # type: ignore[untyped-decorator]
    def step(dense: Any, ids: Any, labels: Any) -> Any:
        def replica(dense: Any, ids: Any, labels: Any) -> Any:
            with tf.GradientTape() as tape:
                logits = model([dense, ids], training=True)
                loss = tf.reduce_mean(
                    tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits)
                )
            gradients = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))
            return loss

        return strategy.run(replica, args=(dense, ids, labels))

    losses = []
    for number, indices in enumerate(ctx.index_dataset().as_numpy_iterator(), start=1):
        result = coordinator.schedule(
            step, args=criteo.make_batch(np.asarray(indices), vocabulary=vocabulary)
        )
        if number % 10 == 0:
            coordinator.join()
            losses.append(float(result.fetch()))
            say("own loop", step=number, loss=round(losses[-1], 5))
    coordinator.join()
