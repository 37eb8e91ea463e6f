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

from stride.trainer.loop import TrainingContext
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
    deep = keras.layers.Concatenate(name="deep_input")(
        [keras.layers.Flatten(name="deep_flatten")(embedded), dense_in]
    )
    deep = keras.layers.Dense(64, activation="relu", name="deep_1")(deep)
    deep = keras.layers.Dense(32, activation="relu", name="deep_2")(deep)
    deep = keras.layers.Dense(1, name="deep_logit")(deep)
    logit = keras.layers.Add(name="logit")([wide, deep])
    return keras.Model([dense_in, ids_in], logit, name="wide_and_deep")


def train(ctx: TrainingContext) -> None:
    """The job's entrypoint."""

    vocabulary = int(ctx.hyperparameters.get("vocabulary", criteo.VOCABULARY))

    def make_batch(indices: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return criteo.make_batch(indices, vocabulary=vocabulary)

    ctx.fit(build_model, make_batch)
