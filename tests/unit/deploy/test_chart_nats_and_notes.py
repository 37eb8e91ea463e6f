"""The chart's (and compose's) NATS is locked down as `stride up`'s is, system account and
all, and the chart's NOTES.txt says what the chart and the CLI really do.

Before, the chart's files/nats-lockdown.conf had no system account: on Kubernetes the pod
watcher could not end a revoked job's NATS sessions (``stride.bus.sessions``), which then
lasted until their NATS user expired.
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml

from stride.bus import callout, permissions
from stride.bus.lockdown import config_text
from stride.bus.lockdown import main as lockdown_main
from stride.cli import endpoints
from stride.runtime import certs, tokens
from stride.runtime.embedded_nats import nats_server_binary

from . import CHART_DIR, COMPOSE_FILE, REPO_ROOT
from .test_helm import INSECURE, NAMESPACE, OVERRIDES, Release, _container, _env, _render

pytestmark = pytest.mark.deploy

CHART_CONFIG = CHART_DIR / "files" / "nats-lockdown.conf"
NATS_TLS = "/etc/nats/stride-tls"
"""Where the chart tells operators to mount the nats Secret (tls.crt, tls.key, ca.crt)."""
CLI_SOURCE = REPO_ROOT / "libs" / "cli" / "stride" / "cli"


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A deployment's folder, as `stride certs init` makes it for `stride up`."""
    made = tmp_path_factory.mktemp("tls")
    certs.init(made, identities=("nats", "podwatcher"))
    return made


def _callout_secret(folder: Path, fullname: str = "stride") -> dict[str, str]:
    """The Secret "<fullname>-nats-callout" `stride certs init --kubernetes-secrets` writes."""
    documents = yaml.safe_load_all(certs.kubernetes_secrets(folder, fullname, NAMESPACE, ()))
    secret = next(d for d in documents if d["metadata"]["name"] == f"{fullname}-nats-callout")
    return {key: base64.b64decode(value).decode() for key, value in secret["data"].items()}


def _as_nats_reads_it(text: str, environ: dict[str, str], folder: Path) -> str:
    """``text`` with each environment variable it names resolved as NATS resolves it (a bare
    ``$NAME`` is the variable's value), and the nats Secret's files where ``folder`` has
    them."""

    def resolve(match: re.Match[str]) -> str:
        return json.dumps(environ[match.group(1)])

    resolved = re.sub(r"(?<![\"\w])\$([A-Z_]+)\b", resolve, text)
    for mounted, name in (("tls.crt", "nats.crt"), ("tls.key", "nats.key"), ("ca.crt", "ca.crt")):
        resolved = resolved.replace(f"{NATS_TLS}/{mounted}", str(folder / name))
    return resolved


def _nats_environment(folder: Path) -> dict[str, str]:
    """What NOTES tells operators to give NATS: two keys of the nats-callout Secret."""
    secret = _callout_secret(folder)
    return {
        callout.ISSUER_ENV: secret["issuer"],
        permissions.SYSTEM_USER_ENV: secret[certs.SYSTEM_USER_KEY],
    }


def test_the_charts_nats_is_stride_ups_with_the_secrets_keys(folder: Path) -> None:
    """The chart's configuration, with the variables NATS reads from the nats-callout Secret,
    is `stride up`'s over the same folder, byte for byte: the same system account, the same
    system user (an nkey, not a certificate identity, as `stride up` maps it), and that user
    among the callout's auth_users."""
    stride_up = config_text(folder)  # what `stride up` runs its NATS with (supervisor)
    system_user = _callout_secret(folder)[certs.SYSTEM_USER_KEY]
    assert f'system_account: "{permissions.SYSTEM_ACCOUNT}"' in stride_up
    assert f'"nkey": "{system_user}"' in stride_up
    chart = CHART_CONFIG.read_text()
    assert f'system_account: "{permissions.SYSTEM_ACCOUNT}"' in chart
    assert f'"nkey": {permissions.SYSTEM_USER_FROM_ENVIRONMENT}' in chart
    assert _as_nats_reads_it(chart, _nats_environment(folder), folder) == stride_up
    # The seed the pod watcher connects with is the one whose public key NATS trusts.
    seed = _callout_secret(folder)[certs.SYSTEM_SEED_NAME]
    assert seed == (folder / certs.SYSTEM_SEED_NAME).read_text().strip()


