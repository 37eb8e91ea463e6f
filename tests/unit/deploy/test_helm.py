"""The Helm chart, rendered and linted offline with the Helm 4 library (helm-python-sdk) and
every manifest validated against the Kubernetes 1.33 schemas (kubernetes-validate)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml

from stride.admission.domain.quotas import quotas_from_config
from stride.admission.settings import AdmissionSettings
from stride.bus.lockdown import config_text
from stride.podwatcher.domain.network import JOB_LABEL, TENSORFLOW_PORT_NAME, job_network_policy
from stride.runtime import tls

from . import (
    CHART_DIR,
    DATABASE_SERVICES,
    DEPLOYED_SERVICES,
    METRICS_PORT,
    ServiceContract,
)

pytestmark = pytest.mark.deploy

KUBE_VERSION = "1.33"
NAMESPACE = "ml"
Manifest = dict[str, Any]

TLS_DIR = Path("/etc/stride/tls")
# The probe in a server's container presents that server's certificate.
IDENTITY_ENV = "STRIDE_TLS_IDENTITY"
# Where the training pods run, so their certificates (Secrets) must be there too.
POD_IDENTITIES = {"agent", "trainer"}

OVERRIDES: dict[str, Any] = {
    "image": {"repository": "registry.example.com:5000/team/stride", "tag": "1.2.3"},
    "database": {"existingSecret": "stride-db", "existingSecretKey": "dsn"},
    "services": {contract.name: {"replicas": 3} for contract in DEPLOYED_SERVICES},
    "otlp": {"endpoint": "http://otel-collector.observability:4317"},
    "podwatcher": {"namespace": "training"},
    "ckptcache": {"store": {"persistence": {"enabled": True, "storageClass": "fast"}}},
    "optimizer": {"clusterCapacity": {"cpu": 512, "memoryGiB": 2048}},
    "admission": {
        "cluster": {"gpus": 64, "gpuTopology": "2x4x8", "cpu": 512, "memoryGiB": 2048},
        "quotas": [
            {"scope": "team:ranking", "members": ["alice", "bob"], "max_active_jobs": 8},
            {"scope": "user:carol", "max_submissions": 20, "window_seconds": 3600},
        ],
    },
    "tls": {
        "certManager": {
            "enabled": True,
            "issuerRef": {"name": "stride-ca", "kind": "ClusterIssuer"},
            "duration": "720h",
        }
    },
}
INSECURE: dict[str, Any] = {"tls": {"insecure": True}}


@dataclass(frozen=True)
class Release:
    """One rendering of the chart."""

    name: str
    # The chart's defaults merged with the overrides: what the templates saw.
    values: dict[str, Any]
    app_version: str
    files: dict[str, str]
    manifests: tuple[Manifest, ...]

    def prefix(self) -> str:
        # Mirrors "stride.fullname": a release named like the chart is not repeated.
        return self.name if "stride" in self.name else f"{self.name}-stride"

    def get(self, kind: str, name: str) -> Manifest:
        full_name = f"{self.prefix()}-{name}"
        found = [
            m for m in self.manifests if m["kind"] == kind and m["metadata"]["name"] == full_name
        ]
        assert len(found) == 1, f"expected one {kind} {full_name}, found {len(found)}"
        return found[0]

    def of_kind(self, kind: str) -> list[Manifest]:
        return [manifest for manifest in self.manifests if manifest["kind"] == kind]

    @property
    def tls(self) -> bool:
        # Mirrors "stride.tls": tls.insecure wins, tls.enabled=false alone fails.
        return not self.values["tls"]["insecure"]

    @property
    def cert_manager(self) -> bool:
        return self.tls and bool(self.values["tls"]["certManager"]["enabled"])

    def tls_secret(self, identity: str) -> str:
        return f"{self.prefix()}-{identity}-tls"


def _render(chart: helm.Chart, name: str, values: dict[str, Any]) -> Release:
    files = chart.render(values, name=name, namespace=NAMESPACE)
    manifests = tuple(
        document
        for path, text in sorted(files.items())
        if path.endswith((".yaml", ".yml"))
        for document in yaml.safe_load_all(text)
        if document
    )
    return Release(
        name, chart.merge_values(values), str(chart.metadata["appVersion"]), files, manifests
    )


@pytest.fixture(scope="module")
def chart() -> Iterator[helm.Chart]:
    with helm.Chart.load(CHART_DIR) as loaded:
        yield loaded


@pytest.fixture(scope="module")
def default_release(chart: helm.Chart) -> Release:
    return _render(chart, "stride", {})


@pytest.fixture(scope="module")
def override_release(chart: helm.Chart) -> Release:
    return _render(chart, "prod", OVERRIDES)


@pytest.fixture(scope="module")
def insecure_release(chart: helm.Chart) -> Release:
    return _render(chart, "stride", INSECURE)


@pytest.fixture(params=["default", "override", "insecure"])
def release(request: pytest.FixtureRequest) -> Release:
    rendered: Release = request.getfixturevalue(f"{request.param}_release")
    return rendered


def _container(deployment: Manifest) -> Manifest:
    containers = deployment["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    container: Manifest = containers[0]
    return container


def _env(container: Manifest) -> dict[str, Any]:
    return {item["name"]: item.get("value", item.get("valueFrom")) for item in container["env"]}


@pytest.mark.parametrize("values", [{}, OVERRIDES], ids=["default", "override"])
def test_chart_lints_strictly(values: dict[str, Any]) -> None:
    report = helm.lint(CHART_DIR, values, strict=True, kube_version=f"v{KUBE_VERSION}.0")
    problems = [message for message in report["messages"] if message["severity"] >= 2]
    assert not problems, problems
    assert not report["errors"], report["errors"]


def test_every_manifest_is_valid_kubernetes(release: Release) -> None:
    assert release.manifests
    failures = []
    for manifest in release.manifests:
        if manifest["apiVersion"].startswith("cert-manager.io/"):
            continue  # a CRD kubernetes-validate has no schema for: see the Certificate tests
        try:
            kubernetes_validate.validate(manifest, KUBE_VERSION, strict=True)
        except kubernetes_validate.ValidationError as error:
            failures.append(f"{manifest['kind']}/{manifest['metadata']['name']}: {error.message}")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("contract", DEPLOYED_SERVICES, ids=lambda contract: contract.name)
def test_server_deployment_probes_its_grpc_health_service(
    release: Release, contract: ServiceContract
) -> None:
    deployment = release.get("Deployment", contract.name)
    container = _container(deployment)
    # Liveness asks for the whole server (""), so losing NATS does not restart the pod; a
    # standby pod watcher (no Lease) is alive and not ready, so it starts on liveness too.
    probes = {
        "startupProbe": "" if contract.name == "podwatcher" else contract.health_service,
        "readinessProbe": contract.health_service,
        "livenessProbe": "",
    }
    for probe, service in probes.items():
        if release.tls:
            # The kubelet's gRPC probe has no client certificate: the probe runs in the
            # container, with its TLS settings, as the service itself.
            assert "grpc" not in container[probe], probe
            assert container[probe]["exec"]["command"] == [
                "python",
                "-m",
                "stride.runtime.healthcheck",
                "--address",
                f"127.0.0.1:{contract.grpc_port}",
                "--service",
                service,
            ], probe
            # Starting Python takes longer than the default second.
            assert container[probe]["timeoutSeconds"] >= 5, probe
        else:
            assert "exec" not in container[probe], probe
            assert container[probe]["grpc"] == {"port": contract.grpc_port, "service": service}
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert ports == {"grpc": contract.grpc_port, "metrics": METRICS_PORT}
    assert container["name"] == contract.name
    assert container["command"] == ["python", "-m", contract.module]

    image = release.values["image"]
    tag = image["tag"] or release.app_version
    assert container["image"] == f"{image['repository']}/{contract.name}:{tag}"
    assert container["imagePullPolicy"] == image["pullPolicy"]
    assert deployment["spec"]["replicas"] == release.values["services"][contract.name]["replicas"]


@pytest.mark.parametrize("contract", DEPLOYED_SERVICES, ids=lambda contract: contract.name)
def test_server_settings(release: Release, contract: ServiceContract) -> None:
    env = _env(_container(release.get("Deployment", contract.name)))
    prefix = contract.env_prefix
    assert env[f"{prefix}GRPC_PORT"] == str(contract.grpc_port)
    assert env[f"{prefix}METRICS_PORT"] == str(METRICS_PORT)
    assert env["STRIDE_NATS_URL"]
    assert env.get("STRIDE_OTLP_ENDPOINT") == (release.values["otlp"]["endpoint"] or None)
    if contract.has_database:
        assert env[f"{prefix}AUTO_MIGRATE"] == "false"
        assert "secretKeyRef" in env["STRIDE_DATABASE_URL"], "the URL holds a password"
    else:
        assert "STRIDE_DATABASE_URL" not in env


@pytest.mark.parametrize("contract", DEPLOYED_SERVICES, ids=lambda contract: contract.name)
def test_server_has_its_tls_identity_or_runs_insecure_only_when_asked(
    release: Release, contract: ServiceContract
) -> None:
    deployment = release.get("Deployment", contract.name)
    container = _container(deployment)
    env = _env(container)
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    mounts = {Path(m["mountPath"]): m for m in container["volumeMounts"]}
    # The health probe runs as the service: it presents this certificate, expects it back.
    assert env[IDENTITY_ENV] == contract.name
    if release.tls:
        mount = mounts[TLS_DIR]
        assert mount["readOnly"] is True
        secret = volumes[mount["name"]]["secret"]
        assert secret["secretName"] == release.tls_secret(contract.name)
        # Owner root, group fsGroup (the images' user): readable to the service only.
        assert secret["defaultMode"] == 0o440
        assert release.values["podSecurityContext"]["fsGroup"] == 10001
        # cert-manager's Secret layout, read by stride.runtime.tls.
        assert env[tls.CERT_FILE_ENV] == str(TLS_DIR / "tls.crt")
        assert env[tls.KEY_FILE_ENV] == str(TLS_DIR / "tls.key")
        assert env[tls.CA_FILE_ENV] == str(TLS_DIR / "ca.crt")
        assert tls.INSECURE_ENV not in env
        assert tls.TLS_DIR_ENV not in env
    else:
        assert env[tls.INSECURE_ENV] == "1"
        assert tls.insecure({tls.INSECURE_ENV: env[tls.INSECURE_ENV]})
        assert TLS_DIR not in mounts
        assert not any("secret" in volume for volume in volumes.values())
        for name in (tls.CERT_FILE_ENV, tls.KEY_FILE_ENV, tls.CA_FILE_ENV, tls.TLS_DIR_ENV):
            assert name not in env


def test_tls_off_must_be_asked_for_as_insecure(chart: helm.Chart) -> None:
    with pytest.raises(helm.HelmRenderError, match=r"tls\.enabled=false.*tls\.insecure=true"):
        chart.render({"tls": {"enabled": False}}, name="stride", namespace=NAMESPACE)
    # Asked for: plain text, whatever tls.enabled says.
    for enabled in (False, True):
        release = _render(chart, "stride", {"tls": {"enabled": enabled, "insecure": True}})
        env = _env(_container(release.get("Deployment", "admission")))
        assert env[tls.INSECURE_ENV] == "1"


def test_insecure_is_warned_about_in_the_notes(release: Release) -> None:
    notes = release.files["stride/templates/NOTES.txt"]
    assert ("WARNING: tls.insecure=true" in notes) is not release.tls
    assert ("mutual TLS" in notes) is release.tls


def test_the_podwatcher_passes_the_training_pods_tls_secrets(release: Release) -> None:
    env = _env(_container(release.get("Deployment", "podwatcher")))
    if release.tls:
        assert env["STRIDE_PODWATCHER_KUBE_TRAINER_TLS_SECRET"] == release.tls_secret("trainer")
        assert env["STRIDE_PODWATCHER_KUBE_AGENT_TLS_SECRET"] == release.tls_secret("agent")
    else:
        assert "STRIDE_PODWATCHER_KUBE_TRAINER_TLS_SECRET" not in env


def test_migrations_need_no_tls(release: Release) -> None:
    # They talk to PostgreSQL only, and run as hooks before cert-manager could issue.
    for job in release.of_kind("Job"):
        if not job["metadata"]["name"].endswith("-migrate"):
            continue
        pod_spec = job["spec"]["template"]["spec"]
        assert not any("secret" in volume for volume in pod_spec["volumes"])


def test_certificates_come_from_cert_manager_when_asked(release: Release) -> None:
    certificates = release.of_kind("Certificate")
    if not release.cert_manager:
        assert not certificates
        return
    pod_namespace = release.values["podwatcher"]["namespace"] or NAMESPACE
    cert_manager = release.values["tls"]["certManager"]
    by_identity = {c["spec"]["commonName"]: c for c in certificates}
    assert len(by_identity) == len(certificates)
    # The same identities `stride certs init` issues, and every Deployment's among them.
    assert set(by_identity) == set(tls.IDENTITIES)
    for identity, certificate in by_identity.items():
        assert certificate["apiVersion"] == "cert-manager.io/v1"
        name = f"{release.prefix()}-{identity}"
        namespace = pod_namespace if identity in POD_IDENTITIES else NAMESPACE
        metadata = certificate["metadata"]
        assert metadata["name"] == name
        assert metadata["namespace"] == namespace
        assert metadata["labels"]["app.kubernetes.io/component"] == identity
        spec = certificate["spec"]
        assert spec["secretName"] == release.tls_secret(identity)
        # Clients check the bare identity (grpc.ssl_target_name_override).
        assert spec["dnsNames"] == [identity, name, f"{name}.{namespace}.svc"]
        assert set(spec["usages"]) == {
            "server auth",
            "client auth",
            "digital signature",
            "key encipherment",
        }
        assert spec["duration"] == cert_manager["duration"]
        assert spec["issuerRef"] == {
            "name": cert_manager["issuerRef"]["name"],
            "kind": cert_manager["issuerRef"]["kind"],
            "group": "cert-manager.io",
        }
        # The subset of the CRD's schema the chart uses.
        assert set(spec) <= {
            "secretName",
            "secretTemplate",
            "commonName",
            "dnsNames",
            "usages",
            "duration",
            "privateKey",
            "issuerRef",
        }
        assert spec["privateKey"]["rotationPolicy"] in {"Always", "Never"}
        assert len(spec["commonName"]) <= 64
    for contract in DEPLOYED_SERVICES:
        volumes = release.get("Deployment", contract.name)["spec"]["template"]["spec"]["volumes"]
        secrets = {v["secret"]["secretName"] for v in volumes if "secret" in v}
        # The podwatcher also signs training pods' NATS users (an nkey cert-manager cannot
        # issue: `stride certs init --kubernetes-secrets` writes its Secret).
        callout = {f"{release.prefix()}-nats-callout"} if contract.name == "podwatcher" else set()
        assert secrets == {by_identity[contract.name]["spec"]["secretName"], *callout}


def test_cert_manager_needs_an_issuer(chart: helm.Chart) -> None:
    with pytest.raises(helm.HelmRenderError, match=r"tls\.certManager\.issuerRef\.name"):
        chart.render(
            {"tls": {"certManager": {"enabled": True}}}, name="stride", namespace=NAMESPACE
        )


def test_without_cert_manager_the_notes_say_how_to_make_the_secrets(
    default_release: Release,
) -> None:
    notes = default_release.files["stride/templates/NOTES.txt"]
    command = (
        "python -m stride.runtime.certs init DIR --kubernetes-secrets secrets.yaml \\\n"
        f"    --fullname {default_release.prefix()} --namespace {NAMESPACE}"
    )
    assert command in notes
    assert "kubectl apply -f secrets.yaml" in notes
    assert default_release.tls_secret("<component>") in notes


def test_pod_secrets_go_to_the_pod_namespace_too(chart: helm.Chart) -> None:
    release = _render(chart, "stride", {"podwatcher": {"namespace": "training"}})
    notes = release.files["stride/templates/NOTES.txt"]
    assert f"--fullname {release.prefix()} --namespace training" in notes


@pytest.mark.parametrize("contract", DEPLOYED_SERVICES, ids=lambda contract: contract.name)
def test_server_service_exposes_grpc_and_metrics(
    release: Release, contract: ServiceContract
) -> None:
    service = release.get("Service", contract.name)
    ports = {port["name"]: (port["port"], port["targetPort"]) for port in service["spec"]["ports"]}
    assert ports == {"grpc": (contract.grpc_port, "grpc"), "metrics": (METRICS_PORT, "metrics")}
    grpc_port = next(port for port in service["spec"]["ports"] if port["name"] == "grpc")
    # Cleartext HTTP/2 only without TLS; with it, nothing in between may parse the stream.
    assert grpc_port.get("appProtocol") == (None if release.tls else "kubernetes.io/h2c")
    pod_labels = release.get("Deployment", contract.name)["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()


@pytest.mark.parametrize("contract", DEPLOYED_SERVICES, ids=lambda contract: contract.name)
def test_server_runs_as_non_root(release: Release, contract: ServiceContract) -> None:
    deployment = release.get("Deployment", contract.name)
    pod_security = deployment["spec"]["template"]["spec"]["securityContext"]
    assert pod_security["runAsNonRoot"] is True
    assert pod_security["runAsUser"] != 0
    container_security = _container(deployment)["securityContext"]
    assert container_security["allowPrivilegeEscalation"] is False


def test_agent_is_not_deployed(release: Release) -> None:
    components = {
        manifest["metadata"]["labels"]["app.kubernetes.io/component"]
        for manifest in release.of_kind("Deployment") + release.of_kind("Service")
    }
    assert components == {contract.name for contract in DEPLOYED_SERVICES}


@pytest.mark.parametrize("contract", DATABASE_SERVICES, ids=lambda contract: contract.name)
def test_database_service_is_migrated_by_a_hook_job(
    release: Release, contract: ServiceContract
) -> None:
    job = release.get("Job", f"{contract.name}-migrate")
    hooks = set(job["metadata"]["annotations"]["helm.sh/hook"].split(","))
    assert {"pre-install", "pre-upgrade"} <= hooks
    container = _container(job)
    assert container["command"] == ["python", "-m", contract.module, "migrate"]
    assert "secretKeyRef" in _env(container)["STRIDE_DATABASE_URL"]
    server_image = _container(release.get("Deployment", contract.name))["image"]
    assert container["image"] == server_image


def test_only_database_services_have_migration_jobs(release: Release) -> None:
    jobs = {job["metadata"]["name"] for job in release.of_kind("Job")} - {
        f"{release.prefix()}-bus-init-1"
    }
    assert jobs == {f"{release.prefix()}-{c.name}-migrate" for c in DATABASE_SERVICES}


def test_default_database_url_secret_exists_before_the_migrations(
    default_release: Release,
) -> None:
    secret = default_release.get("Secret", "database")
    annotations = secret["metadata"]["annotations"]
    assert {"pre-install", "pre-upgrade"} <= set(annotations["helm.sh/hook"].split(","))
    job = default_release.get("Job", "admission-migrate")
    job_weight = int(job["metadata"]["annotations"].get("helm.sh/hook-weight", "0"))
    assert int(annotations["helm.sh/hook-weight"]) < job_weight
    reference = _env(_container(job))["STRIDE_DATABASE_URL"]["secretKeyRef"]
    assert reference["name"] == secret["metadata"]["name"]
    assert reference["key"] in secret["stringData"]


def test_existing_database_secret_is_used_instead(override_release: Release) -> None:
    # (The TLS Secrets are cert-manager's or the operator's, never the chart's.)
    assert not override_release.of_kind("Secret")
    for contract in DATABASE_SERVICES:
        env = _env(_container(override_release.get("Deployment", contract.name)))
        assert env["STRIDE_DATABASE_URL"]["secretKeyRef"] == {"name": "stride-db", "key": "dsn"}


def test_podwatcher_has_rbac_for_training_pods(release: Release) -> None:
    deployment = release.get("Deployment", "podwatcher")
    pod_spec = deployment["spec"]["template"]["spec"]
    account = release.get("ServiceAccount", "podwatcher")
    assert pod_spec["serviceAccountName"] == account["metadata"]["name"]
    assert pod_spec["automountServiceAccountToken"] is True

    pod_namespace = release.values["podwatcher"]["namespace"] or NAMESPACE
    # Pods run in their StrideJob's namespace: the pod rules are cluster-wide, exactly
    # what the backend calls (tests/e2e/test_kubernetes.py runs it with this role).
    role = release.get("ClusterRole", "podwatcher")
    granted: dict[str, set[str]] = {}
    for rule in role["rules"]:
        assert rule["apiGroups"] in ([""], ["networking.k8s.io"], ["stride.io"])
        for resource in rule["resources"]:
            granted.setdefault(resource, set()).update(rule["verbs"])
    assert granted["pods"] == {"list", "watch", "create", "delete"}
    assert granted["pods/resize"] == {"patch"} and granted["pods/eviction"] == {"create"}
    assert granted["networkpolicies"] == {"create"}  # each job's own
    assert granted["nodes"] == {"list", "watch", "patch"}
    assert granted["stridejobs/status"] == {"patch"}
    binding = release.get("ClusterRoleBinding", "podwatcher")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["metadata"]["name"], "namespace": NAMESPACE}
    ]
    lease = release.get("Role", "podwatcher-lease")
    assert lease["metadata"]["namespace"] == pod_namespace
    assert lease["rules"] == [
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "verbs": ["get", "create", "update"],
        }
    ]

    env = _env(_container(deployment))
    assert env["STRIDE_PODWATCHER_BACKEND"] == "kubernetes"
    assert env["STRIDE_PODWATCHER_NAMESPACE"] == pod_namespace
    server_image = _container(deployment)["image"]
    assert env["STRIDE_PODWATCHER_AGENT_IMAGE"] == server_image.replace("/podwatcher:", "/agent:")
    # The pods reach the dispatcher and the checkpoint cache through their Services.
    for name, port in (("dispatcher", 50055), ("ckptcache", 50056)):
        service = release.get("Service", name)
        address = env[f"STRIDE_PODWATCHER_{name.upper()}_ADDRESS"]
        assert address == f"{service['metadata']['name']}.{NAMESPACE}.svc:{port}", address


def test_only_the_podwatcher_gets_an_api_token(release: Release) -> None:
    for contract in DEPLOYED_SERVICES:
        if contract.name != "podwatcher":
            pod_spec = release.get("Deployment", contract.name)["spec"]["template"]["spec"]
            assert pod_spec["automountServiceAccountToken"] is False, contract.name


def test_ckptcache_has_memory_backed_shm_and_a_store(release: Release) -> None:
    deployment = release.get("Deployment", "ckptcache")
    pod_spec = deployment["spec"]["template"]["spec"]
    volumes = {volume["name"]: volume for volume in pod_spec["volumes"]}
    mounts = {mount["mountPath"]: mount["name"] for mount in _container(deployment)["volumeMounts"]}

    shm = volumes[mounts["/dev/shm"]]
    assert shm["emptyDir"]["medium"] == "Memory"
    assert shm["emptyDir"]["sizeLimit"] == release.values["ckptcache"]["shm"]["sizeLimit"]

    store_dir = _env(_container(deployment))["STRIDE_CKPTCACHE_STORE_DIR"]
    store = volumes[mounts[store_dir]]
    persistence = release.values["ckptcache"]["store"]["persistence"]
    if persistence["enabled"]:
        claim = release.get("PersistentVolumeClaim", "ckptcache-store")
        assert store["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
        assert claim["spec"]["storageClassName"] == persistence["storageClass"]
        assert deployment["spec"]["strategy"]["type"] == "Recreate"
    else:
        assert store == {"name": store["name"], "emptyDir": {}}
        assert not release.of_kind("PersistentVolumeClaim")


def test_notes_point_at_the_admission_api(release: Release) -> None:
    notes = release.files["stride/templates/NOTES.txt"]
    assert f"svc/{release.prefix()}-admission 50051:50051" in notes


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        ({"services": {"admission": {"replicas": -1}}}, "/services/admission/replicas"),
        ({"services": {"executor": {"replicas": "3"}}}, "/services/executor/replicas"),
        ({"image": {"repository": None}}, "repository"),
        ({"image": {"repository": ""}}, "/image/repository"),
        ({"image": {"pullPolicy": "Sometimes"}}, "/image/pullPolicy"),
        ({"database": {"url": "", "existingSecret": ""}}, "/database"),
        ({"services": {"agent": {"replicas": 1}}}, "agent"),
        ({"replicaCount": 2}, "replicaCount"),
        ({"tls": {"insecure": "yes"}}, "/tls/insecure"),
        ({"tls": {"enable": False}}, "enable"),
        ({"tls": {"certManager": {"duration": "90d"}}}, "/tls/certManager/duration"),
    ],
    ids=[
        "negative-replicas",
        "string-replicas",
        "null-repository",
        "empty-repository",
        "unknown-pull-policy",
        "no-database",
        "agent-deployment",
        "unknown-key",
        "string-insecure",
        "tls-typo",
        "days-duration",
    ],
)
def test_bad_values_are_rejected_by_the_schema(
    chart: helm.Chart, values: dict[str, Any], complaint: str
) -> None:
    with pytest.raises(helm.HelmValuesError, match="schema") as caught:
        chart.render(values, name="stride", namespace=NAMESPACE)
    assert complaint in str(caught.value)


def test_lint_reports_bad_values() -> None:
    report = helm.lint(
        CHART_DIR,
        {"services": {"admission": {"replicas": -1}}},
        strict=True,
        kube_version=f"v{KUBE_VERSION}.0",
    )
    assert any("/services/admission/replicas" in error for error in report["errors"])


@pytest.mark.parametrize("name", ["optimizer", "admission"])
def test_warm_starts_come_from_the_config_db_service(release: Release, name: str) -> None:
    deployment = release.get("Deployment", name)
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    address = _env(container)[f"STRIDE_{name.upper()}_CONFIGDB_ADDRESS"]
    service = release.get("Service", "configdb")
    ports = [port["port"] for port in service["spec"]["ports"]]
    assert address == f"{service['metadata']['name']}:50054" and 50054 in ports


def test_the_optimizer_is_bounded_by_the_cluster_capacity_given(release: Release) -> None:
    (container,) = release.get("Deployment", "optimizer")["spec"]["template"]["spec"]["containers"]
    env = _env(container)
    capacity = release.values.get("optimizer", {}).get("clusterCapacity")
    if capacity is None:
        assert "STRIDE_OPTIMIZER_CLUSTER_CPU" not in env
        assert "STRIDE_OPTIMIZER_CLUSTER_MEMORY_GIB" not in env
    else:
        assert env["STRIDE_OPTIMIZER_CLUSTER_CPU"] == "512"
        assert env["STRIDE_OPTIMIZER_CLUSTER_MEMORY_GIB"] == "2048"


def test_admission_plans_on_the_cluster_given(release: Release) -> None:
    (container,) = release.get("Deployment", "admission")["spec"]["template"]["spec"]["containers"]
    env = _env(container)
    cluster = release.values.get("admission", {}).get("cluster")
    if cluster is None:  # the podwatcher's node inventory
        assert not any(name.startswith("STRIDE_ADMISSION_CLUSTER_") for name in env)
        assert "STRIDE_ADMISSION_CAPACITY_SOURCE" not in env
    else:
        assert env["STRIDE_ADMISSION_CAPACITY_SOURCE"] == "settings"
        assert env["STRIDE_ADMISSION_CLUSTER_GPUS"] == "64"
        assert env["STRIDE_ADMISSION_CLUSTER_TOPOLOGY"] == "2x4x8"
        assert env["STRIDE_ADMISSION_CLUSTER_CPU"] == "512"
        assert env["STRIDE_ADMISSION_CLUSTER_MEMORY_GIB"] == "2048"
        # The service's own settings take what the chart renders (the tree holds the GPUs).
        settings = AdmissionSettings(
            **{
                name.removeprefix("STRIDE_ADMISSION_").lower(): value
                for name, value in env.items()
                if name.startswith("STRIDE_ADMISSION_CLUSTER_")
            }
        )
        assert settings.cluster_topology == "2x4x8" and settings.cluster_gpus == 64


@pytest.mark.parametrize(
    "cluster",
    [{"cpu": 8}, {"gpuTopology": "2x4x8"}, {"gpus": 64, "gpuTopology": "2 switches"}],
    ids=["cpu-without-memory", "tree-without-gpus", "tree-not-a-shape"],
)
def test_half_an_admission_cluster_is_rejected(chart: helm.Chart, cluster: Manifest) -> None:
    with pytest.raises(helm.HelmValuesError, match="schema"):
        chart.render({"admission": {"cluster": cluster}}, name="stride", namespace=NAMESPACE)


def test_a_half_given_cluster_capacity_is_rejected(chart: helm.Chart) -> None:
    with pytest.raises(helm.HelmValuesError, match="schema"):
        chart.render(
            {"optimizer": {"clusterCapacity": {"cpu": 8}}}, name="stride", namespace=NAMESPACE
        )


def test_admission_loads_the_quotas_the_values_give(release: Release) -> None:
    deployment = release.get("Deployment", "admission")
    container = _container(deployment)
    env = _env(container)
    quotas = release.values.get("admission", {}).get("quotas")
    if not quotas:
        assert "STRIDE_ADMISSION_QUOTAS_FILE" not in env
        return
    path = Path(env["STRIDE_ADMISSION_QUOTAS_FILE"])
    mount = next(m for m in container["volumeMounts"] if m["name"] == "quotas")
    assert path.parent == Path(mount["mountPath"])
    volume = next(
        v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == "quotas"
    )
    config_map = release.get("ConfigMap", "admission-quotas")
    assert volume["configMap"]["name"] == config_map["metadata"]["name"]
    # The file as admission reads it: the service's own loader accepts it, entry for entry.
    loaded = quotas_from_config(yaml.safe_load(config_map["data"][path.name]))
    assert [(q.scope, q.max_active_jobs, q.max_submissions, q.members) for q in loaded] == [
        ("team:ranking", 8, 0, ("alice", "bob")),
        ("user:carol", 0, 20, ()),
    ]
    assert loaded[1].window_seconds == 3600


def test_a_quota_with_a_bad_scope_is_rejected(chart: helm.Chart) -> None:
    with pytest.raises(helm.HelmValuesError, match="schema"):
        chart.render(
            {"admission": {"quotas": [{"scope": "alice", "max_active_jobs": 1}]}},
            name="stride",
            namespace=NAMESPACE,
        )


NATS_TLS = Path("/etc/nats/stride-tls")


def chart_nats_lockdown() -> str:
    """What files/nats-lockdown.conf must hold: the bus contract's lock-down over the nats
    Secret's files where the chart tells operators to mount it."""
    return config_text(
        Path("."),
        cert=str(NATS_TLS / "tls.crt"),
        key=str(NATS_TLS / "tls.key"),
        ca=str(NATS_TLS / "ca.crt"),
        callout_issuer="env",
    )


