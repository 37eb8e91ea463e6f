"""A click-through model whose pre-processing is CPU-heavy: the job of
``examples/criteo-text.yaml``, the data-worker case of GoldMiner (sec. 2, Figure 6).

Its samples are the synthetic Criteo-like ones of :mod:`stride_examples.criteo`, kept as
raw text records as the real dataset is: a label, 13 dense values and 26 categorical values
written as 8-hex-digit hashes, tab-separated. The model takes the raw record and does the
rest itself:

- ``decode``: split the record, parse the dense values, keep the categorical strings;
- ``hash_ids``: hash each categorical string into a bucket of its feature;
- ``cross``: hash each pair of neighbouring categorical strings into a crossed feature;
- then the embeddings (the model's state) and the Wide & Deep example's deep tower over
  them and the dense values.

None of the first three holds state, so GoldMiner's partitioning
(``stride.trainer.partition``) moves them to data workers: on trainer cores alone they
cost more than the model's own step.
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
import tensorflow as tf

from stride.trainer.loop import TrainingContext
from stride_examples import criteo, wide_deep

BUCKETS = 1009
"""Hash buckets per categorical feature."""
CROSSED = criteo.CATEGORICAL - 1
"""Crossed features: each categorical one with the next."""


def make_records(indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The raw text records (bytes, n x 1) and labels (float32, n x 1) of ``indices``."""
    dense, ids, labels = criteo.make_batch(indices)
    columns = np.arange(criteo.CATEGORICAL, dtype=np.uint64).reshape(1, -1)
    with np.errstate(over="ignore"):
        hashed = criteo._mix(ids.astype(np.uint64) * np.uint64(1_000_003) + columns)
    records = [
        "\t".join(
            [
                f"{int(label[0])}",
                *(f"{value:.4f}" for value in row_dense),
                *(f"{int(value) & 0xFFFFFFFF:08x}" for value in row_ids),
            ]
        ).encode()
        for label, row_dense, row_ids in zip(labels, dense, hashed, strict=True)
    ]
    return np.array(records, dtype=object).reshape(-1, 1), labels


@keras.saving.register_keras_serializable(package="stride_examples")
class Decode(keras.layers.Layer):  # type: ignore[misc]  # keras is untyped
    """A raw record to its dense values (float32, n x 13) and categorical strings (n x 26)."""

    def call(self, records: Any) -> tuple[Any, Any]:
        fields = tf.strings.split(tf.reshape(records, [-1]), "\t").to_tensor(
            shape=[None, 1 + criteo.DENSE + criteo.CATEGORICAL]
        )
        dense = tf.strings.to_number(fields[:, 1 : 1 + criteo.DENSE], tf.float32)
        return dense, fields[:, 1 + criteo.DENSE :]

    def compute_output_spec(self, records: Any) -> tuple[Any, Any]:
        batch = records.shape[0]
        return (
            keras.KerasTensor((batch, criteo.DENSE), dtype="float32"),
            keras.KerasTensor((batch, criteo.CATEGORICAL), dtype="string"),
        )


@keras.saving.register_keras_serializable(package="stride_examples")
class HashIds(keras.layers.Layer):  # type: ignore[misc]  # keras is untyped
    """Each categorical string to a bucket of its own feature (n x 26 ids, disjoint ranges
    per feature, so one embedding table serves all)."""

    def call(self, strings: Any) -> Any:
        buckets = tf.strings.to_hash_bucket_fast(strings, BUCKETS)
        return buckets + tf.range(criteo.CATEGORICAL, dtype=tf.int64) * BUCKETS

    def compute_output_spec(self, strings: Any) -> Any:
        return keras.KerasTensor((strings.shape[0], criteo.CATEGORICAL), dtype="int64")


@keras.saving.register_keras_serializable(package="stride_examples")
class Cross(keras.layers.Layer):  # type: ignore[misc]  # keras is untyped
    """Each categorical string crossed with the next one's (n x 25 ids, after the 26
    features' ranges)."""

    def call(self, strings: Any) -> Any:
        pairs = tf.strings.join([strings[:, :-1], strings[:, 1:]], separator="x")
        buckets = tf.strings.to_hash_bucket_fast(pairs, BUCKETS)
        first = criteo.CATEGORICAL * BUCKETS
        return buckets + first + tf.range(CROSSED, dtype=tf.int64) * BUCKETS

    def compute_output_spec(self, strings: Any) -> Any:
        return keras.KerasTensor((strings.shape[0], CROSSED), dtype="int64")


def build_model(ctx: TrainingContext) -> Any:
    """The model from a raw record to a click logit."""
    dimension = int(ctx.spec.model.embedding_dim or ctx.hyperparameters.get("embedding_dim", 8))
    record = keras.Input((1,), dtype="string", name="record")
    dense, strings = Decode(name="decode")(record)
    ids = keras.layers.Concatenate(name="ids")(
        [HashIds(name="hash_ids")(strings), Cross(name="cross")(strings)]
    )
    table = (criteo.CATEGORICAL + CROSSED) * BUCKETS
    embedded = keras.layers.Embedding(table, dimension, name="embeddings")(ids)
    logit = wide_deep.deep_tower(embedded, dense, "logit")
    # A list of one input, as the training loop calls a model with its list of inputs.
    return keras.Model([record], logit, name="criteo_text")


def train(ctx: TrainingContext) -> None:
    """The job's entrypoint."""
    ctx.fit(build_model, make_records)
