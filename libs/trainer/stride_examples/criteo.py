"""A synthetic, Criteo-like click dataset, generated from the sample index alone.

13 dense features and 26 categorical ones, as in Criteo's display-advertising data, with
labels drawn from a hidden logistic model over them, so a model really learns (the loss
falls) and any sample can be made by any worker from its index: nothing is downloaded or
stored, and the same index always gives the same sample (a restore that repeats samples
repeats exactly the same ones).
"""

from __future__ import annotations

import numpy as np

DENSE = 13
CATEGORICAL = 26
VOCABULARY = 1000
"""Ids per categorical feature."""
_HIDDEN_SEED = 20_241_123


def _hidden_model() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(_HIDDEN_SEED)
    dense_weights = rng.normal(0.0, 0.8, size=DENSE).astype(np.float32)
    id_weights = rng.normal(0.0, 0.6, size=(CATEGORICAL, VOCABULARY)).astype(np.float32)
    return dense_weights, id_weights


_DENSE_WEIGHTS, _ID_WEIGHTS = _hidden_model()


def _mix(values: np.ndarray) -> np.ndarray:
    """A fast 64-bit integer hash (splitmix64's finaliser), vectorised."""
    x = values.astype(np.uint64)
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        x = x ^ (x >> np.uint64(31))
    return x


def make_batch(
    indices: np.ndarray, seed: int = 0, vocabulary: int = VOCABULARY
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Dense features (float32, n x 13), categorical ids (int32, n x 26, each below
    ``vocabulary``) and labels (float32, n x 1) of the samples ``indices``. The labels
    depend on ``id % VOCABULARY`` only, so a larger vocabulary makes a bigger model of the
    same task."""
    index = np.asarray(indices, dtype=np.uint64).reshape(-1, 1) + np.uint64(seed) * np.uint64(
        1_000_003
    )
    columns = np.arange(DENSE + CATEGORICAL + 1, dtype=np.uint64).reshape(1, -1)
    with np.errstate(over="ignore"):
        bits = _mix(index * np.uint64(0x9E3779B97F4A7C15) + columns)
    uniform = (bits >> np.uint64(11)).astype(np.float64) / float(1 << 53)
    # Dense: roughly normal (sum of two uniforms, centred and scaled).
    dense = ((uniform[:, :DENSE] + uniform[:, 1 : DENSE + 1] - 1.0) * 2.4).astype(np.float32)
    ids = (bits[:, DENSE : DENSE + CATEGORICAL] % np.uint64(vocabulary)).astype(np.int32)
    hidden = ids % VOCABULARY
    logit = dense @ _DENSE_WEIGHTS + _ID_WEIGHTS[np.arange(CATEGORICAL), hidden].sum(axis=1) * 0.5
    labels = (uniform[:, -1] < 1.0 / (1.0 + np.exp(-logit))).astype(np.float32).reshape(-1, 1)
    return dense, ids, labels
