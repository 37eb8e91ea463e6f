"""Keeping some test files on one pytest-xdist worker, one test after another.

``--dist loadgroup`` is meant to do it with ``xdist_group`` markers, but xdist 3.8 groups by
an ``@group`` suffix it writes into each node id, which pytest 9.2's structured node ids no
longer take: the markers group nothing and no error says so (pytest-dev/pytest-xdist#1386,
open). :func:`grouped_by_file` tells the group from the test's file instead, through
xdist's scheduler hook; a conftest returns it from ``pytest_xdist_make_scheduler``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest


def group_of(nodeid: str, groups: Mapping[str, str]) -> str | None:
    """The group of the test ``nodeid`` by its file (``groups``: a file's path, or its end
    from a ``/`` on, such as ``e2e/test_replay.py``, -> group)."""
    path = "/" + nodeid.split("::", 1)[0]
    for file, group in groups.items():
        if path.endswith("/" + file):
            return group
    return None


def grouped_by_file(config: pytest.Config, log: Any, groups: Mapping[str, str]) -> Any:
    """Under ``--dist loadgroup``, xdist's load-group scheduler whose groups are ``groups``'
    files: each group's tests run on one worker, one after another, and every other test is
    a unit of its own. None under any other ``--dist`` (xdist then picks its own)."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling  # type: ignore[import-untyped]

    class ByFile(LoadGroupScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid, groups) or nodeid

    return ByFile(config, log)
