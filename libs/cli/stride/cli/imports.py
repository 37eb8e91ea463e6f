"""Bring existing specs: a Kubeflow ``TFJob`` or a DLRover ``ElasticJob`` as a Stride job.

``stride submit`` reads either file as it is. What Stride needs and the file has is taken
from it: the job's name, the trainer's module and its flags (``--batch_size``, the step or
epoch limit, the rest as hyperparameters), the image, and a DLRover replica priority.
Resources (replica counts, requests and limits, ``resourceLimits``, ``autoScale``,
``restartCount``) are ignored, each with a one-line warning that says so: Stride chooses the
PS, workers and their sizes itself, and bounds a job by its share and the cluster.

What Stride needs and the file does not say (the dataset, the user, a deadline) goes under
the annotation ``stride.io/spec``: a Stride spec fragment in YAML, laid over what was
derived (it wins where both say something)::

    metadata:
      name: deepctr
      annotations:
        stride.io/spec: |
          user: alice
          dataset: {name: criteo, uri: s3://data/criteo, record_count: 45000000}
          deadline: +6h

Any other ``apiVersion``/``kind`` is refused naming both and the two that are understood.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

ANNOTATION = "stride.io/spec"
TFJOB = ("kubeflow.org/v1", "TFJob")
ELASTICJOB = ("elastic.iml.github.io/v1alpha1", "ElasticJob")
_BATCH_FLAGS = ("batch_size", "batch-size", "per_device_batch_size", "global_batch_size")
_STEP_FLAGS = ("max_steps", "max-steps", "train_steps", "training_steps", "num_steps", "steps")
_EPOCH_FLAGS = ("epochs", "num_epochs", "num-epochs", "max_epochs", "training_epochs")
_MODULE = re.compile(r"^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*$", re.ASCII)


class ForeignSpecError(ValueError):
    """An imported spec that cannot become a Stride job; ``field`` is where (dotted path)."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


@dataclass(frozen=True)
class Imported:
    """A Stride spec (as the YAML mapping a user would write) and what was left out."""

    data: dict[str, Any]
    warnings: tuple[str, ...]
    source: str
    """``TFJob`` or ``ElasticJob``."""


def is_foreign(data: object) -> bool:
    """Whether a parsed YAML document is a Kubernetes object rather than a Stride spec."""
    return isinstance(data, dict) and "apiVersion" in data and "kind" in data


def convert(data: Mapping[str, Any]) -> Imported:
    """A TFJob or an ElasticJob as a Stride spec; raises :class:`ForeignSpecError` naming the
    field for anything else or anything it cannot read."""
    api, kind = str(data.get("apiVersion", "")), str(data.get("kind", ""))
    if (api, kind) == TFJOB:
        return _Converter(data, "TFJob", "tfReplicaSpecs").run()
    if (api, kind) == ELASTICJOB:
        return _Converter(data, "ElasticJob", "replicaSpecs").run()
    raise ForeignSpecError(
        "kind",
        f"unknown kind {kind[:40]!r} (apiVersion {api[:60]!r}); stride submit reads a Stride "
        f"job spec, a Kubeflow {TFJOB[1]} ({TFJOB[0]}) or a DLRover {ELASTICJOB[1]} "
        f"({ELASTICJOB[0]})",
    )


