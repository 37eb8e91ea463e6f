"""The shared vocabulary, and the guard that keeps each word spelled once."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pytest

from stride.runtime.errors import InvalidArgument
from stride.vocabulary import (
    JOB_ID_PATTERN,
    MAX_CPU_CORES,
    MAX_JOB_ID_LENGTH,
    MAX_MEMORY_BYTES,
    MAX_NAME_LENGTH,
    MAX_POD_NAME_LENGTH,
    MAX_PODS_PER_ROLE,
    NAME_PATTERN,
    POD_NAME_PATTERN,
    InvalidWord,
    Resources,
    Role,
    check_cpu,
    check_job_id,
    check_memory_bytes,
    check_name,
    check_pod_count,
    check_pod_name,
    echo,
)

ROOT = Path(__file__).resolve().parents[2]
HOME = ROOT / "libs" / "vocabulary"
GENERATED = ROOT / "libs" / "protos"
DUPLICATES = {
    "a Role enum": re.compile(r"^\s*class Role\(", re.M),
    "the job-id pattern": re.compile(r"\{0,63\}"),
    "the name pattern": re.compile(re.escape("[A-Za-z0-9][A-Za-z0-9._-]{0,127}")),
    "the pod-name pattern": re.compile(re.escape("[A-Za-z0-9][A-Za-z0-9._-]{0,252}")),
    "a vocabulary limit": re.compile(
        r"^(MAX_JOB_ID_LENGTH|MAX_NAME_LENGTH|MAX_POD_NAME_LENGTH|MAX_PODS_PER_ROLE|"
        r"MAX_CPU_CORES|MAX_MEMORY_BYTES)\s*[:=]",
        re.M,
    ),
}


def sources() -> list[Path]:
    """Every hand-written Python file under libs/ and services/ outside the vocabulary."""
    found = [
        path
        for top in ("libs", "services")
        for path in sorted((ROOT / top).rglob("*.py"))
        if HOME not in path.parents and GENERATED not in path.parents
    ]
    assert len(found) > 100, "the scan found too few files to mean anything"
    return found


KNOWN: set[tuple[str, str]] = set()
"""Duplicates in files this guard's authors could not change at the time; never add one."""


def test_each_shared_word_is_defined_only_in_the_vocabulary() -> None:
    found = []
    for path in sources():
        text = path.read_text(encoding="utf-8")
        relative = path.relative_to(ROOT).as_posix()
        for word, pattern in DUPLICATES.items():
            if (relative, word) in KNOWN:
                continue
            for match in pattern.finditer(text):
                line = text.count("\n", 0, match.start()) + 1
                found.append(f"{relative}:{line}: {word}")
    assert not found, "import these from stride.vocabulary instead:\n" + "\n".join(found)


@pytest.mark.parametrize(
    "text",
    [
        "class Role(Enum):\n",
        "    class Role(str, Enum):\n",
        'JOB = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")\n',
        'DATASET = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")\n',
        'POD = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$")\n',
        "MAX_MEMORY_BYTES = 2**53\n",
    ],
)
def test_the_guard_recognises_a_duplicate(text: str) -> None:
    assert any(pattern.search(text) for pattern in DUPLICATES.values())


@pytest.mark.parametrize(
    "text",
    [
        "class RoleResources:\n",
        'SEGMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,127}\\.seg$")\n',
        "from stride.vocabulary import MAX_MEMORY_BYTES, Role\n",
    ],
)
def test_the_guard_leaves_other_code_alone(text: str) -> None:
    assert not any(pattern.search(text) for pattern in DUPLICATES.values())


def test_the_old_homes_re_export_the_vocabulary_role() -> None:
    from stride.agent.domain import identity
    from stride.policy import plans

    assert plans.Role is identity.Role is Role


def test_role_values() -> None:
    assert [role.value for role in Role] == ["ps", "worker", "data_worker", "chief"]


@pytest.mark.parametrize(
    ("text", "role"),
    [
        ("worker", Role.WORKER),
        ("PS", Role.PS),
        ("data_worker", Role.DATA_WORKER),
        ("data-worker", Role.DATA_WORKER),
        ("ROLE_DATA_WORKER", Role.DATA_WORKER),
        ("ROLE_CHIEF", Role.CHIEF),
        ("role_ps", Role.PS),
        (" Worker ", Role.WORKER),
    ],
)
def test_roles_parse_from_every_spelling(text: str, role: Role) -> None:
    assert Role.parse(text) is role


@pytest.mark.parametrize("text", ["boss", "", "ROLE_UNSPECIFIED", "workers"])
def test_an_unknown_role_names_the_choices(text: str) -> None:
    with pytest.raises(InvalidWord, match="ps, worker, data_worker, chief") as raised:
        Role.parse(text, "pod.role")
    assert raised.value.field == "pod.role"
    assert isinstance(raised.value, ValueError)


@pytest.mark.parametrize("job_id", ["job-1a2b3c4d5e6f", "a", "A_b-9", "j" * MAX_JOB_ID_LENGTH])
def test_good_job_ids(job_id: str) -> None:
    assert check_job_id(job_id) == job_id


