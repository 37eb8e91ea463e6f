"""compose.yaml: the local stack. Checked against the Compose schema by docker-compose when
it is installed, and against the service contract always."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from stride.runtime import tls

from . import (
    COMPOSE_FILE,
    DATABASE_SERVICES,
    DEPLOYED_SERVICES,
    METRICS_PORT,
    REPO_ROOT,
    ServiceContract,
    load_dockerfile_stages,
)

pytestmark = pytest.mark.deploy

Service = dict[str, Any]

TLS_DIR = "/etc/stride/tls"
# The health check in a server's container presents that server's certificate.
IDENTITY_ENV = "STRIDE_TLS_IDENTITY"


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    loaded = yaml.safe_load(COMPOSE_FILE.read_text())
    assert isinstance(loaded, dict)
    return loaded


@pytest.fixture(scope="module")
def services(document: dict[str, Any]) -> dict[str, Service]:
    compose_services = document["services"]
    assert isinstance(compose_services, dict)
    return compose_services


def _environment(service: Service) -> dict[str, str | None]:
    raw = service.get("environment", {})
    if isinstance(raw, list):
        pairs = [item.split("=", 1) for item in raw]
        return {pair[0]: pair[1] if len(pair) == 2 else None for pair in pairs}
    return {key: None if value is None else str(value) for key, value in raw.items()}


def _option(command: list[str], flag: str) -> str:
    assert flag in command, f"{flag} missing from {command}"
    return command[command.index(flag) + 1]


def test_compose_config_is_valid() -> None:
    executable = shutil.which("docker-compose")
    if executable is None:
        pytest.skip(
            "docker-compose not installed: `apt-get install -y --no-install-recommends "
            "docker-compose` (the Makefile's system-deps target) runs this check"
        )
    result = subprocess.run(
        [executable, "-f", str(COMPOSE_FILE), "config", "-q"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def test_agent_is_not_a_compose_service(services: dict[str, Service]) -> None:
    assert "agent" not in services


@pytest.mark.parametrize("contract", DEPLOYED_SERVICES, ids=lambda contract: contract.name)
def test_server_is_health_checked_over_grpc(
    services: dict[str, Service], contract: ServiceContract
) -> None:
    assert contract.name in services, f"compose.yaml has no {contract.name} service"
    test = services[contract.name]["healthcheck"]["test"]
    assert isinstance(test, list) and test[0] == "CMD", "use the exec form, no shell needed"
    assert test[1:4] == ["python", "-m", "stride.runtime.healthcheck"]
    assert _option(test, "--address") == f"127.0.0.1:{contract.grpc_port}"
    assert _option(test, "--service") == contract.health_service


@pytest.mark.parametrize("contract", DEPLOYED_SERVICES, ids=lambda contract: contract.name)
def test_server_settings(services: dict[str, Service], contract: ServiceContract) -> None:
    environment = _environment(services[contract.name])
    prefix = contract.env_prefix
    assert environment[f"{prefix}GRPC_PORT"] == str(contract.grpc_port)
    assert environment[f"{prefix}METRICS_PORT"] == str(METRICS_PORT)
    # The locked-down NATS asks every client for its certificate.
    assert environment["STRIDE_NATS_URL"] == "tls://nats:4222"
    if contract.has_database:
        assert environment[f"{prefix}AUTO_MIGRATE"] == "false"
        assert environment["STRIDE_DATABASE_URL"] == (
            "postgresql://stride:stride@postgres:5432/stride"
        )
    else:
        assert "STRIDE_DATABASE_URL" not in environment


@pytest.mark.parametrize("contract", DEPLOYED_SERVICES, ids=lambda contract: contract.name)
def test_server_waits_for_healthy_nats(
    services: dict[str, Service], contract: ServiceContract
) -> None:
    depends_on = services[contract.name]["depends_on"]
    assert depends_on["nats"]["condition"] == "service_healthy"
    # ... and for its streams, which only the bus administrator may declare.
    assert depends_on["bus-init"]["condition"] == "service_completed_successfully"


@pytest.mark.parametrize("contract", DATABASE_SERVICES, ids=lambda contract: contract.name)
def test_database_server_starts_after_its_migration(
    services: dict[str, Service], contract: ServiceContract
) -> None:
    migrate_name = f"{contract.name}-migrate"
    assert migrate_name in services, f"no {migrate_name} one-shot"
    migrate = services[migrate_name]
    assert migrate["restart"] == "no"
    assert migrate["command"] == ["python", "-m", contract.module, "migrate"]
    assert migrate["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert migrate["build"]["target"] == contract.name
    assert "STRIDE_DATABASE_URL" in _environment(migrate)

    depends_on = services[contract.name]["depends_on"]
    assert depends_on["postgres"]["condition"] == "service_healthy"
    assert depends_on[migrate_name]["condition"] == "service_completed_successfully"


def test_only_database_services_have_migrations(services: dict[str, Service]) -> None:
    migrations = {name.removesuffix("-migrate") for name in services if name.endswith("-migrate")}
    assert migrations == {contract.name for contract in DATABASE_SERVICES}


def test_every_build_target_is_a_dockerfile_stage(services: dict[str, Service]) -> None:
    stages = load_dockerfile_stages()
    built = {name: service["build"] for name, service in services.items() if "build" in service}
    assert {contract.name for contract in DEPLOYED_SERVICES} <= built.keys()
    for name, build in built.items():
        dockerfile = (REPO_ROOT / build["context"] / build["dockerfile"]).resolve()
        assert dockerfile == (REPO_ROOT / "deploy/docker/Dockerfile").resolve(), name
        assert build["target"] in stages, f"{name} builds missing target {build['target']!r}"


def test_ckptcache_has_shared_memory_and_a_store_volume(services: dict[str, Service]) -> None:
    ckptcache = services["ckptcache"]
    assert ckptcache["shm_size"] == "2gb"
    store_dir = _environment(ckptcache)["STRIDE_CKPTCACHE_STORE_DIR"]
    assert store_dir is not None
    mounts = {Path(volume.split(":")[1]) for volume in ckptcache["volumes"]}
    assert Path(store_dir) in mounts


def test_podwatcher_runs_pods_locally_with_the_agent_image(
    services: dict[str, Service],
) -> None:
    podwatcher = services["podwatcher"]
    environment = _environment(podwatcher)
    assert environment["STRIDE_PODWATCHER_BACKEND"] == "local"
    assert environment["STRIDE_PODWATCHER_NAMESPACE"]
    agent_image = environment["STRIDE_PODWATCHER_AGENT_IMAGE"]
    assert agent_image is not None and "agent" in agent_image
    # The pods run in its container, so its image is the one with the trainer and agent.
    assert podwatcher["build"]["target"] == "podwatcher-local"
    # They call the dispatcher and the cache by their compose names, once those are up.
    for name, port in (("dispatcher", 50055), ("ckptcache", 50056)):
        assert environment[f"STRIDE_PODWATCHER_{name.upper()}_ADDRESS"] == f"{name}:{port}"
        assert podwatcher["depends_on"][name]["condition"] == "service_healthy"
    # Pods outlive a podwatcher restart: their state is on a volume.
    state_dir = environment["STRIDE_PODWATCHER_LOCAL_STATE_DIR"]
    assert state_dir in {volume.split(":")[1] for volume in podwatcher["volumes"]}
    nodes = environment["STRIDE_PODWATCHER_LOCAL_NODES"]
    assert nodes is not None and "x(cpu=" in nodes


def test_the_local_podwatcher_image_carries_the_trainer_and_the_agent() -> None:
    text = (REPO_ROOT / "deploy" / "docker" / "Dockerfile").read_text()
    install = text.split("FROM source AS install-podwatcher-local", 1)[1].split("FROM", 1)[0]
    assert ".[podwatcher,agent,tensorflow]" in install


def test_admission_api_is_published(services: dict[str, Service]) -> None:
    assert "50051:50051" in [str(port) for port in services["admission"]["ports"]]


def test_nats_runs_jetstream_and_is_health_checked(services: dict[str, Service]) -> None:
    nats = services["nats"]
    command = nats["command"]
    assert "-js" in command
    assert _option(command, "-sd") == "/data"
    assert _option(command, "-m") == "8222"
    assert any("8222/healthz" in part for part in nats["healthcheck"]["test"])


def test_nats_is_locked_down_by_the_generated_configuration(
    services: dict[str, Service],
) -> None:
    """The nats server reads the configuration the `nats-config` one-shot writes from the
    bus contract, over certificates of the stack's CA. (Run for real, with these commands,
    by tests/integration/libs/test_nats_lockdown.py.)"""
    nats, writer = services["nats"], services["nats-config"]
    config = _option(nats["command"], "-c")
    folder, name = config.rsplit("/", 1)
    assert _volumes(nats)[folder] == ("tls", "ro")
    assert nats["depends_on"]["nats-config"]["condition"] == "service_completed_successfully"
    command = writer["command"]
    assert command[:4] == ["python", "-m", "stride.bus.lockdown", "config"]
    out_folder, out_name = _option(command, "--out").rsplit("/", 1)
    assert out_name == name and _volumes(writer)[out_folder] == ("tls", "rw")
    # It names the certificates where the nats container sees them.
    for flag, file in (("--cert", "nats.crt"), ("--key", "nats.key"), ("--ca", "ca.crt")):
        assert _option(command, flag) == f"{folder}/{file}"
    assert writer["depends_on"]["certs"]["condition"] == "service_completed_successfully"
    assert writer["image"] == services["admission"]["image"] and writer["restart"] == "no"


def test_the_streams_are_declared_by_the_bus_administrator(
    services: dict[str, Service],
) -> None:
    init = services["bus-init"]
    assert init["command"] == [
        "python", "-m", "stride.bus.lockdown", "init", "--url", "tls://nats:4222"
    ]  # fmt: skip
    # As the cli identity, from the stack's certificates.
    assert _environment(init)[tls.TLS_DIR_ENV] == TLS_DIR
    assert _volumes(init)[TLS_DIR] == ("tls", "ro")
    assert init["depends_on"]["nats"]["condition"] == "service_healthy"
    assert init["restart"] == "no"


def test_postgres_is_health_checked(services: dict[str, Service]) -> None:
    postgres = services["postgres"]
    assert str(postgres["image"]).startswith("postgres:15")
    environment = _environment(postgres)
    assert environment["POSTGRES_DB"] == environment["POSTGRES_USER"] == "stride"
    assert "pg_isready" in postgres["healthcheck"]["test"]


@pytest.mark.parametrize("service", ["optimizer", "admission"])
def test_warm_starts_come_from_the_config_db(services: dict[str, Service], service: str) -> None:
    environment = _environment(services[service])
    assert environment[f"STRIDE_{service.upper()}_CONFIGDB_ADDRESS"] == "configdb:50054"
    assert "configdb" in services


def _volumes(service: Service) -> dict[str, tuple[str, str]]:
    """Short-syntax volumes: container path -> (source, mode)."""
    mounts = {}
    for volume in service.get("volumes", []):
        source, target, *mode = str(volume).split(":")
        mounts[target] = (source, mode[0] if mode else "rw")
    return mounts


def test_a_one_shot_issues_the_certificates_into_a_volume(
    document: dict[str, Any], services: dict[str, Service]
) -> None:
    certs = services["certs"]
    command = certs["command"]
    assert command[:5] == ["python", "-m", "stride.runtime.certs", "init", command[4]]
    folder = command[4]
    # Root only to hand the files to the images' user.
    assert _option(command, "--owner") == "10001:10001"
    assert str(certs["user"]) == "0:0"
    assert certs["restart"] == "no"
    assert _volumes(certs)[folder] == ("tls", "rw")
    assert "tls" in document["volumes"]
    # The CA's key lives in a volume only this one-shot mounts.
    ca_key = _option(command, "--ca-key")
    assert ca_key is not None and not ca_key.startswith(folder + "/")
    ca_folder = ca_key.rsplit("/", 1)[0]
    assert _volumes(certs)[ca_folder] == ("ca", "rw") and "ca" in document["volumes"]
    assert all(
        "ca" not in {volume for volume, _ in _volumes(service).values()}
        for name, service in services.items()
        if name != "certs"
    )
    # Built with the stack (nothing to pull), from an image that carries stride.runtime.
    assert certs["image"] == services["admission"]["image"]
    assert certs["build"] == services["admission"]["build"]


@pytest.mark.parametrize("contract", DEPLOYED_SERVICES, ids=lambda contract: contract.name)
def test_server_speaks_mutual_tls_with_the_issued_certificates(
    services: dict[str, Service], contract: ServiceContract
) -> None:
    service = services[contract.name]
    environment = _environment(service)
    assert environment[tls.TLS_DIR_ENV] == TLS_DIR
    # Its health check (run in the container, same environment) presents its own identity.
    assert environment[IDENTITY_ENV] == contract.name
    assert contract.name in tls.IDENTITIES
    assert tls.INSECURE_ENV not in environment
    assert _volumes(service)[TLS_DIR] == ("tls", "ro")
    assert service["depends_on"]["certs"]["condition"] == "service_completed_successfully"


def test_the_local_pods_inherit_the_certificates(services: dict[str, Service]) -> None:
    # The trainer and agent processes run in the podwatcher's container with its environment.
    environment = _environment(services["podwatcher"])
    assert environment[tls.TLS_DIR_ENV] == TLS_DIR
    assert {"trainer", "agent"} <= set(tls.IDENTITIES)


def test_only_servers_get_tls(services: dict[str, Service]) -> None:
    # Migrations talk to PostgreSQL only.
    for name, service in services.items():
        if name.endswith("-migrate"):
            assert tls.TLS_DIR_ENV not in _environment(service), name
            assert TLS_DIR not in _volumes(service), name


def test_plain_text_is_never_the_default(services: dict[str, Service]) -> None:
    for name, service in services.items():
        assert tls.INSECURE_ENV not in _environment(service), name