def _mapping(value: object, field: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ForeignSpecError(field, f"expected a mapping, got {type(value).__name__}")
    return value


class _Converter:
    def __init__(self, data: Mapping[str, Any], source: str, replicas_key: str) -> None:
        self.data = data
        self.source = source
        self.replicas_key = replicas_key
        self.warnings: list[str] = []

    def warn(self, field: str, what: str) -> None:
        self.warnings.append(f"{self.source} {field}: {what}")

    def run(self) -> Imported:
        metadata = _mapping(self.data.get("metadata"), "metadata")
        spec = _mapping(self.data.get("spec"), "spec")
        name = metadata.get("name")
        if not isinstance(name, str) or not name:
            raise ForeignSpecError("metadata.name", "is required (it names the Stride job)")
        out: dict[str, Any] = {"name": name, "model": {"name": name}}
        self._job_level(spec, out)
        replicas = _mapping(spec.get(self.replicas_key), f"spec.{self.replicas_key}")
        if not replicas:
            raise ForeignSpecError(f"spec.{self.replicas_key}", "is required (the job's replicas)")
        roles = {
            str(role).lower(): (str(role), _mapping(r, f"spec.{self.replicas_key}.{role}"))
            for role, r in replicas.items()
        }
        main = next((roles[r] for r in ("chief", "master", "worker") if r in roles), None)
        if main is None:
            raise ForeignSpecError(
                f"spec.{self.replicas_key}",
                f"has no Chief, Master or Worker (roles: {', '.join(sorted(roles))})",
            )
        gpus = False
        ranks = {"low": 0, "normal": 1, "high": 2}
        priorities = []
        for _, (written, replica) in sorted(roles.items()):
            gpus = self._replica(written, replica) or gpus
            priority = replica.get("priority")
            if isinstance(priority, str) and priority.lower() in ranks:
                priorities.append(priority.lower())
        out["resource_kind"] = "gpu" if gpus else "cpu"
        if priorities:  # DLRover gives priorities per replica; a Stride job has one
            out["priority"] = max(priorities, key=ranks.__getitem__)
        derived = self._program(main[0], main[1], out)
        merged = _merge(out, self._overlay(metadata))
        if derived is not None and merged["model"].get("entrypoint") == derived[1]:
            self.warn(*derived[0])
        return Imported(merged, tuple(self.warnings), self.source)

    def _job_level(self, spec: Mapping[str, Any], out: dict[str, Any]) -> None:
        if self.source == "ElasticJob":
            strategy = spec.get("distributionStrategy", "ParameterServerStrategy")
            if strategy != "ParameterServerStrategy":
                raise ForeignSpecError(
                    "spec.distributionStrategy",
                    f"{str(strategy)[:40]!r}: Stride runs ParameterServerStrategy jobs (and "
                    "GPU jobs written as Stride specs)",
                )
            if "resourceLimits" in spec:
                self.warn(
                    "spec.resourceLimits",
                    "ignored: Stride bounds a job by its share of the cluster and the quotas",
                )
            if "optimizeMode" in spec:
                self.warn("spec.optimizeMode", "ignored: Stride's optimizer always sizes the job")
        elif "runPolicy" in spec:
            self.warn(
                "spec.runPolicy",
                "ignored: Stride relaunches failed pods and cleans up itself",
            )

    def _replica(self, written: str, replica: Mapping[str, Any]) -> bool:
        """Warn about what is ignored; whether the replica asks for GPUs."""
        field = f"spec.{self.replicas_key}.{written}"
        gpus = False
        for key in ("replicas", "minReplicas", "maxReplicas"):
            if key in replica:
                self.warn(f"{field}.{key}", f"{replica[key]} ignored: Stride chooses how many")
        if "autoScale" in replica:
            self.warn(f"{field}.autoScale", "ignored: Stride always rescales the job")
        for key in ("restartCount", "restartPolicy"):
            if key in replica:
                self.warn(f"{field}.{key}", "ignored: Stride's relaunch budget applies")
        for index, container in enumerate(self._containers(replica, field)):
            where = f"{field}.template.spec.containers[{index}]"
            resources = _mapping(container.get("resources"), f"{where}.resources")
            if resources:
                kinds = "/".join(k for k in ("requests", "limits") if k in resources) or "resources"
                gpus = gpus or "gpu" in str(resources).lower()
                self.warn(
                    f"{where}.resources",
                    f"{kinds} ignored: Stride sizes each pod's CPU and memory",
                )
        return gpus

    def _containers(self, replica: Mapping[str, Any], field: str) -> list[Mapping[str, Any]]:
        template = _mapping(replica.get("template"), f"{field}.template")
        pod = _mapping(template.get("spec"), f"{field}.template.spec")
        containers = pod.get("containers") or []
        if not isinstance(containers, list):
            raise ForeignSpecError(f"{field}.template.spec.containers", "expected a list")
        return [
            _mapping(c, f"{field}.template.spec.containers[{i}]") for i, c in enumerate(containers)
        ]

    def _program(
        self, written: str, replica: Mapping[str, Any], out: dict[str, Any]
    ) -> tuple[tuple[str, str], str] | None:
        """Fill the program from the main container; a guessed entrypoint's warning and
        the entrypoint (warned only if the overlay keeps it)."""
        guessed = None
        field = f"spec.{self.replicas_key}.{written}"
        containers = self._containers(replica, field)
        if not containers:
            raise ForeignSpecError(f"{field}.template.spec.containers", "has no container")
        main = next(
            (c for c in containers if c.get("name") in ("tensorflow", "main")), containers[0]
        )
        where = f"{field}.template.spec.containers[{containers.index(main)}]"
        argv = _argv(main, where)
        module, flags = _python_module(argv)
        if module is not None:
            out["model"]["entrypoint"] = f"{module}:main"
            guessed = (
                (
                    f"{where}.command",
                    f"runs `python -m {module}`: Stride calls {module}:main (set "
                    f"model.entrypoint under {ANNOTATION} if the function has another name)",
                ),
                f"{module}:main",
            )
        elif isinstance(main.get("image"), str) and main["image"]:
            out["model"]["image"] = main["image"]
            self.warn(
                f"{where}.command",
                "is not `python -m <module>`: the job runs its image (the Kubernetes backend); "
                f"set model.entrypoint under {ANNOTATION} to run it as local processes",
            )
        hyper: dict[str, str] = {}
        termination: dict[str, int] = {}
        for key, value in flags.items():
            if key in _BATCH_FLAGS and value.isdigit():
                out["batch_size"] = int(value)
            elif key in _STEP_FLAGS and value.isdigit():
                termination["max_steps"] = int(value)
            elif key in _EPOCH_FLAGS and value.isdigit():
                termination["max_epochs"] = int(value)
            else:
                hyper[key] = value
        if hyper:
            out["hyperparameters"] = hyper
        if termination:
            out["termination"] = termination
        return guessed

    def _overlay(self, metadata: Mapping[str, Any]) -> dict[str, Any]:
        annotations = _mapping(metadata.get("annotations"), "metadata.annotations")
        text = annotations.get(ANNOTATION)
        if text is None:
            return {}
        field = f"metadata.annotations[{ANNOTATION!r}]"
        if not isinstance(text, str):
            raise ForeignSpecError(field, "must be a string holding a Stride spec in YAML")
        try:
            overlay = yaml.safe_load(text)
        except yaml.YAMLError as error:
            raise ForeignSpecError(
                field, f"malformed YAML: {str(error).splitlines()[0][:100]}"
            ) from None
        if overlay is None:
            return {}
        if not isinstance(overlay, dict):
            raise ForeignSpecError(field, f"expected a mapping, got {type(overlay).__name__}")
        return overlay


def _argv(container: Mapping[str, Any], field: str) -> list[str]:
    """The container's command line, with ``bash -c "..."`` unwrapped."""
    parts: list[str] = []
    for key in ("command", "args"):
        value = container.get(key) or []
        if not isinstance(value, list) or not all(isinstance(v, str | int | float) for v in value):
            raise ForeignSpecError(f"{field}.{key}", "expected a list of strings")
        parts.extend(str(v) for v in value)
    if len(parts) >= 3 and parts[0].rsplit("/", 1)[-1] in ("bash", "sh") and parts[1] == "-c":
        script = parts[2].split("&&")[-1]  # `pip install ... && python -m ...`: the last step
        try:
            parts = shlex.split(script) + parts[3:]
        except ValueError as error:
            raise ForeignSpecError(
                f"{field}.command", f"cannot split the shell line: {error}"
            ) from None
    return parts


def _python_module(argv: list[str]) -> tuple[str | None, dict[str, str]]:
    """``python -m module --flag=value ...``: the module and the flags (None: not that)."""
    if len(argv) < 3 or not re.fullmatch(r"python[\d.]*", argv[0].rsplit("/", 1)[-1]):
        return None, _flags(argv)
    if argv[1] != "-m" or not _MODULE.match(argv[2]):
        return None, _flags(argv[2:])
    return argv[2], _flags(argv[3:])


def _flags(args: list[str]) -> dict[str, str]:
    flags: dict[str, str] = {}
    index = 0
    while index < len(args):
        arg = args[index]
        index += 1
        if not arg.startswith("--") or len(arg) == 2:
            continue
        key, equals, value = arg[2:].partition("=")
        if not equals:
            if index < len(args) and not args[index].startswith("--"):
                value = args[index]
                index += 1
            else:
                value = "true"
        flags[key] = value
    return flags


def _merge(base: dict[str, Any], overlay: Mapping[str, Any]) -> dict[str, Any]:
    """``overlay`` laid over ``base``: mappings merge, anything else replaces; a model given
    in the overlay with an image or an entrypoint replaces the derived program."""
    merged = dict(base)
    for key, value in overlay.items():
        if key == "model" and isinstance(value, dict) and isinstance(base.get("model"), dict):
            model = dict(base["model"])
            if "image" in value or "entrypoint" in value:
                model.pop("image", None)
                model.pop("entrypoint", None)
            merged["model"] = {**model, **value}
        elif isinstance(value, dict) and isinstance(base.get(key), dict):
            merged[key] = _merge(base[key], value)
        else:
            merged[key] = value
    return merged
