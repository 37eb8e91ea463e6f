"""GoldMiner's partitioning on real Keras models: the cut is where Algorithm 1 puts it, and
the two halves compute what the whole model computes."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import keras
import numpy as np
from stride_examples import criteo, criteo_text, wide_deep

from stride.trainer.partition import split_model


def test_the_wide_deep_examples_feature_offsets_move_to_data_workers() -> None:
    """The ids' offsets hold no state: they move. The embeddings take the tables: they and
    everything after them stay, and the dense features cross the queue as they are."""
    ctx = SimpleNamespace(spec=SimpleNamespace(model=SimpleNamespace(embedding_dim=4)))
    ctx.hyperparameters = {"vocabulary": 50}
    model = wide_deep.build_model(cast(Any, ctx))
    split = split_model(model)
    assert split.partition.data_stages == (
        ("categorical_ids", "feature_offsets", "dense_features"),
    )
    assert set(split.partition.crossing) == {
        ("feature_offsets", "wide_weights"),
        ("feature_offsets", "deep_embeddings"),
        ("dense_features", "deep_input"),
    }
    assert split.data_model is not None
    assert [t.name for t in split.data_model.inputs] == ["dense_features", "categorical_ids"]
    dense, ids, _ = criteo.make_batch(np.arange(64), vocabulary=50)
    whole = model([dense, ids])
    halves = split.train_model(split.data_model([dense, ids]))
    np.testing.assert_allclose(np.asarray(halves), np.asarray(whole), rtol=1e-6)
    # Weights are shared, not copied: training the half trains the model.
    assert {id(w) for w in split.train_model.weights} == {id(w) for w in model.weights}


def test_hashing_and_crossing_strings_run_on_data_workers() -> None:
    """The paper's recommendation case: string features hashed and crossed, then looked up."""
    city = keras.Input((1,), dtype="string", name="city")
    device = keras.Input((1,), dtype="string", name="device")
    hashed = keras.layers.Hashing(num_bins=97, name="hash_city")(city)
    crossed = keras.layers.HashedCrossing(num_bins=101, name="cross")((city, device))
    ids = keras.layers.Concatenate(name="ids")([hashed, crossed])
    embedded = keras.layers.Embedding(101, 3, name="embedding")(ids)
    logit = keras.layers.Dense(1, name="logit")(keras.layers.Flatten(name="flat")(embedded))
    model = keras.Model([city, device], logit)
    split = split_model(model)
    assert split.partition.data_stages == (("city", "device", "hash_city", "cross", "ids"),)
    assert split.partition.train_nodes == ("embedding", "flat", "logit")
    assert split.data_model is not None
    cities = np.array([["paris"], ["oslo"], ["lima"]])
    devices = np.array([["phone"], ["tv"], ["phone"]])
    np.testing.assert_allclose(
        np.asarray(split.train_model(split.data_model([cities, devices]))),
        np.asarray(model([cities, devices])),
        rtol=1e-6,
    )


def test_a_model_whose_inputs_go_straight_into_its_state_keeps_its_pre_processing() -> None:
    """Nothing but the inputs upstream of the state: no data model (GoldMiner's fallback
    to local pre-processing)."""
    features = keras.Input((4,), name="features")
    model = keras.Model(features, keras.layers.Dense(1, name="logit")(features))
    split = split_model(model)
    assert split.data_model is None and split.train_model is model
    assert split.partition.data_stages == (("features",),)


def test_the_text_examples_decoding_hashing_and_crossing_move_to_data_workers() -> None:
    """examples/criteo-text.yaml: the raw record is decoded, hashed and crossed in the model,
    and all of that is upstream of its embeddings."""
    ctx = SimpleNamespace(spec=SimpleNamespace(model=SimpleNamespace(embedding_dim=4)))
    ctx.hyperparameters = {}
    model = criteo_text.build_model(cast(Any, ctx))
    split = split_model(model)
    assert split.partition.data_stages == (("record", "decode", "hash_ids", "cross", "ids"),)
    assert split.partition.train_nodes[0] == "embeddings"
    assert split.data_model is not None
    records, labels = criteo_text.make_records(np.arange(32))
    np.testing.assert_allclose(
        np.asarray(split.train_model(split.data_model([records]))),
        np.asarray(model([records])),
        rtol=1e-6,
    )
    # The records are the synthetic samples themselves, as text.
    dense, _, expected_labels = criteo.make_batch(np.arange(32))
    decoded_dense, strings = criteo_text.Decode()(records)
    np.testing.assert_allclose(np.asarray(decoded_dense), dense, atol=5e-5)
    np.testing.assert_array_equal(labels, expected_labels)
    assert np.asarray(strings).shape == (32, criteo.CATEGORICAL)
    again, _ = criteo_text.make_records(np.array([5, 3]))
    np.testing.assert_array_equal(again, records[[5, 3]])
