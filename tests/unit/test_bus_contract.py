"""The bus contract has one home: ``stride.bus.topics``.

Subjects and stream names may appear in prose (docstrings, comments), but code that spells
one anywhere else — a producer, a consumer, a test, a benchmark — fails here, because a
second spelling is how a producer and its consumers drift apart.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from stride.bus import topics
from stride.bus.topics import Topic
from stride.events.v1 import job_pb2, plan_pb2

ROOT = Path(__file__).resolve().parents[2]
REGISTRY = ROOT / "libs" / "bus" / "stride" / "bus" / "topics.py"
THIS_TEST = Path(__file__).resolve()
"""Checks the registry's own subjects, so it spells some on purpose."""
SCANNED = ("libs", "services", "tests", "bench")
SUBJECT = re.compile(
    r"stride\.(jobs|plans|pods|shards|metrics|checkpoints)\.v1|stride\.deadletter|stride\.executor\.v1"
)
STREAM_NAMES = {stream.name for stream in topics.STREAMS}


def _source_files() -> Iterator[Path]:
    for top in SCANNED:
        for path in (ROOT / top).rglob("*.py"):
            parts = set(path.relative_to(ROOT).parts)
            if ".venv" in parts or "protos" in parts or path in (REGISTRY, THIS_TEST):
                continue
            yield path


def _docstring_nodes(tree: ast.Module) -> set[int]:
    found: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            # The docstring, and an attribute docstring after each assignment.
            for index, statement in enumerate(body):
                if (
                    isinstance(statement, ast.Expr)
                    and isinstance(statement.value, ast.Constant)
                    and (index == 0 or isinstance(body[index - 1], ast.Assign | ast.AnnAssign))
                ):
                    found.add(id(statement.value))
    return found


def _literals(path: Path) -> Iterator[tuple[int, str]]:
    tree = ast.parse(path.read_text(), str(path))
    prose = _docstring_nodes(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose:
            yield node.lineno, node.value


def test_no_subject_or_stream_is_spelled_outside_the_registry() -> None:
    offenders = []
    for path in _source_files():
        for line, text in _literals(path):
            if SUBJECT.search(text) or any(name in text for name in STREAM_NAMES):
                offenders.append(f"{path.relative_to(ROOT)}:{line}: {text[:60]!r}")
    assert not offenders, "spell these through stride.bus.topics:\n" + "\n".join(offenders)


def test_the_guard_sees_a_literal_and_ignores_prose(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        '"""Publishes on stride.plans.v1.<job>."""\n'
        'X = 1\n"""attribute docs: STRIDE_JOBS"""\n'
        'def f(job: str) -> str:\n    return f"stride.plans.v1.{job}"\n'
        'STREAM = "STRIDE_PODS"\n'
    )
    found = [text for _, text in _literals(sample)]
    assert "stride.plans.v1." in found and "STRIDE_PODS" in found
    assert not any("attribute docs" in text or "Publishes" in text for text in found)


def test_every_topic_lives_in_its_stream_and_no_two_share_a_subject() -> None:
    patterns = [topic.pattern() for topic in topics.TOPICS]
    assert len(set(patterns)) == len(patterns)
    for topic in topics.TOPICS:
        (stream_subjects,) = topic.stream.subjects
        assert topic.pattern().startswith(stream_subjects.removesuffix(">"))
        assert topic.stream in topics.STREAMS
    names = [topic.name for topic in topics.TOPICS]
    assert len(set(names)) == len(names)


def test_a_topic_builds_and_reads_back_its_subjects() -> None:
    assert topics.PLAN.subject("job-1") == "stride.plans.v1.job-1"
    assert topics.POD_FAILED.subject("job-1") == "stride.pods.v1.job-1.failed"
    assert topics.POD_FAILED.pattern() == "stride.pods.v1.*.failed"
    assert topics.POD_FAILED.key_of("stride.pods.v1.job-1.failed") == "job-1"
    assert topics.POD_FAILED.key_of("stride.pods.v1.job-1.deleted") is None
    assert topics.PLAN.key_of("stride.plans.v1.a.b") is None
    assert (
        topics.EXECUTOR_RUN.subject("cold-start-plan") == "stride.executor.v1.run.cold-start-plan"
    )


@pytest.mark.parametrize("key", ["", "a.b", "*", ">", "a b", "x" * 300])
def test_a_key_that_is_not_one_subject_token_is_refused(key: str) -> None:
    with pytest.raises(topics.BadKey):
        topics.JOB_FINISHED.subject(key)


def test_a_topic_refuses_a_payload_of_another_type() -> None:
    plan_topic: Topic[plan_pb2.ResourcePlan] = topics.PLAN
    with pytest.raises(TypeError, match="ResourcePlan"):
        plan_topic.outgoing("job-1", job_pb2.JobFinished(job_id="job-1"), "id-1")  # type: ignore[arg-type]
    event = topics.JOB_FINISHED.outgoing("job-1", job_pb2.JobFinished(job_id="job-1"), "id-1")
    assert event.subject == "stride.jobs.v1.finished.job-1"
    assert event.headers[topics.TYPE_HEADER] == "stride.events.v1.JobFinished"
