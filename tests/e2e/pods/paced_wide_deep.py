"""A test entrypoint, importable in the e2e suite's pods (the podwatcher's ``PYTHONPATH``):
the wide-and-deep example with its chief paced to ``steps_per_second`` (a hyperparameter)
until a chief takes over from it.

A test that moves a job three times needs the job to still be training after the last move,
however long new pods take to start on a loaded machine. Unpaced, that took a dataset big
enough to train on for minutes, on cores the pod start-ups it waits for needed. Paced, the
first chief's steps cost little while the test waits; the chief that takes over trains at
full speed to the end."""

from __future__ import annotations

import time

import numpy as np
from stride_examples import criteo, wide_deep

from stride.trainer.loop import TrainingContext


def train(ctx: TrainingContext) -> None:
    vocabulary = int(ctx.hyperparameters.get("vocabulary", criteo.VOCABULARY))
    rate = float(ctx.hyperparameters["steps_per_second"])
    paced = not ctx.settings.standby
    next_at = time.monotonic()

    def make_batch(indices: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        nonlocal next_at
        if paced:
            now = time.monotonic()
            if next_at > now:
                time.sleep(next_at - now)
            next_at = max(now, next_at) + 1.0 / rate
        return criteo.make_batch(indices, vocabulary=vocabulary)

    ctx.fit(wide_deep.build_model, make_batch)
