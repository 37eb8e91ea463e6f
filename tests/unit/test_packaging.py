"""Each service imports only what its extra installs, so small images stay small."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("sqlalchemy", "alembic", "psycopg", "aiosqlite", "tensorflow", "pymoo")


def extra_requirements(extra: str) -> set[str]:
    """Third-party requirement names an extra pulls in, following self-references."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    names: set[str] = set()
    pending = [extra]
    while pending:
        for requirement in extras[pending.pop()]:
            if requirement.startswith("stride-platform["):
                pending.extend(requirement.removeprefix("stride-platform[").rstrip("]").split(","))
            else:
                names.add(
                    requirement.split("[")[0].split(">")[0].split("=")[0].split("<")[0].lower()
                )
    return names


def test_admission_extra_has_what_its_policy_and_quotas_file_import() -> None:
    # GuaranteePolicy's progressive filling is numpy; the quotas file is YAML.
    assert {"numpy", "pyyaml"} <= extra_requirements("admission")


def test_agent_extra_is_small() -> None:
    assert not extra_requirements("agent") & {"tensorflow", "tensorflow-cpu", "pymoo", "sqlalchemy"}


@pytest.mark.parametrize(
    ("service", "allowed"),
    [("agent", ()), ("executor", ("pymoo",)), ("ckptcache", ())],
)
def test_services_without_a_database_do_not_import_storage(
    service: str, allowed: tuple[str, ...]
) -> None:
    code = (
        f"import sys, stride.{service}.app; "
        f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    imported = {name for name in result.stdout.strip().split(",") if name} - set(allowed)
    assert imported == set(), f"stride.{service} imports {imported}, which its extra lacks"
