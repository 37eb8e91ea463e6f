"""A real Kubernetes control plane on loopback, for tests and benchmarks (envtest's pattern).

The pod watcher and the Helm chart talk to Kubernetes; a fake client would agree with
whatever the code under test assumes. :class:`KubeCluster` starts the real servers instead,
built from pinned modules by ``make kube-tools`` (``tools/kube/build.sh``) into
``.cache/kube/bin``, each as a process of its own on 127.0.0.1:

- kine: etcd's API on a SQLite file, so there is no etcd to run and nothing to clean up
  but the folder;
- kube-apiserver: TLS with a CA written here (clients verify it), RBAC, static bearer
  tokens for an admin (``system:masters``) and named users, and a service-account signing
  key, so the TokenRequest API (``kubectl create token``) works;
- kube-controller-manager (optional): the garbage collector (owner references), the
  Deployment and ReplicaSet controllers, service accounts in new namespaces;
- kube-scheduler (optional): pods without a ``nodeName`` get one;
- kwok: fake kubelets. Nodes labelled ``type=kwok`` (:meth:`KubeCluster.add_nodes`) turn
  Ready, pods bound to them turn Running with a pod IP, Job pods complete, deleted pods go
  away, and in-place resizes show in the pods' statuses. kwok v0.7.0 plays Stage objects:
  its built-in ones for nodes (node-initialize, node-heartbeat-with-lease), and for pods
  those of ``kwok_stages.yaml`` (``--config``): its built-in pod-ready, pod-complete and
  pod-delete, where pod-ready also reports container resources (without them the API
  server refuses every resize of a running pod), and a pod-resize stage. A pod annotated
  ``kwok.x-k8s.io/status=custom`` keeps whatever status a test writes (an OOM kill). Its
  home is the cluster's folder, so a ``~/.kwok/kwok.yaml`` on the machine changes nothing.

Every process runs in its own process group, which :meth:`KubeCluster.stop` kills. A start
takes a few seconds; the first ``make kube-tools`` takes minutes.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import ipaddress
import json
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from stride.runtime.certs import write_private
from stride.runtime.embedded_nats import free_port
from stride.runtime.processes import log_tail

PROJECT_ROOT = Path(__file__).resolve().parents[4]
KUBE_BIN = PROJECT_ROOT / ".cache" / "kube" / "bin"
"""Where ``make kube-tools`` puts the binaries."""
KUBECTL = os.environ.get("KUBECTL") or shutil.which("kubectl") or "/usr/bin/kubectl"
"""kubectl is not built: the machine's client (1.32 or later) speaks to the 1.34 servers."""
KWOK_STAGES = Path(__file__).with_name("kwok_stages.yaml")
"""kwok's pod stages: its built-in ones, with container resources in the statuses so that
the API server allows in-place resizes, and a stage that applies them (see the file)."""

ADMIN = "admin"
"""The static user in ``system:masters``; the default of every client method."""
NODE_LABEL = ("type", "kwok")
"""The label kwok selects its nodes by: a node without it is nobody's, as a real node a
test adds for itself would be."""
SERVICE_CLUSTER_IP_RANGE = "10.96.0.0/16"
POD_CIDR = "10.244.0.1/16"
"""kwok's pod IPs: room for many thousand pods (its default, a /24, runs out at 254)."""
NODE_NETWORK = ipaddress.IPv4Network("172.16.0.0/12")
"""The nodes' InternalIPs, one each (kwok's pods report it as their hostIP)."""
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
CONTROLLER_USERS = {
    "kube-controller-manager": "system:kube-controller-manager",
    "kube-scheduler": "system:kube-scheduler",
}
"""The users the two controllers connect as: the names Kubernetes' bootstrap RBAC grants
their permissions to (no ``system:masters`` for them, as on a real cluster)."""
KINE_PARAMETERS = (
    "_journal_mode=WAL&_busy_timeout=30000&_synchronous=NORMAL&_txlock=immediate&cache=shared"
)
"""kine's own SQLite defaults (a DSN given on its command line replaces them)."""


class KubeToolsMissing(RuntimeError):
    """A control-plane binary is not built; the message says which and how to build it."""


class KubeStartError(RuntimeError):
    """A server exited or did not become ready; the message has the end of its log."""


class KubectlError(subprocess.CalledProcessError):
    """kubectl or helm failed; unlike its base class, the message includes its stderr."""

    def __str__(self) -> str:
        return f"{super().__str__()}\n{self.stderr or ''}".rstrip()


