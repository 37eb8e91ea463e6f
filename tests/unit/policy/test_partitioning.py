"""GoldMiner's state-aware partitioning (sec. 3.2, Algorithm 1) on small graphs."""

from __future__ import annotations

import pytest

from stride.policy.partitioning import DataflowNode, InvalidGraph, partition


def node(name: str, *inputs: str, stateful: bool = False, device: str = "CPU") -> DataflowNode:
    return DataflowNode(name, tuple(inputs), stateful, device)


# A recommendation model as in the paper's Figure 6: read and parse records, hash and cross
# the ids, then the embedding lookup (which takes the embedding table, a variable) and the
# MLP over it and the dense features.
RECOMMENDER = [
    node("read"),
    node("parse", "read"),
    node("hash", "parse"),
    node("cross", "hash"),
    node("normalize", "parse"),
    node("embedding_table", stateful=True),
    node("lookup", "cross", "embedding_table"),
    node("mlp_weights", stateful=True),
    node("concat", "lookup", "normalize"),
    node("mlp", "concat", "mlp_weights"),
    node("loss", "mlp", "parse"),
]


def test_everything_upstream_of_the_state_goes_to_data_workers() -> None:
    """The search ends at the lookup that takes the table: hashing and crossing go with
    the parsing (the paper's "expected partition"), the rest is the training workers'."""
    result = partition(RECOMMENDER)
    assert result.data_stages == (("read", "parse", "hash", "cross", "normalize"),)
    assert result.train_nodes == (
        "embedding_table",
        "lookup",
        "mlp_weights",
        "concat",
        "mlp",
        "loss",
    )
    # The data queue sits on each edge from a data node into training.
    assert result.crossing == (("cross", "lookup"), ("normalize", "concat"), ("parse", "loss"))
    assert set(result.data_nodes) | set(result.train_nodes) == {n.name for n in RECOMMENDER}


def test_data_nodes_are_cut_into_stages_by_device_in_the_order_data_flows() -> None:
    """Lines 6-9: a GPU decode between two CPU steps makes three stages, raw data first."""
    graph = [
        node("read"),
        node("decode", "read", device="GPU"),
        node("augment", "decode", device="GPU"),
        node("pack", "augment"),
        node("weights", stateful=True),
        node("model", "pack", "weights"),
    ]
    assert partition(graph).data_stages == (("read",), ("decode", "augment"), ("pack",))


def test_features_pre_processed_apart_on_one_device_are_one_stage() -> None:
    """A data worker produces whole mini-batches (sec. 3.3): every feature of one."""
    graph = [
        node("dense"),
        node("ids"),
        node("offsets", "ids"),
        node("table", stateful=True),
        node("lookup", "offsets", "table"),
        node("model", "lookup", "dense"),
    ]
    assert partition(graph).data_stages == (("dense", "ids", "offsets"),)


def test_a_model_with_nothing_upstream_of_its_state_has_no_data_stage() -> None:
    """The fallback: no data workers, the job pre-processes locally."""
    graph = [node("weights", stateful=True), node("model", "weights"), node("loss", "model")]
    result = partition(graph)
    assert result.data_stages == () and result.crossing == ()
    assert result.train_nodes == ("weights", "model", "loss")


def test_a_node_downstream_of_any_state_is_trainings_even_if_it_also_reads_raw_data() -> None:
    graph = [
        node("read"),
        node("weights", stateful=True),
        node("scale", "read", "weights"),
        node("after", "scale"),
    ]
    assert partition(graph).train_nodes == ("weights", "scale", "after")


def test_the_order_nodes_are_given_in_does_not_change_the_partition() -> None:
    """Only the order within the answer follows the order given (ties between nodes)."""
    given, reversed_ = partition(RECOMMENDER), partition(list(reversed(RECOMMENDER)))
    assert set(reversed_.train_nodes) == set(given.train_nodes)
    assert [set(stage) for stage in reversed_.data_stages] == [
        set(stage) for stage in given.data_stages
    ]
    assert set(reversed_.crossing) == set(given.crossing)


@pytest.mark.parametrize(
    ("graph", "problem"),
    [
        ([node("a"), node("a")], r"nodes\[1\].name: node 'a' is named twice"),
        ([node("a", "ghost")], "node 'a' takes input 'ghost', which is no node"),
        ([node("a", "b"), node("b", "a", stateful=True)], "the graph has a cycle"),
        ([node("read"), node("parse", "read")], "no stateful node"),
        ([node("")], r"nodes\[0\].name: is empty"),
        ([DataflowNode("a", (), True, "")], r"nodes\[0\].device: node 'a' has none"),
    ],
)
def test_a_graph_that_cannot_be_partitioned_is_named(
    graph: list[DataflowNode], problem: str
) -> None:
    with pytest.raises(InvalidGraph, match=problem):
        partition(graph)
