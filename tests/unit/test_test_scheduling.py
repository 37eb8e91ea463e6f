"""The test suite's worker scheduling (stride.testing.scheduling), run as `make test` runs
it: an inner pytest with two xdist workers and --dist loadgroup."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from stride.testing.scheduling import group_of

CONFTEST = """
import pytest
from stride.testing.scheduling import grouped_by_file

@pytest.hookimpl(tryfirst=True)
def pytest_xdist_make_scheduler(config, log):
    return grouped_by_file(config, log, {"test_heavy.py": "heavy"})
"""

HEAVY = """
import time

def test_1(): time.sleep(0.3)
def test_2(): time.sleep(0.3)
def test_3(): time.sleep(0.3)
def test_4(): time.sleep(0.3)
"""

LIGHT = """
def test_1(): pass
def test_2(): pass
def test_3(): pass
def test_4(): pass
"""


def test_a_groups_files_run_on_one_worker_and_the_rest_spread(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_heavy.py").write_text(HEAVY)
    (tmp_path / "test_light.py").write_text(LIGHT)
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-v",
         "-p", "no:cacheprovider"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    placed = re.findall(r"\[(gw\d)\] .*PASSED (test_\w+)\.py::", run.stdout)
    heavy = {worker for worker, file in placed if file == "test_heavy"}
    light = {worker for worker, file in placed if file == "test_light"}
    assert len(placed) == 8, run.stdout
    assert len(heavy) == 1, run.stdout  # one worker, one after another
    assert light - heavy, run.stdout  # the rest ran beside them


def test_the_group_is_told_by_the_file() -> None:
    groups = {"test_training.py": "tensorflow", "e2e/test_replay.py": "suite"}
    assert group_of("tests/e2e/test_training.py::test_x[a-b]", groups) == "tensorflow"
    assert group_of("test_training.py::Class::test_y", groups) == "tensorflow"
    assert group_of("tests/e2e/test_training_more.py::test_x", groups) is None
    assert group_of("tests/e2e/my_test_training.py::test_x", groups) is None
    assert group_of("tests/unit/test_x.py::test_training.py", groups) is None
    assert group_of("tests/e2e/test_replay.py::test_x", groups) == "suite"
    assert group_of("tests/unit/sim/test_replay.py::test_x", groups) is None
