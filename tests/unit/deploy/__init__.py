"""Static checks of the deployment files: compose.yaml, the Dockerfile and the Helm chart.

The table below is the fixed contract between the code and the deployment files, written
out once here so each test compares the files against it instead of against themselves.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]
COMPOSE_FILE = REPO_ROOT / "compose.yaml"
DOCKERFILE = REPO_ROOT / "deploy" / "docker" / "Dockerfile"
CHART_DIR = REPO_ROOT / "deploy" / "helm" / "stride"

METRICS_PORT = 9464


@dataclass(frozen=True)
class ServiceContract:
    """What the deployment files must know about one Stride process."""

    name: str
    grpc_port: int
    has_database: bool
    health_service: str
    # The agent is a sidecar in training pods, never a service of its own.
    deployed: bool = True

    @property
    def env_prefix(self) -> str:
        """The prefix of this service's own settings, e.g. ``STRIDE_ADMISSION_``."""
        return f"STRIDE_{self.name.upper()}_"

    @property
    def module(self) -> str:
        """The module ``python -m`` runs."""
        return f"stride.{self.name}"


SERVICES: tuple[ServiceContract, ...] = (
    ServiceContract("admission", 50051, True, "stride.api.admission.v1.AdmissionService"),
    ServiceContract("optimizer", 50052, True, "stride.api.optimizer.v1.OptimizerService"),
    ServiceContract("executor", 50053, False, "stride.api.executor.v1.ExecutorService"),
    ServiceContract("configdb", 50054, True, "stride.api.configdb.v1.ConfigDbService"),
    ServiceContract("dispatcher", 50055, True, "stride.api.dispatcher.v1.DispatcherService"),
    ServiceContract("ckptcache", 50056, False, "stride.api.ckptcache.v1.CheckpointCacheService"),
    ServiceContract("podwatcher", 50057, True, "stride.api.podwatcher.v1.PodWatcherService"),
    ServiceContract("agent", 50058, False, "stride.api.agent.v1.AgentService", deployed=False),
)
DEPLOYED_SERVICES = tuple(service for service in SERVICES if service.deployed)
DATABASE_SERVICES = tuple(service for service in SERVICES if service.has_database)


@dataclass(frozen=True)
class Instruction:
    """One Dockerfile instruction, continuation lines joined."""

    keyword: str
    arguments: str


@dataclass(frozen=True)
class Stage:
    """One ``FROM ... [AS name]`` stage of a multi-stage Dockerfile."""

    name: str | None
    base: str
    instructions: tuple[Instruction, ...]

    def arguments_of(self, keyword: str) -> list[str]:
        """The arguments of every instruction with this keyword, in order."""
        return [item.arguments for item in self.instructions if item.keyword == keyword]


def parse_dockerfile(text: str) -> list[Stage]:
    """Split a Dockerfile into stages. Enough of the syntax for the checks here:
    comments, line continuations, ``FROM [--platform=...] image [AS name]``."""
    logical_lines: list[str] = []
    pending = ""
    for raw_line in text.splitlines():
        line = raw_line.strip()
        if line.startswith("#") or (not line and not pending):
            # Docker drops comment lines even inside a continued instruction.
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical_lines.append(pending + line)
        pending = ""
    if pending:
        logical_lines.append(pending)

    stages: list[Stage] = []
    current: tuple[str | None, str, list[Instruction]] | None = None
    for line in logical_lines:
        keyword, _, arguments = line.partition(" ")
        keyword = keyword.upper()
        arguments = arguments.strip()
        if keyword == "FROM":
            if current is not None:
                stages.append(Stage(current[0], current[1], tuple(current[2])))
            words = [word for word in arguments.split() if not word.startswith("--")]
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            current = (name, words[0], [])
        elif current is not None:
            current[2].append(Instruction(keyword, arguments))
    if current is not None:
        stages.append(Stage(current[0], current[1], tuple(current[2])))
    return stages


def load_dockerfile_stages() -> dict[str, Stage]:
    """The named stages of deploy/docker/Dockerfile, by name."""
    stages = parse_dockerfile(DOCKERFILE.read_text())
    return {stage.name: stage for stage in stages if stage.name is not None}