def test_the_charts_nats_lockdown_is_the_bus_contracts() -> None:
    shipped = (CHART_DIR / "files" / "nats-lockdown.conf").read_text()
    assert shipped == chart_nats_lockdown(), (
        "deploy/helm/stride/files/nats-lockdown.conf drifted from stride.bus.permissions; "
        "regenerate it: python -m stride.bus.lockdown config "
        f"--cert {NATS_TLS}/tls.crt --key {NATS_TLS}/tls.key --ca {NATS_TLS}/ca.crt "
        "--callout-issuer env --out deploy/helm/stride/files/nats-lockdown.conf"
    )


def test_the_chart_locks_nats_down(release: Release) -> None:
    """With TLS: the lock-down configuration for the operator's NATS, and a Job (not a hook:
    `helm install --wait` would wait on servers waiting for it) that declares the streams as
    the bus administrator with the cli certificate. The servers connect over TLS."""
    configs = [m for m in release.of_kind("ConfigMap") if "nats-lockdown" in m["metadata"]["name"]]
    jobs = [j for j in release.of_kind("Job") if "bus-init" in j["metadata"]["name"]]
    if not release.tls:
        assert configs == [] and jobs == []
        return
    config = release.get("ConfigMap", "nats-lockdown")
    assert config["data"]["stride-lockdown.conf"] == chart_nats_lockdown()
    job = release.get("Job", "bus-init-1")
    assert "helm.sh/hook" not in job["metadata"].get("annotations", {})
    container = _container(job)
    url = release.values["nats"]["url"]
    assert url.startswith("tls://")
    assert container["command"] == [
        "python", "-m", "stride.bus.lockdown", "init", "--url", url
    ]  # fmt: skip
    env = _env(container)
    assert env[tls.CERT_FILE_ENV] == str(TLS_DIR / "tls.crt")
    assert env[tls.KEY_FILE_ENV] == str(TLS_DIR / "tls.key")
    assert env[tls.CA_FILE_ENV] == str(TLS_DIR / "ca.crt")
    pod_spec = job["spec"]["template"]["spec"]
    mount = {Path(m["mountPath"]): m for m in container["volumeMounts"]}[TLS_DIR]
    volume = {v["name"]: v for v in pod_spec["volumes"]}[mount["name"]]
    assert volume["secret"]["secretName"] == release.tls_secret("cli")
    assert pod_spec["restartPolicy"] == "OnFailure"
    for contract in DEPLOYED_SERVICES:
        assert _env(_container(release.get("Deployment", contract.name)))["STRIDE_NATS_URL"] == url
    notes = release.files["stride/templates/NOTES.txt"]
    assert config["metadata"]["name"] in notes and release.tls_secret("nats") in notes


