"""The multi-target Dockerfile: one target per process, each non-root and each installing
only its own extra, so the agent image that runs beside every trainer stays small."""

from __future__ import annotations

import fnmatch
import json
import re

import pytest

from . import (
    DOCKERFILE,
    METRICS_PORT,
    REPO_ROOT,
    SERVICES,
    ServiceContract,
    Stage,
    load_dockerfile_stages,
)

pytestmark = pytest.mark.deploy

# Extras that pull in heavy or database dependencies; none may reach the agent image.
HEAVY_EXTRAS = {
    "db",
    "all",
    "cli",
    "admission",
    "optimizer",
    "configdb",
    "dispatcher",
    "podwatcher",
}
EXTRA_INSTALL = re.compile(r"""["']?\.\[(?P<extras>[^\]]+)\]["']?""")


@pytest.fixture(scope="module")
def stages() -> dict[str, Stage]:
    return load_dockerfile_stages()


def _ancestry(stages: dict[str, Stage], target: str) -> list[Stage]:
    """The target stage and the stages it is built FROM, nearest first."""
    chain = [stages[target]]
    while chain[-1].base in stages:
        chain.append(stages[chain[-1].base])
    return chain


def _contributing_stages(stages: dict[str, Stage], target: str) -> list[Stage]:
    """Every stage whose work can end up in the target image: its ancestry plus the
    stages it copies from, transitively."""
    seen: dict[str, Stage] = {}
    pending = [target]
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        for stage in _ancestry(stages, name):
            assert stage.name is not None
            seen[stage.name] = stage
            for copy in stage.arguments_of("COPY"):
                source = re.search(r"--from=(\S+)", copy)
                if source and source.group(1) in stages:
                    pending.append(source.group(1))
    return list(seen.values())


def _pip_installs(stages: list[Stage]) -> list[str]:
    return [
        run
        for stage in stages
        for run in stage.arguments_of("RUN")
        if re.search(r"\bpip\b.*\binstall\b", run)
    ]


@pytest.mark.parametrize("service", SERVICES, ids=lambda service: service.name)
def test_every_process_has_a_target(stages: dict[str, Stage], service: ServiceContract) -> None:
    assert service.name in stages, f"no `FROM ... AS {service.name}` stage in {DOCKERFILE}"


@pytest.mark.parametrize("service", SERVICES, ids=lambda service: service.name)
def test_target_runs_as_a_numeric_non_root_user(
    stages: dict[str, Stage], service: ServiceContract
) -> None:
    # The last USER along the FROM chain is the one the image runs as. Kubernetes can
    # only check runAsNonRoot against a numeric user.
    effective = next(
        (
            user
            for stage in _ancestry(stages, service.name)
            for user in reversed(stage.arguments_of("USER"))
        ),
        None,
    )
    assert effective is not None, f"target {service.name} never sets USER, so it runs as root"
    uid = effective.split(":")[0]
    assert uid.isdigit(), f"target {service.name} runs as {effective!r}, not a numeric uid"
    assert int(uid) != 0, f"target {service.name} runs as root"


@pytest.mark.parametrize("service", SERVICES, ids=lambda service: service.name)
def test_target_runs_its_service(stages: dict[str, Stage], service: ServiceContract) -> None:
    commands = stages[service.name].arguments_of("CMD")
    assert commands, f"target {service.name} has no CMD"
    assert json.loads(commands[-1]) == ["python", "-m", service.module]
    exposed = {
        int(port.split("/")[0])
        for expose in stages[service.name].arguments_of("EXPOSE")
        for port in expose.split()
    }
    assert {service.grpc_port, METRICS_PORT} <= exposed


@pytest.mark.parametrize("service", SERVICES, ids=lambda service: service.name)
def test_target_installs_only_its_own_extra_with_constraints(
    stages: dict[str, Stage], service: ServiceContract
) -> None:
    installs = _pip_installs(_contributing_stages(stages, service.name))
    assert installs, f"target {service.name} installs nothing"
    extras = {
        extra.strip()
        for install in installs
        for match in EXTRA_INSTALL.finditer(install)
        for extra in match.group("extras").split(",")
    }
    assert extras == {service.name}
    for install in installs:
        assert "-c constraints.txt" in install, f"unpinned install: {install}"


def test_agent_image_carries_no_database_or_tensorflow(stages: dict[str, Stage]) -> None:
    installs = " ".join(_pip_installs(_contributing_stages(stages, "agent")))
    extras = {
        extra
        for match in EXTRA_INSTALL.finditer(installs)
        for extra in match.group("extras").split(",")
    }
    assert extras == {"agent"}
    assert not extras & HEAVY_EXTRAS
    for package in ("tensorflow", "sqlalchemy", "alembic", "psycopg", "pymoo"):
        assert package not in installs.lower()


def test_sources_needed_for_the_wheel_are_copied(stages: dict[str, Stage]) -> None:
    copied = " ".join(
        copy
        for stage in _contributing_stages(stages, "admission")
        for copy in stage.arguments_of("COPY")
        if "--from=" not in copy
    )
    for source in ("pyproject.toml", "README.md", "constraints.txt", "libs/", "services/"):
        assert source in copied, f"{source} is not copied into the build"


def _dockerignore_excludes(patterns: list[str], path: str) -> bool:
    """Docker's rule, close enough for these paths: the last pattern that matches the path
    or one of its parent directories decides, and `!` re-includes."""
    parts = path.split("/")
    candidates = ["/".join(parts[: index + 1]) for index in range(len(parts))]
    excluded = False
    for pattern in patterns:
        negated = pattern.startswith("!")
        glob = pattern.removeprefix("!").rstrip("/")
        if any(fnmatch.fnmatchcase(candidate, glob) for candidate in candidates):
            excluded = not negated
    return excluded


def test_dockerignore_keeps_the_context_to_what_the_build_copies() -> None:
    lines = (REPO_ROOT / ".dockerignore").read_text().splitlines()
    patterns = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    for needed in (
        "pyproject.toml",
        "README.md",
        "constraints.txt",
        "libs/runtime/stride/runtime/__init__.py",
        "services/agent/stride/agent/__init__.py",
    ):
        assert not _dockerignore_excludes(patterns, needed), f"{needed} is ignored"
    for unwanted in (
        ".venv/bin/python",
        ".git/HEAD",
        "tests/unit/test_x.py",
        "libs/runtime/stride/runtime/__pycache__/x.cpython-311.pyc",
    ):
        assert _dockerignore_excludes(patterns, unwanted), f"{unwanted} is sent to the build"
