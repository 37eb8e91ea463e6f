"""Bring existing specs: a Kubeflow TFJob or a DLRover ElasticJob becomes a Stride job, with
one warning line for each resource it ignores, and a clear error for anything else."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from stride.cli.jobspec import SpecError, load_submission
from stride.events.v1 import job_pb2

ROOT = Path(__file__).resolve().parents[2]
NOW = datetime(2026, 11, 25, 9, 0, tzinfo=UTC)

TFJOB = """
apiVersion: kubeflow.org/v1
kind: TFJob
metadata:
  name: mnist-ps
  annotations:
    stride.io/spec: |
      user: bob
      dataset: {name: mnist, uri: file:///data/mnist, record_count: 60000}
spec:
  tfReplicaSpecs:
    PS:
      replicas: 2
      template:
        spec:
          containers:
            - name: tensorflow
              image: kubeflow/tf-mnist:1.0
              command: ["python3", "-m", "mnist.train"]
              args: ["--batch-size", "128", "--max_steps=5000", "--lr=0.01", "--shuffle"]
    Worker:
      replicas: 4
      template:
        spec:
          containers:
            - name: tensorflow
              image: kubeflow/tf-mnist:1.0
              command: ["python3", "-m", "mnist.train"]
              args: ["--batch-size", "128", "--max_steps=5000", "--lr=0.01", "--shuffle"]
              resources:
                limits: {cpu: "2", memory: 4Gi}
"""


def load(tmp_path: Path, text: str) -> tuple[job_pb2.JobSpec, tuple[str, ...]]:
    path = tmp_path / "job.yaml"
    path.write_text(text)
    submission = load_submission(path, NOW)
    return submission.spec, submission.warnings


def refused(tmp_path: Path, text: str) -> SpecError:
    path = tmp_path / "job.yaml"
    path.write_text(text)
    with pytest.raises(SpecError) as raised:
        load_submission(path, NOW)
    return raised.value


def test_a_tfjob_becomes_a_stride_job_and_every_resource_it_ignores_is_named(
    tmp_path: Path,
) -> None:
    spec, warnings = load(tmp_path, TFJOB)
    assert spec.name == "mnist-ps" and spec.user == "bob"
    assert spec.model.entrypoint == "mnist.train:main" and not spec.model.image
    assert spec.batch_size == 128 and spec.termination.max_steps == 5000
    assert dict(spec.hyperparameters) == {"lr": "0.01", "shuffle": "true"}
    assert spec.dataset.record_count == 60000
    assert spec.resource_kind == job_pb2.RESOURCE_KIND_CPU
    assert warnings == (
        "TFJob spec.tfReplicaSpecs.PS.replicas: 2 ignored: Stride chooses how many",
        "TFJob spec.tfReplicaSpecs.Worker.replicas: 4 ignored: Stride chooses how many",
        "TFJob spec.tfReplicaSpecs.Worker.template.spec.containers[0].resources: limits "
        "ignored: Stride sizes each pod's CPU and memory",
        "TFJob spec.tfReplicaSpecs.Worker.template.spec.containers[0].command: runs "
        "`python -m mnist.train`: Stride calls mnist.train:main (set model.entrypoint under "
        "stride.io/spec if the function has another name)",
    )
    assert all("\n" not in line for line in warnings)


def test_the_shipped_examples_convert(tmp_path: Path) -> None:
    for name in ("elasticjob-deepctr.yaml", "tfjob-mnist.yaml"):
        submission = load_submission(ROOT / "examples" / "imported" / name, NOW)
        assert submission.warnings and submission.request_id.startswith("spec-")
    elastic = load_submission(ROOT / "examples" / "imported" / "elasticjob-deepctr.yaml", NOW)
    # The annotation's entrypoint wins over the guessed one, so no guess is warned about.
    assert elastic.spec.model.entrypoint == "stride_examples.wide_deep:train"
    assert not any("Stride calls" in line for line in elastic.warnings)
    assert elastic.spec.priority == job_pb2.PRIORITY_HIGH  # the PS replica's priority
    assert elastic.spec.batch_size == 512 and elastic.spec.termination.max_steps == 3000
    assert any("spec.resourceLimits: ignored" in line for line in elastic.warnings)


def test_an_elasticjob_behind_bash_and_pip_still_finds_its_module(tmp_path: Path) -> None:
    text = """
apiVersion: elastic.iml.github.io/v1alpha1
kind: ElasticJob
metadata:
  name: iris
  annotations:
    stride.io/spec: "{user: ann, dataset: {name: iris, uri: 'file:///iris', record_count: 150}}"
spec:
  replicaSpecs:
    worker:
      template:
        spec:
          containers:
            - name: main
              image: dlrover/iris:1
              command:
                - /bin/bash
                - -c
                - pip install -U x && python -m model_zoo.iris.dnn --epochs 2 --batch_size 32
"""
    spec, _ = load(tmp_path, text)
    assert spec.model.entrypoint == "model_zoo.iris.dnn:main"
    assert spec.termination.max_epochs == 2


def test_a_command_that_is_not_python_m_runs_the_image(tmp_path: Path) -> None:
    text = TFJOB.replace('["python3", "-m", "mnist.train"]', '["/opt/train.sh"]')
    spec, warnings = load(tmp_path, text)
    assert spec.model.image == "kubeflow/tf-mnist:1.0" and not spec.model.entrypoint
    assert any("the job runs its image" in line for line in warnings)


@pytest.mark.parametrize(
    ("text", "field", "words"),
    [
        (
            "apiVersion: kubeflow.org/v1\nkind: PyTorchJob\nmetadata: {name: x}\n",
            "kind",
            "unknown kind 'PyTorchJob'",
        ),
        (
            "apiVersion: kubeflow.org/v2\nkind: TFJob\nmetadata: {name: x}\n",
            "kind",
            "(apiVersion 'kubeflow.org/v2')",
        ),
        (
            TFJOB.replace("  name: mnist-ps\n", ""),
            "metadata.name",
            "is required",
        ),
        (
            TFJOB.replace("    Worker:", "    Evaluator:").replace("    PS:", "    Ps:"),
            "spec.tfReplicaSpecs",
            "has no Chief, Master or Worker",
        ),
        (
            "apiVersion: elastic.iml.github.io/v1alpha1\nkind: ElasticJob\nmetadata: {name: x}\n"
            "spec: {distributionStrategy: AllreduceStrategy, replicaSpecs: {worker: {}}}\n",
            "spec.distributionStrategy",
            "Stride runs ParameterServerStrategy jobs",
        ),
        (
            TFJOB.replace("      user: bob\n", "      user: [bob\n"),
            "metadata.annotations['stride.io/spec']",
            "malformed YAML",
        ),
    ],
)
def test_what_cannot_be_converted_is_refused_naming_the_field(
    tmp_path: Path, text: str, field: str, words: str
) -> None:
    error = refused(tmp_path, text)
    assert error.field == field, error
    assert words in str(error), error


def test_a_converted_job_missing_what_stride_needs_says_where_to_give_it(tmp_path: Path) -> None:
    text = TFJOB.replace(
        "      dataset: {name: mnist, uri: file:///data/mnist, record_count: 60000}\n", ""
    )
    error = refused(tmp_path, text)
    assert error.field.startswith("spec.dataset"), error
    assert "the TFJob was converted; give Stride's fields under" in str(error)
    assert "metadata.annotations['stride.io/spec']" in str(error)