def test_the_charts_nats_config_is_regenerated_by_its_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The command templates/nats-lockdown.yaml names writes the shipped file (no folder
    read: a configuration for any deployment)."""
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "nats-lockdown.conf"
    assert (
        lockdown_main(
            [
                "config",
                *("--cert", f"{NATS_TLS}/tls.crt", "--key", f"{NATS_TLS}/tls.key"),
                *("--ca", f"{NATS_TLS}/ca.crt", "--callout-issuer", "env"),
                *("--out", str(out)),
            ]
        )
        == 0
    )
    assert out.read_text() == CHART_CONFIG.read_text()
    assert "--callout-issuer env --out files/nats-lockdown.conf" in " ".join(
        (CHART_DIR / "templates" / "nats-lockdown.yaml").read_text().split()
    )


def test_nats_takes_the_charts_config_only_with_both_variables(folder: Path) -> None:
    config = folder / "chart.conf"
    config.write_text(CHART_CONFIG.read_text().replace(NATS_TLS, str(folder)))
    (folder / "tls.crt").write_bytes((folder / "nats.crt").read_bytes())
    (folder / "tls.key").write_bytes((folder / "nats.key").read_bytes())
    clean = {k: v for k, v in os.environ.items() if not k.startswith("STRIDE_NATS_")}

    def check(environ: dict[str, str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [nats_server_binary(), "-t", "-c", str(config)],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
            env={**clean, **environ},
        )

    environ = _nats_environment(folder)
    checked = check(environ)
    assert checked.returncode == 0 and "is valid" in checked.stdout + checked.stderr, checked
    del environ[permissions.SYSTEM_USER_ENV]
    refused = check(environ)
    assert refused.returncode != 0
    assert permissions.SYSTEM_USER_ENV in refused.stdout + refused.stderr


def _compose() -> dict[str, Any]:
    services: dict[str, Any] = yaml.safe_load(COMPOSE_FILE.read_text())["services"]
    return services


def test_composes_nats_gets_the_system_user_of_its_certificates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Compose's `nats-config` one-shot, run over what its `certs` one-shot writes, gives NATS
    `stride up`'s configuration (system account and user from the folder's nats-system.nk);
    the podwatcher finds that seed where its callout seed is: the same folder."""
    services = _compose()
    volume = "tls"
    command = services["nats-config"]["command"]
    assert command[:4] == ["python", "-m", "stride.bus.lockdown", "config"]
    assert "--callout-issuer" not in command and "--system-user" not in command
    mounted = {v.split(":")[1]: v.split(":")[0] for v in services["nats-config"]["volumes"]}
    folder_in_container = next(path for path, name in mounted.items() if name == volume)
    certs.init(tmp_path / "tls", identities=("nats",))
    monkeypatch.delenv("STRIDE_TLS_DIR", raising=False)
    arguments = [part.replace(folder_in_container, str(tmp_path / "tls")) for part in command[3:]]
    assert lockdown_main(arguments) == 0
    written = (tmp_path / "tls" / "nats.conf").read_text()
    nats_paths = {command[i]: command[i + 1] for i in range(4, len(command) - 1)}
    stride_up = config_text(
        tmp_path / "tls",
        cert=nats_paths["--cert"],
        key=nats_paths["--key"],
        ca=nats_paths["--ca"],
    )
    assert written == stride_up
    assert f'system_account: "{permissions.SYSTEM_ACCOUNT}"' in written
    # The podwatcher: the callout seed from its certificate folder (the same volume), and
    # the system user's seed beside it (stride.wiring.serve_nats_callout).
    podwatcher = services["podwatcher"]
    environment = podwatcher["environment"]
    assert "STRIDE_PODWATCHER_NATS_CALLOUT_SEED_FILE" not in environment
    tls_dir = environment["STRIDE_TLS_DIR"]
    assert f"{volume}:{tls_dir}:ro" in podwatcher["volumes"]


@pytest.fixture(scope="module")
def chart() -> Iterator[helm.Chart]:
    with helm.Chart.load(CHART_DIR) as loaded:
        yield loaded


