"""The StrideJob CRD the chart ships is the one generated from JobSpec, and what it admits the
spec parser takes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml

from stride.cli.jobspec import SpecError, spec_from_mapping
from stride.podwatcher.adapters.inbound.stridejob_crd import definition, render

CHART_CRD = Path(__file__).resolve().parents[3] / "deploy/helm/stride/crds/stridejobs.yaml"


def test_the_charts_crd_is_the_generated_one() -> None:
    assert CHART_CRD.read_text() == render(), (
        "regenerate: python -m stride.podwatcher.adapters.inbound.stridejob_crd > "
        "deploy/helm/stride/crds/stridejobs.yaml"
    )


def test_the_spec_schema_has_no_user_and_no_resources() -> None:
    schema = definition()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    spec = schema["properties"]["spec"]["properties"]
    assert "user" not in spec and "simulated" not in spec
    assert "workers" not in spec and "gpus" not in spec
    assert "high" in spec["priority"]["enum"] and "PRIORITY_HIGH" in spec["priority"]["enum"]


def test_a_relative_deadline_counts_from_the_objects_creation() -> None:
    example = yaml.safe_load(
        (Path(__file__).resolve().parents[3] / "examples/wide-deep.yaml").read_text()
    )
    created = datetime.now(UTC) - timedelta(hours=1)
    spec = spec_from_mapping(example, created)
    assert spec.deadline.seconds == int((created + timedelta(hours=6)).timestamp())
    assert spec.user == ""  # admission sets it: the namespace's tenant
    with pytest.raises(SpecError, match="workers"):
        spec_from_mapping({**example, "workers": 3}, created)
    with pytest.raises(SpecError, match="batch_size"):
        spec_from_mapping({**example, "batch_size": 0}, created)
