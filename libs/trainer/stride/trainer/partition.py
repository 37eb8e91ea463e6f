"""GoldMiner's state-aware partitioning (``stride.policy.partitioning``) applied to a job's
Keras model: the layers upstream of all model state (feature offsets, hashing, crossing,
parsing done in the model) split off into a model of their own that stateless data workers
can run, and the rest kept as the model the trainers train.

Departure from the paper: GoldMiner partitions TensorFlow's graph operation by operation
and so can cut inside a layer (an embedding column's hashing before its lookup). Here the
nodes are the functional model's layers: a layer with any weights is stateful and stays
with training whole, even if training never changes its weights (an adapted
``Normalization``), which is never wrong, only less than could move. The cut is where the
paper's is for models written as layers: hashing and crossing layers move, the embedding
lookup that takes the table stays.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import keras

from stride.policy.partitioning import DataflowNode, Partition, partition


@dataclass(frozen=True)
class ModelSplit:
    """A model cut in two at the data queue."""

    partition: Partition
    data_model: Any | None
    """The model's inputs to the tensors that cross into training (what a data worker
    computes for a mini-batch); None when nothing but the inputs is upstream of the state
    (the job pre-processes locally: data workers would not pay)."""
    train_model: Any
    """Those tensors to the model's outputs (what the trainers train); the whole model when
    ``data_model`` is None. Its layers are the original's, weights shared."""


def model_graph(model: Any) -> list[DataflowNode]:
    """One node per layer of a functional Keras model, in the model's order; stateful when
    the layer has weights."""
    return [
        DataflowNode(
            name=layer.name,
            inputs=tuple(_producer(tensor).name for tensor in _inputs_of(layer, model)),
            stateful=bool(layer.weights),
        )
        for layer in model.layers
    ]


def split_model(model: Any) -> ModelSplit:
    """Cut ``model`` where Algorithm 1 puts the data queue."""
    cut = partition(model_graph(model))
    data = set(cut.data_nodes)
    if not data - {_producer(tensor).name for tensor in model.inputs}:
        return ModelSplit(cut, None, model)
    crossing: list[Any] = []
    for layer in model.layers:
        if layer.name in data:
            continue
        for tensor in _inputs_of(layer, model):
            if _producer(tensor).name in data and not any(tensor is t for t in crossing):
                crossing.append(tensor)
    data_model = keras.Model(model.inputs, crossing, name=f"{model.name}_data")
    train_model = keras.Model(crossing, model.outputs, name=f"{model.name}_train")
    return ModelSplit(cut, data_model, train_model)


def _inputs_of(layer: Any, model: Any) -> list[Any]:
    """The tensors ``layer`` takes in ``model`` (its calls that belong to this model)."""
    # Keras 3 keeps a layer's calls as its inbound nodes; a model's own are in
    # ``_nodes_by_depth`` (a layer shared with another model has calls outside it).
    own = {id(node) for nodes in model._nodes_by_depth.values() for node in nodes}
    return [
        tensor for node in layer._inbound_nodes if id(node) in own for tensor in node.input_tensors
    ]


def _producer(tensor: Any) -> Any:
    return tensor._keras_history.operation
