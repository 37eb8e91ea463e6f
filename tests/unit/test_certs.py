"""`stride certs init`: a CA and a certificate per identity, kept when good, re-issued when
not; and where each process finds its TLS material (stride.runtime.tls.load)."""

from __future__ import annotations

import base64
import datetime as dt
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from stride.runtime import certs, tls
from stride.runtime.certs import CertificateError, init, kubernetes_secrets
from stride.testing.processes import run_cli


def certificate(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def test_init_makes_a_ca_and_one_certificate_per_identity_its_users_alone(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "tls"
    issued = init(folder, extra_sans=("stride.example.org", "10.0.0.7"))
    assert folder.stat().st_mode & 0o777 == 0o700
    assert set(issued.created) == {
        "ca.crt",
        "ca.key",
        "nats-callout.nk",
        "nats-system.nk",
        *(f"{name}.{suffix}" for name in tls.IDENTITIES for suffix in ("crt", "key")),
    }
    assert all(key.stat().st_mode & 0o777 == 0o600 for key in folder.glob("*.key"))
    # The NATS auth callout's issuer: an account nkey seed, private, kept across runs.
    seed = folder / "nats-callout.nk"
    assert seed.stat().st_mode & 0o777 == 0o600
    assert seed.read_bytes().startswith(b"SA")
    assert "nats-callout.nk" not in init(folder).created
    assert seed.read_bytes().startswith(b"SA")
    # NATS's system-account user (the pod watcher ends revoked sessions with it): a user seed.
    system = folder / "nats-system.nk"
    assert system.stat().st_mode & 0o777 == 0o600
    assert system.read_bytes().startswith(b"SU")
    ca = certificate(folder / "ca.crt")
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    for name in tls.IDENTITIES:
        issued_cert = certificate(folder / f"{name}.crt")
        issued_cert.verify_directly_issued_by(ca)
        assert issued_cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == name
        sans = issued_cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        dns = set(sans.get_values_for_type(x509.DNSName))
        assert {name, f"stride-{name}", "localhost", "stride.example.org"} <= dns
        addresses = {str(a) for a in sans.get_values_for_type(x509.IPAddress)}
        assert {"127.0.0.1", "::1", "10.0.0.7"} <= addresses
        usages = issued_cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        assert set(usages) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}


def test_init_again_keeps_what_is_good_and_reissues_what_is_not(tmp_path: Path) -> None:
    folder = tmp_path / "tls"
    init(folder)
    before = {path.name: path.read_bytes() for path in folder.iterdir()}
    again = init(folder)
    assert again.created == () and set(again.kept) == set(tls.IDENTITIES)
    assert {path.name: path.read_bytes() for path in folder.iterdir()} == before

    # One that expires within the renewal window, one another CA signed, one lost key.
    init(tmp_path / "short", identities=("agent",), days=1)
    (folder / "agent.crt").write_bytes((tmp_path / "short" / "agent.crt").read_bytes())
    (folder / "agent.key").write_bytes((tmp_path / "short" / "agent.key").read_bytes())
    init(tmp_path / "other", identities=("cli",))
    (folder / "cli.crt").write_bytes((tmp_path / "other" / "cli.crt").read_bytes())
    (folder / "trainer.key").unlink()
    fixed = init(folder)
    assert set(fixed.created) == {
        "agent.crt", "agent.key", "cli.crt", "cli.key", "trainer.crt", "trainer.key",
    }  # fmt: skip
    ca = certificate(folder / "ca.crt")
    for name in ("agent", "cli", "trainer"):
        renewed = certificate(folder / f"{name}.crt")
        renewed.verify_directly_issued_by(ca)
        left = renewed.not_valid_after_utc - dt.datetime.now(dt.UTC)
        assert left > dt.timedelta(days=certs.RENEW_WITHIN_DAYS)
    # A new name asked for re-issues every certificate with it.
    assert set(init(folder, extra_sans=("api.example.org",)).kept) == set()


def test_half_a_ca_or_a_file_for_a_folder_is_refused_naming_it(tmp_path: Path) -> None:
    folder = tmp_path / "tls"
    init(folder, identities=("cli",))
    (folder / "ca.key").unlink()
    with pytest.raises(CertificateError, match=r"has only one of ca\.key \(.*\) and ca\.crt"):
        init(folder)
    (tmp_path / "file").write_text("x")
    with pytest.raises(CertificateError, match="exists and is not a folder"):
        init(tmp_path / "file")
    with pytest.raises(CertificateError, match="--days: must be >= 1"):
        init(tmp_path / "new", days=0)
    with pytest.raises(CertificateError, match="must be a plain name"):
        init(tmp_path / "new", identities=("../admission",))


def test_kubernetes_secrets_have_cert_managers_layout(tmp_path: Path) -> None:
    init(tmp_path / "tls", identities=("admission", "agent"))
    documents = list(
        yaml.safe_load_all(
            kubernetes_secrets(tmp_path / "tls", "prod-stride", "ml", ("admission", "agent"))
        )
    )
    assert [doc["metadata"]["name"] for doc in documents] == [
        "prod-stride-admission-tls",
        "prod-stride-agent-tls",
        "prod-stride-nats-callout",
    ]
    *certificates, callout = documents
    assert all(doc["type"] == "kubernetes.io/tls" for doc in certificates)
    assert all(doc["metadata"]["namespace"] == "ml" for doc in documents)
    assert all(set(doc["data"]) == {"tls.crt", "tls.key", "ca.crt"} for doc in certificates)
    # The NATS auth callout's seed for the podwatcher, and its public key for NATS.
    assert callout["type"] == "Opaque"
    seed = base64.b64decode(callout["data"]["nats-callout.nk"])
    assert seed == (tmp_path / "tls" / "nats-callout.nk").read_bytes().strip()
    issuer = base64.b64decode(callout["data"]["issuer"]).decode()
    assert issuer.startswith("A") and len(issuer) == 56


def test_load_reads_a_folder_or_the_file_trio_and_says_what_is_missing(tmp_path: Path) -> None:
    init(tmp_path / "tls", identities=("admission",))
    folder = {tls.TLS_DIR_ENV: str(tmp_path / "tls")}
    material = tls.load("admission", folder)
    assert material is not None and material.identity == "admission"
    with pytest.raises(tls.TlsConfigError, match="has no certificate for 'dispatcher'"):
        tls.load("dispatcher", folder)
    trio = {
        tls.CERT_FILE_ENV: str(tmp_path / "tls" / "admission.crt"),
        tls.KEY_FILE_ENV: str(tmp_path / "tls" / "admission.key"),
        tls.CA_FILE_ENV: str(tmp_path / "tls" / "ca.crt"),
    }
    assert tls.load("anything", trio) is not None  # one identity's files, whoever asks
    with pytest.raises(tls.TlsConfigError, match="STRIDE_TLS_CA_FILE not set"):
        tls.load("admission", {**trio, tls.CA_FILE_ENV: ""})
    (tmp_path / "junk.crt").write_text("not a certificate")
    with pytest.raises(tls.TlsConfigError, match="is not PEM"):
        tls.load("admission", {**trio, tls.CERT_FILE_ENV: str(tmp_path / "junk.crt")})
    with pytest.raises(tls.TlsConfigError, match="cannot read the private key"):
        tls.load("admission", {**trio, tls.KEY_FILE_ENV: str(tmp_path / "gone.key")})
    with pytest.raises(tls.TlsConfigError, match="no TLS material for 'admission'"):
        tls.load("admission", {})
    assert tls.load("admission", {tls.INSECURE_ENV: "1"}) is None
    assert tls.load("admission", {tls.INSECURE_ENV: "0"}.copy() | folder) is not None


def test_stride_certs_init_as_a_user_runs_it(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "COLUMNS": "200"}
    made = run_cli(
        "certs", "init", str(tmp_path / "tls"),
        "--kubernetes-secrets", str(tmp_path / "secrets.yaml"), "--fullname", "stride",
        env=env,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    assert f"{len(tls.IDENTITIES) * 2 + 4} files written" in made.stdout
    assert (tmp_path / "secrets.yaml").stat().st_mode & 0o777 == 0o600
    again = run_cli("certs", "init", str(tmp_path / "tls"), env=env)
    assert "0 files written" in again.stdout and f"{len(tls.IDENTITIES)} certificates kept" in (
        again.stdout
    )
    (tmp_path / "file").write_text("x")
    refused = run_cli("certs", "init", str(tmp_path / "file"), env=env)
    assert refused.returncode == 2
    assert "exists and is not a folder" in refused.stderr and "Traceback" not in refused.stderr
    bad_days = run_cli("certs", "init", str(tmp_path / "x"), "--days", "0", env=env)
    assert bad_days.returncode == 2 and "--days" in bad_days.stderr


def test_the_cas_key_can_live_outside_the_folder_every_service_mounts(tmp_path: Path) -> None:
    folder, key = tmp_path / "tls", tmp_path / "ca" / "ca.key"
    issued = init(folder, ca_key=key, identities=("admission",))
    assert str(key) in issued.created and not (folder / "ca.key").exists()
    assert key.stat().st_mode & 0o777 == 0o600
    certificate(folder / "admission.crt").verify_directly_issued_by(certificate(folder / "ca.crt"))
    # Kept on the next run (the same CA signs new identities) ...
    again = init(folder, ca_key=key, identities=("admission", "agent"))
    assert again.kept == ("admission",) and "ca.crt" not in again.created
    # ... and a run that forgot where the key is says so instead of making a second CA.
    with pytest.raises(CertificateError, match=r"has only one of ca\.key"):
        init(folder)


def test_stride_token_create_as_an_administrator_runs_it(tmp_path: Path) -> None:
    """A token minted with the folder's users key verifies as its user; bad input and a
    folder without the key get one clear line, and no token."""
    from stride.runtime.tokens import UserIdentity, Verifier

    env = {"PATH": "/usr/bin:/bin", "COLUMNS": "200"}
    init(tmp_path / "tls")
    made = run_cli("token", "create", "alice", "--tls-dir", str(tmp_path / "tls"), env=env)
    assert made.returncode == 0, made.stderr
    identity = Verifier((tmp_path / "tls" / "ca.crt").read_bytes()).verify(made.stdout.strip())
    assert isinstance(identity, UserIdentity) and identity == UserIdentity(
        "alice", False, identity.token_id, identity.expires, identity.issued_at
    )
    # Its id goes to standard error, the token alone to standard output.
    assert made.stderr.strip() == f"token id {identity.token_id}"
    assert abs(identity.expires - identity.issued_at - 90 * 86400) <= 1
    admin = run_cli(
        "token", "create", "root", "--admin", "--days", "1",
        "--tls-dir", str(tmp_path / "tls"), "--out", str(tmp_path / "root.token"),
        env=env,
    )  # fmt: skip
    assert admin.returncode == 0 and "valid 1 days" in admin.stdout
    too_long = run_cli(
        "token", "create", "bob", "--days", "366", "--tls-dir", str(tmp_path), env=env
    )
    assert too_long.returncode == 2 and "less than or equal to 365" in too_long.stderr
    assert not too_long.stdout
    assert (tmp_path / "root.token").stat().st_mode & 0o777 == 0o600
    saved = Verifier((tmp_path / "tls" / "ca.crt").read_bytes()).verify(
        (tmp_path / "root.token").read_text().strip()
    )
    assert isinstance(saved, UserIdentity) and saved.admin
    assert f"(id {saved.token_id})" in admin.stdout
    bad_name = run_cli("token", "create", "a/b", "--tls-dir", str(tmp_path / "tls"), env=env)
    assert bad_name.returncode == 2 and "user" in bad_name.stderr and not bad_name.stdout
    init(tmp_path / "services", identities=("admission",))
    no_key = run_cli("token", "create", "alice", "--tls-dir", str(tmp_path / "services"), env=env)
    assert no_key.returncode == 2 and "users.key" in no_key.stderr and not no_key.stdout
    assert "Traceback" not in no_key.stderr + bad_name.stderr