def ensure_kube_tools(timeout: float = 3600.0) -> Path:
    """Run ``make -s kube-tools`` in the project: instant when everything is built, minutes
    the first time. Returns the binaries' folder; :class:`KubeToolsMissing` with make's
    output if the build fails."""
    done = subprocess.run(
        ["make", "-s", "-C", str(PROJECT_ROOT), "kube-tools"],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if done.returncode != 0:
        output = (done.stdout + done.stderr).strip()[-2000:]
        raise KubeToolsMissing(f"`make kube-tools` failed ({done.returncode}): {output}")
    return KUBE_BIN


def _wait_until(probe: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``probe`` until it is true; :class:`TimeoutError` naming ``what`` otherwise."""
    deadline = time.monotonic() + timeout
    while not probe():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} within {timeout:g}s")
        time.sleep(0.1)


class ServerProcess:
    """One control-plane server, in a process group of its own, logging to a file."""

    def __init__(self, name: str, argv: Sequence[str], log_dir: Path) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_dir / f"{name}.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, env: Mapping[str, str] | None = None) -> ServerProcess:
        """Start it; logs go to a file (a pipe nobody reads would block it when full)."""
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **(env or {})},
                start_new_session=True,
            )
        return self

    def check_running(self) -> None:
        """:class:`KubeStartError` with the end of its log if it exited."""
        if self.process is not None and self.process.poll() is not None:
            tail = " | ".join(log_tail(self.log_path, lines=5))
            raise KubeStartError(f"{self.name} exited ({self.process.returncode}): {tail}")

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM to its group, SIGKILL after ``timeout``; then SIGKILL to whatever of the
        group is left, so nothing it forked outlives it."""
        if self.process is None:
            return
        self._signal_group(signal.SIGTERM)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self._signal_group(signal.SIGKILL)
            self.process.wait()
        self._signal_group(signal.SIGKILL)
        self.process = None

    def _signal_group(self, sig: signal.Signals) -> None:
        if self.process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, sig)


class ControlPlanePki:
    """The cluster's CA, the API server's serving certificate and the service-account
    signing key, as PEM files in ``folder``."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.ca_file = folder / "ca.crt"
        self.ca_key_file = folder / "ca.key"
        self.serving_cert_file = folder / "apiserver.crt"
        self.serving_key_file = folder / "apiserver.key"
        self.service_account_key_file = folder / "service-accounts.key"
        self.service_account_public_key_file = folder / "service-accounts.pub"

    def write(self) -> ControlPlanePki:
        """Make a fresh CA, a serving certificate (for 127.0.0.1, ``localhost`` and the
        in-cluster names of ``kubernetes``) and a signing key (ES256 service-account
        tokens: the API server and the controller manager sign with it)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca_name = _common_name("stride-test-kube-ca")
        ca = _certificate(ca_name, ca_name, ca_key.public_key(), ca_key).add_extension(
            x509.BasicConstraints(ca=True, path_length=None), critical=True
        )
        ca = ca.add_extension(
            x509.KeyUsage(True, False, False, False, False, True, True, False, False), True
        )
        serving_key = ec.generate_private_key(ec.SECP256R1())
        dns = ["localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"]
        dns.append("kubernetes.default.svc.cluster.local")
        names: list[x509.GeneralName] = [x509.DNSName(name) for name in dns]
        names.append(x509.IPAddress(ipaddress.IPv4Address("127.0.0.1")))
        # The Service `kubernetes` gets the range's first address; in-cluster clients dial it.
        names.append(x509.IPAddress(ipaddress.IPv4Network(SERVICE_CLUSTER_IP_RANGE)[1]))
        serving = _certificate(
            _common_name("kube-apiserver"), ca_name, serving_key.public_key(), ca_key
        )
        serving = serving.add_extension(x509.SubjectAlternativeName(names), False)
        serving = serving.add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False
        )
        pem = serialization.Encoding.PEM
        self.ca_file.write_bytes(ca.sign(ca_key, hashes.SHA256()).public_bytes(pem))
        self.serving_cert_file.write_bytes(serving.sign(ca_key, hashes.SHA256()).public_bytes(pem))
        write_private(self.ca_key_file, _key_pem(ca_key), 0o600)
        write_private(self.serving_key_file, _key_pem(serving_key), 0o600)
        account_key = ec.generate_private_key(ec.SECP256R1())
        write_private(self.service_account_key_file, _key_pem(account_key), 0o600)
        # The API server verifies tokens with public keys only: a private key there fails.
        public = account_key.public_key()
        self.service_account_public_key_file.write_bytes(
            public.public_bytes(pem, serialization.PublicFormat.SubjectPublicKeyInfo)
        )
        return self


def _common_name(name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])