@pytest.mark.parametrize(
    ("job_id", "problem"),
    [
        ("", "is required"),
        ("job.1", "'job.1' must be 1-64 letters"),
        ("job 1", "must be"),
        ("job*", "must be"),
        ("job-1\n", "must be"),
        ("job>", "must be"),
        ("-x", "starting with a letter or digit"),
        ("j" * (MAX_JOB_ID_LENGTH + 1), "must be"),
    ],
)
def test_bad_job_ids(job_id: str, problem: str) -> None:
    with pytest.raises(InvalidWord) as raised:
        check_job_id(job_id, "spec.job")
    assert raised.value.field == "spec.job"
    assert problem in raised.value.problem


def test_a_check_raises_the_callers_error_type() -> None:
    with pytest.raises(InvalidArgument) as raised:
        check_job_id("a.b", "header.job_id", raise_as=InvalidArgument)
    assert str(raised.value).startswith("header.job_id: 'a.b' must be")
    with pytest.raises(InvalidArgument, match="dataset: is required"):
        check_name("", "dataset", raise_as=InvalidArgument)
    with pytest.raises(InvalidArgument, match=r"^worker: "):
        check_pod_name("a b", "worker", raise_as=InvalidArgument)


def test_names() -> None:
    assert check_name("criteo.v2_x-1", "dataset") == "criteo.v2_x-1"
    assert check_name("n" * MAX_NAME_LENGTH, "dataset")
    for bad in ("a b", ".", "..", ".hidden", "a/b", "n" * (MAX_NAME_LENGTH + 1)):
        with pytest.raises(InvalidWord, match="1-128 letters"):
            check_name(bad, "dataset")


def test_pod_names() -> None:
    assert check_pod_name("job-1a2b-worker-0.pod") == "job-1a2b-worker-0.pod"
    assert check_pod_name("p" * MAX_POD_NAME_LENGTH)
    for bad in ("", "-p", "p" * (MAX_POD_NAME_LENGTH + 1), "p\n", "p/q"):
        with pytest.raises(InvalidWord) as raised:
            check_pod_name(bad)
        assert raised.value.field == "pod_name"


@pytest.mark.parametrize(
    ("pattern", "longest"),
    [
        (JOB_ID_PATTERN, MAX_JOB_ID_LENGTH),
        (NAME_PATTERN, MAX_NAME_LENGTH),
        (POD_NAME_PATTERN, MAX_POD_NAME_LENGTH),
    ],
)
def test_patterns_agree_with_their_limits(pattern: re.Pattern[str], longest: int) -> None:
    assert pattern.match("a" * longest)
    assert not pattern.match("a" * (longest + 1))


def test_echo_cuts_long_values() -> None:
    long = "x" * 10_000
    assert len(echo(long)) < 80 and "10000 characters" in echo(long)
    assert echo("short") == "'short'"


def test_amounts() -> None:
    assert check_cpu(0) == 0.0 and check_cpu(2) == 2.0
    assert check_cpu(0.5, positive=True) == 0.5
    assert check_memory_bytes(0) == 0 and check_memory_bytes(MAX_MEMORY_BYTES) == MAX_MEMORY_BYTES
    assert check_pod_count(0) == 0 and check_pod_count(MAX_PODS_PER_ROLE) == MAX_PODS_PER_ROLE


@pytest.mark.parametrize(
    ("check", "value", "field"),
    [
        (check_cpu, -1.0, "cpu"),
        (check_cpu, math.nan, "cpu"),
        (check_cpu, math.inf, "cpu"),
        (check_cpu, MAX_CPU_CORES * 2, "cpu"),
        (check_cpu, True, "cpu"),
        (check_cpu, "2", "cpu"),
        (partial(check_cpu, positive=True), 0.0, "cpu"),
        (check_memory_bytes, -1, "memory_bytes"),
        (check_memory_bytes, 1.0, "memory_bytes"),
        (check_memory_bytes, MAX_MEMORY_BYTES + 1, "memory_bytes"),
        (partial(check_memory_bytes, positive=True), 0, "memory_bytes"),
        (check_pod_count, -1, "count"),
        (check_pod_count, MAX_PODS_PER_ROLE + 1, "count"),
        (check_pod_count, False, "count"),
        (partial(check_pod_count, minimum=1), 0, "count"),
    ],
)
def test_impossible_amounts_name_the_field(
    check: Callable[[object], object], value: object, field: str
) -> None:
    with pytest.raises(InvalidWord) as raised:
        check(value)
    assert raised.value.field == field
    assert echo(value) in raised.value.problem


def test_resources_add_and_fit() -> None:
    pod = Resources(cpu=2.0, memory_bytes=4 * 2**30)
    total = pod + pod
    assert total == Resources(4.0, 8 * 2**30, 0)
    assert pod.fits_in(total) and not total.fits_in(pod)
    assert Resources() == Resources(0.0, 0, 0)


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        ({"cpu": -1.0}, "cpu"),
        ({"cpu": float("nan")}, "cpu"),
        ({"cpu": float("inf")}, "cpu"),
        ({"memory_bytes": -1}, "memory_bytes"),
        ({"memory_bytes": 2**60}, "memory_bytes"),
        ({"devices": True}, "devices"),
        ({"devices": -1}, "devices"),
    ],
)
def test_resources_refuse_impossible_amounts(bad: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidWord) as raised:
        Resources(**bad)  # type: ignore[arg-type]
    assert raised.value.field == field
