"""Ports for new pods (stride.podwatcher.usecases.PortPicker): never one a pod has already."""

from __future__ import annotations

import pytest

from stride.podwatcher.usecases import PortPicker


def test_a_port_a_probe_returns_again_is_not_handed_out_twice() -> None:
    # A probe finds the same free port again until a pod binds it (a job's worker once got
    # its parameter server's port, and failed at every relaunch).
    probes = iter([47383, 47383, 47383, 50000, 47383, 50001, 50002])
    pick = PortPicker(lambda: next(probes))
    assert pick() == 47383
    assert pick() == 50000
    assert pick(taken={50001}) == 50002  # a port the caller's pods hold is skipped too


def test_no_port_after_many_probes_is_an_error_that_says_so() -> None:
    pick = PortPicker(lambda: 40000)
    assert pick() == 40000
    with pytest.raises(RuntimeError, match="no free port that is not already a pod's"):
        pick()