def test_nats_lockdown_can_be_left_to_the_operator(chart: helm.Chart) -> None:
    release = _render(
        chart, "stride", {"nats": {"url": "tls://n:4222", "lockdown": {"enabled": False}}}
    )
    names = {m["metadata"]["name"] for m in release.manifests}
    assert not any("nats-lockdown" in name or "bus-init" in name for name in names)
    with pytest.raises(helm.HelmValuesError, match="schema"):
        chart.render({"nats": {"lockdown": {"enabled": "yes"}}}, name="stride", namespace=NAMESPACE)


def test_training_pods_admit_only_the_pod_watcher_and_their_own_jobs_pods(
    release: Release,
) -> None:
    """#37 finding 1 on Kubernetes: a TensorFlow server runs whatever graph a client sends.
    The chart's policy selects every training pod and admits only the pod watcher; the pod
    watcher's per-job policy admits the job's own pods on the TensorFlow port. Another
    job's pod matches neither."""
    pod_namespace = release.values["podwatcher"]["namespace"] or NAMESPACE
    policy = release.get("NetworkPolicy", "training-pods")
    assert policy["metadata"]["namespace"] == pod_namespace
    spec = policy["spec"]
    training = spec["podSelector"]["matchLabels"]
    assert training["app.kubernetes.io/component"] == "training-pod"
    assert spec["policyTypes"] == ["Ingress"]
    (rule,) = spec["ingress"]
    (peer,) = rule["from"]
    assert peer["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "podwatcher"
    assert peer["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": NAMESPACE}

    job = job_network_policy("job-a", pod_namespace, training)
    own = {**training, JOB_LABEL: "job-a"}
    assert job["spec"]["podSelector"]["matchLabels"] == own
    (allowed,) = job["spec"]["ingress"]
    assert allowed["from"] == [{"podSelector": {"matchLabels": own}}]
    assert allowed["ports"] == [{"protocol": "TCP", "port": TENSORFLOW_PORT_NAME}]
    other = {**training, JOB_LABEL: "job-b"}
    assert not all(other.get(k) == v for k, v in own.items())  # job B's pods do not match


def test_the_training_pod_policy_can_be_turned_off(chart: helm.Chart) -> None:
    off = _render(chart, "stride", {"podwatcher": {"networkPolicy": {"enabled": False}}})
    assert off.of_kind("NetworkPolicy") == []