@pytest.fixture(scope="module", params=["default", "override", "insecure"])
def release(request: pytest.FixtureRequest, chart: helm.Chart) -> Release:
    name, values = {
        "default": ("stride", {}),
        "override": ("prod", OVERRIDES),
        "insecure": ("stride", INSECURE),
    }[request.param]
    return _render(chart, name, values)


@pytest.mark.parametrize("values", [{}, OVERRIDES], ids=["default", "override"])
def test_the_charts_podwatcher_gets_the_system_users_seed(
    chart: helm.Chart, folder: Path, values: dict[str, Any]
) -> None:
    """Where the pod watcher looks for the system user's seed (beside its callout seed:
    stride.wiring.serve_nats_callout), the chart mounts it from the nats-callout Secret,
    which `stride certs init --kubernetes-secrets` fills."""
    release = _render(chart, "stride", values)
    deployment = release.get("Deployment", "podwatcher")
    container = _container(deployment)
    callout_seed = Path(_env(container)["STRIDE_PODWATCHER_NATS_CALLOUT_SEED_FILE"])
    mount = next(
        m for m in container["volumeMounts"] if Path(m["mountPath"]) == callout_seed.parent
    )
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    secret = volumes[mount["name"]]["secret"]
    assert secret["secretName"] == f"{release.prefix()}-nats-callout"
    paths = {item["key"]: item["path"] for item in secret.get("items", [])}
    assert paths.get(certs.SYSTEM_SEED_NAME) == certs.SYSTEM_SEED_NAME
    assert certs.SYSTEM_SEED_NAME in _callout_secret(folder, release.prefix())


def _cli_services() -> set[str]:
    """The services the CLI calls: the first argument of its call/ask/address helpers."""
    source = "\n".join(path.read_text() for path in CLI_SOURCE.glob("*.py"))
    return set(re.findall(r"\b(?:call|ask|address)\(\s*\"([a-z]+)\"", source))


def test_the_notes_say_how_to_submit_and_name_the_clis_real_address_variables(
    release: Release, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    notes = release.files["stride/templates/NOTES.txt"]
    assert "kubectl apply" in notes and "StrideJob" in notes
    assert "kubectl get stridejobs" in notes and "k8s.<namespace>" in notes
    named = set(re.findall(r"\bSTRIDE_([A-Z]+)_ADDRESS\b", notes))
    called = _cli_services()
    assert called >= {"admission", "optimizer", "configdb", "dispatcher", "podwatcher"}
    # Exactly the variables the CLI reads: each one for a service it calls...
    assert named == {service.upper() for service in called}
    for service in called:
        variable = f"STRIDE_{service.upper()}_ADDRESS"
        # ...read where the CLI finds a service's address (stride.cli.endpoints.address)...
        monkeypatch.setenv(variable, "127.0.0.1:1")
        assert endpoints.address(service, tmp_path) == "127.0.0.1:1"
        # ...and forwarded to that service's port.
        port = next(
            p["port"]
            for p in release.get("Service", service)["spec"]["ports"]
            if p["name"] == "grpc"
        )
        assert f"svc/{release.prefix()}-{service} {port}:{port}" in notes
        assert f"export {variable}=127.0.0.1:{port}" in notes
    assert 'f"STRIDE_{service.upper()}_ADDRESS"' in (CLI_SOURCE / "endpoints.py").read_text()


def test_the_notes_name_the_secrets_the_pods_wait_for(release: Release) -> None:
    notes = " ".join(release.files["stride/templates/NOTES.txt"].split())
    if not release.tls:
        assert "STRIDE_TOKEN" not in notes  # plain text verifies no token
        return
    assert tokens.TOKEN_ENV in notes and tokens.TOKEN_FILE_ENV in notes
    # Training pods' certificates, in every namespace where their pods run.
    for identity in ("trainer", "agent"):
        assert f'"{release.tls_secret(identity)}"' in notes
    assert "every namespace where StrideJobs run" in notes
    # NATS: both per-deployment keys, from the Secret the generator writes them to.
    callout_secret = f"{release.prefix()}-nats-callout"
    assert f'"{callout_secret}"' in notes
    for variable, key in (
        (callout.ISSUER_ENV, "issuer"),
        (permissions.SYSTEM_USER_ENV, certs.SYSTEM_USER_KEY),
    ):
        assert f"{variable} (key {key}" in notes