def _certificate(
    subject: x509.Name,
    issuer: x509.Name,
    public_key: ec.EllipticCurvePublicKey,
    issuer_key: ec.EllipticCurvePrivateKey,
) -> x509.CertificateBuilder:
    now = dt.datetime.now(dt.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + dt.timedelta(days=365))
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()), False
        )
    )


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def kwok_node(
    name: str, address: str, capacity: Mapping[str, str], labels: Mapping[str, str]
) -> dict[str, Any]:
    """A Node kwok runs (it carries :data:`NODE_LABEL`), with ``capacity`` as capacity and
    allocatable. Nodes keep the status they are created with, as a kubelet registers one."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                **dict([NODE_LABEL]),
                **labels,
            },
            "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
        },
        "status": {
            "allocatable": dict(capacity),
            "capacity": dict(capacity),
            "addresses": [{"type": "InternalIP", "address": address}],
        },
    }


class KubeClients:
    """Credentials and clients of a cluster's API server: a static bearer token and a
    kubeconfig per user, kubectl, helm. :class:`KubeCluster` starts the servers."""

    def __init__(self, folder: Path, users: Sequence[str], bin_dir: Path) -> None:
        self.folder = folder
        self.bin_dir = bin_dir
        self.users = tuple(users)
        self.port = 0
        self.pki = ControlPlanePki(folder / "pki")
        self._tokens = {user: secrets.token_urlsafe(24) for user in self.users}

    @property
    def url(self) -> str:
        """The API server's https URL."""
        return f"https://127.0.0.1:{self.port}"

    @property
    def ca_file(self) -> Path:
        """The CA that signed the API server's certificate (PEM)."""
        return self.pki.ca_file

    def token(self, user: str = ADMIN) -> str:
        """The static bearer token of ``user``."""
        try:
            return self._tokens[user]
        except KeyError:
            raise KeyError(f"no static user {user!r}; the cluster has {self.users}") from None

    def kubeconfig(self, user: str = ADMIN) -> Path:
        """The kubeconfig file that connects as ``user`` (written at each start)."""
        self.token(user)
        if not self.port:
            raise RuntimeError("the cluster is not started: it has no kubeconfig yet")
        return self.folder / "kubeconfigs" / f"{user.replace(':', '-')}.kubeconfig"

    def _write_kubeconfigs(self) -> None:
        (self.folder / "kubeconfigs").mkdir(exist_ok=True)
        cluster = {"server": self.url, "certificate-authority": str(self.ca_file)}
        for user in self.users:
            config = {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "stride-test", "cluster": cluster}],
                "users": [{"name": user, "user": {"token": self.token(user)}}],
                "contexts": [{"name": user, "context": {"cluster": "stride-test", "user": user}}],
                "current-context": user,
            }
            write_private(self.kubeconfig(user), json.dumps(config, indent=2).encode(), 0o600)

    def kubectl(
        self,
        *args: str,
        user: str = ADMIN,
        input: str | None = None,
        check: bool = True,
        timeout: float = 60.0,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``kubectl <args>`` as ``user``; :class:`KubectlError` (with its stderr) if it
        fails and ``check``."""
        argv = [KUBECTL, "--kubeconfig", str(self.kubeconfig(user)), *args]
        return self._run(argv, input, check, timeout)

    def get(self, *args: str, user: str = ADMIN) -> Any:
        """``kubectl get <args> -o json``, parsed."""
        return json.loads(self.kubectl("get", *args, "-o", "json", user=user).stdout)

    def helm(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 120.0
    ) -> subprocess.CompletedProcess[str]:
        """Run the built ``helm <args>`` as the admin, its caches and repositories in the
        folder (none of the machine's)."""
        home = self.folder / "helm"
        env = {
            f"HELM_{kind.upper()}_HOME": str(home / kind) for kind in ("cache", "config", "data")
        }
        argv = [str(self._binary("helm")), "--kubeconfig", str(self.kubeconfig()), *args]
        return self._run(argv, input, check, timeout, env)

    def _run(
        self,
        argv: list[str],
        input: str | None,
        check: bool,
        timeout: float,
        env: Mapping[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            argv,
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            env={**os.environ, **(env or {})},
        )
        if check and done.returncode != 0:
            raise KubectlError(done.returncode, argv, done.stdout, done.stderr)
        return done

    def _binary(self, name: str) -> Path:
        path = self.bin_dir / name
        if not os.access(path, os.X_OK):
            raise KubeToolsMissing(
                f"{name} is not built ({path} is missing): run `make kube-tools` in {PROJECT_ROOT}"
            )
        return path


class KubeCluster(KubeClients):
    """kine, kube-apiserver, kube-controller-manager, kube-scheduler and kwok, started in
    ``folder`` on free loopback ports, with static bearer tokens for the admin and ``users``.

    Use it as a context manager, or call :meth:`start` and :meth:`stop`. :meth:`start`
    returns once the API server is ready; the controllers and kwok catch up within a
    second or two, which :meth:`create_namespace` and :meth:`add_nodes` wait for.
    """

    def __init__(
        self,
        folder: Path,
        *,
        users: Iterable[str] = ("alice", "bob"),
        controller_manager: bool = True,
        scheduler: bool = True,
        bin_dir: Path = KUBE_BIN,
        compaction: float = 0.0,
    ) -> None:
        """``controller_manager=False``: no garbage collection, no Deployments, no service
        accounts made in new namespaces (the ServiceAccount admission plugin is then off,
        so pods can still be created). ``scheduler=False``: only pods with a
        ``spec.nodeName`` land anywhere. ``compaction``: seconds between compactions of
        the store's history, keeping only its newest revision, and no watch cache (watches
        then resume from the store, as an etcd compacted under a busy cluster does): a
        client resuming from an old version gets ``410 Gone``; 0 keeps every revision."""
        super().__init__(
            folder, (ADMIN, *dict.fromkeys(users), *CONTROLLER_USERS.values()), bin_dir
        )
        self.controller_manager = controller_manager
        self.scheduler = scheduler
        self.compaction = compaction
        self._servers: list[ServerProcess] = []
        self._node_numbers: dict[str, int] = {}
        self._nodes_added = 0

    def __enter__(self) -> KubeCluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    # -- lifecycle ----------------------------------------------------------------------

    def start(self, timeout: float = 60.0) -> KubeCluster:
        """Start every server and wait until the API server is ready; on any failure stop
        what was started and raise (:class:`KubeToolsMissing`, :class:`KubeStartError`)."""
        if self._servers:
            raise RuntimeError(f"the cluster in {self.folder} is already started")
        controllers = [name for name in CONTROLLER_USERS if self._runs(name)]
        binaries = {
            name: self._binary(name) for name in ("kine", "kube-apiserver", "kwok", *controllers)
        }
        (self.folder / "logs").mkdir(parents=True, exist_ok=True)
        self.pki.write()
        try:
            kine_port = free_port()
            self._launch("kine", binaries["kine"], self._kine_flags(kine_port))
            _wait_until(lambda: self._listening(kine_port), timeout, "kine did not listen")
            self.port = free_port()
            self._write_kubeconfigs()
            self._launch(
                "kube-apiserver", binaries["kube-apiserver"], self._apiserver_flags(kine_port)
            )
            self.wait_ready(timeout)
            for name in controllers:
                flags = [
                    f"--kubeconfig={self.kubeconfig(CONTROLLER_USERS[name])}",
                    "--leader-elect=false",
                ]
                # No health endpoint: its default port would collide between clusters.
                flags.append("--secure-port=0")
                if name == "kube-controller-manager":
                    flags += self._controller_manager_flags()
                self._launch(name, binaries[name], flags)
            # kwok's home is the folder: it would also load a ~/.kwok/kwok.yaml.
            self._launch("kwok", binaries["kwok"], self._kwok_flags(), {"HOME": str(self.folder)})
        except BaseException:
            self.stop()
            raise
        return self

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Wait until the API server's ``/readyz`` answers ok to the admin's token;
        :class:`KubeStartError` if a server exits meanwhile or it is not ready in time."""
        context = ssl.create_default_context(cafile=str(self.ca_file))
        request = urllib.request.Request(
            f"{self.url}/readyz", headers={"Authorization": f"Bearer {self.token()}"}
        )

        def ready() -> bool:
            self.check_running()
            try:
                with urllib.request.urlopen(request, context=context, timeout=2) as answer:
                    return bool(answer.status == 200)
            except (urllib.error.URLError, OSError):
                return False

        try:
            _wait_until(ready, timeout, "kube-apiserver was not ready")
        except TimeoutError as error:
            tail = log_tail(self.folder / "logs" / "kube-apiserver.log", lines=5)
            raise KubeStartError(f"{error}: {' | '.join(tail)}") from None

    def check_running(self) -> None:
        """:class:`KubeStartError` if any server exited."""
        for server in self._servers:
            server.check_running()

    def stop(self) -> None:
        """Stop every server, the last started first. The folder stays (logs, database)."""
        while self._servers:
            self._servers.pop().stop()

    # -- objects ------------------------------------------------------------------------

    def create_namespace(self, name: str, timeout: float = 30.0) -> str:
        """Create namespace ``name`` and, with the controller manager, wait for its
        ``default`` service account: until it exists the API server refuses every pod."""
        self.kubectl("create", "namespace", name)
        if self.controller_manager:
            account = ("get", "serviceaccount", "default", "-n", name)
            _wait_until(
                lambda: self.kubectl(*account, check=False).returncode == 0,
                timeout,
                f"no service account default in namespace {name}",
            )
        return name

    def add_nodes(
        self,
        count: int,
        cpu: str = "32",
        memory: str = "128Gi",
        prefix: str = "kwok-node",
        labels: Mapping[str, str] | None = None,
        pods: int = 110,
        timeout: float = 60.0,
    ) -> list[str]:
        """Create ``count`` nodes that kwok runs (``<prefix>-<n>``, numbered on from
        earlier calls), with ``cpu``, ``memory`` and ``pods`` as capacity and allocatable,
        and wait until kwok reports them Ready. Returns their names."""
        first = self._node_numbers.get(prefix, 0)
        self._node_numbers[prefix] = first + count
        names = [f"{prefix}-{number}" for number in range(first, first + count)]
        capacity = {"cpu": cpu, "memory": memory, "pods": str(pods)}
        nodes = []
        for name in names:
            self._nodes_added += 1
            address = str(NODE_NETWORK[self._nodes_added])
            nodes.append(kwok_node(name, address, capacity, labels or {}))
        listed = {"apiVersion": "v1", "kind": "List", "items": nodes}
        self.kubectl("create", "-f", "-", input=json.dumps(listed))
        ready = ("wait", "--for=condition=Ready", f"--timeout={timeout:g}s")
        self.kubectl(*ready, *(f"node/{name}" for name in names), timeout=timeout + 10)
        return names

    # -- the servers ----------------------------------------------------------------------

    def _runs(self, name: str) -> bool:
        return self.controller_manager if name == "kube-controller-manager" else self.scheduler

    def _launch(
        self, name: str, binary: Path, flags: list[str], env: Mapping[str, str] | None = None
    ) -> ServerProcess:
        server = ServerProcess(name, [str(binary), *flags], self.folder / "logs")
        self._servers.append(server)
        return server.start(env)

    def _listening(self, port: int) -> bool:
        self.check_running()
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return True
        except OSError:
            return False

    def _kine_flags(self, port: int) -> list[str]:
        return [
            f"--endpoint=sqlite://{self.folder / 'kine.sqlite'}?{KINE_PARAMETERS}",
            f"--listen-address=127.0.0.1:{port}",
            "--metrics-bind-address=0",  # its default, :8080, would collide between clusters
            *(
                [f"--compact-interval={self.compaction:g}s", "--compact-min-retain=1"]
                if self.compaction
                else []
            ),
        ]

    def _apiserver_flags(self, kine_port: int) -> list[str]:
        tokens = self.folder / "tokens.csv"
        # token,user,uid[,"groups"]: the admin is in system:masters, nobody else is.
        lines = [f"{self.token(user)},{user},{user}" for user in self.users]
        lines[0] += ',"system:masters"'
        write_private(tokens, ("\n".join(lines) + "\n").encode(), 0o600)
        pki = self.pki
        flags = [
            f"--etcd-servers=http://127.0.0.1:{kine_port}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={self.port}",
            f"--cert-dir={pki.folder}",
            f"--tls-cert-file={pki.serving_cert_file}",
            f"--tls-private-key-file={pki.serving_key_file}",
            f"--client-ca-file={pki.ca_file}",
            f"--token-auth-file={tokens}",
            "--authorization-mode=RBAC",
            f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
            f"--service-account-key-file={pki.service_account_public_key_file}",
            f"--service-account-signing-key-file={pki.service_account_key_file}",
            f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
            "--profiling=false",
        ]
        if not self.controller_manager:
            flags.append("--disable-admission-plugins=ServiceAccount")
        if self.compaction:
            flags.append("--watch-cache=false")
        return flags

    def _controller_manager_flags(self) -> list[str]:
        pki = self.pki
        return [
            "--controllers=*",
            "--use-service-account-credentials=true",
            f"--service-account-private-key-file={pki.service_account_key_file}",
            f"--root-ca-file={pki.ca_file}",
            f"--cluster-signing-cert-file={pki.ca_file}",
            f"--cluster-signing-key-file={pki.ca_key_file}",
        ]

    def _kwok_flags(self) -> list[str]:
        label, value = NODE_LABEL
        return [
            f"--kubeconfig={self.kubeconfig()}",
            f"--manage-nodes-with-label-selector={label}={value}",
            f"--cidr={POD_CIDR}",
            f"--config={KWOK_STAGES}",
        ]
