"""A deployment's CA and one certificate per identity, for mutual TLS (:mod:`.tls`).

``stride certs init DIR`` (and ``python -m stride.runtime.certs init DIR``, which images
without the CLI run) writes into ``DIR``:

- ``ca.crt`` / ``ca.key``: a self-signed CA (ECDSA P-256), made once and kept;
- ``<identity>.crt`` / ``<identity>.key`` for every identity in :data:`.tls.IDENTITIES`,
  signed by that CA, usable as server and as client. Each names the identity (common
  name and DNS SAN, also ``stride-<identity>``), ``localhost``, ``127.0.0.1`` and ``::1``,
  and any ``--san`` given.

- ``nats-callout.nk`` (0600): the seed of the account nkey that signs the NATS users of
  training pods (``stride.bus.callout``; NATS's configuration names its public key);
- ``nats-system.nk`` (0600): the seed of the user nkey of NATS's system account, with which
  the pod watcher ends revoked pods' NATS sessions (``stride.bus.sessions``; NATS's
  configuration names its public key).

Existing files are kept (running it again is a no-op), so ``stride up`` calls it at every
start; a certificate that expires within :data:`RENEW_WITHIN_DAYS`, or that the CA in the
folder did not sign, is re-issued. The folder is 0700 and keys are 0600.

``--kubernetes-secrets FILE`` also writes one ``kubernetes.io/tls`` Secret per identity
(``<fullname>-<identity>-tls``: ``tls.crt``, ``tls.key``, ``ca.crt``, cert-manager's
layout), what the Helm chart mounts when cert-manager does not issue them, and the Secret
``<fullname>-nats-callout`` (``nats-callout.nk``, the seed the pod watcher signs with;
``issuer``, its public key, for NATS's environment; ``nats-system.nk``, the system user's
seed the pod watcher ends sessions with; ``system-user``, its public key, for NATS's
environment), which cert-manager cannot issue.
"""

from __future__ import annotations

import argparse
import base64
import datetime as dt
import ipaddress
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from stride.runtime.tls import CA_CERT_NAME, IDENTITIES

CALLOUT_SEED_NAME = "nats-callout.nk"
"""The NATS auth callout issuer's seed (an account nkey), beside the certificates."""
SYSTEM_SEED_NAME = "nats-system.nk"
"""The seed (a user nkey) of NATS's system-account user, beside the certificates: the pod
watcher disconnects the sessions of revoked job tokens with it (``stride.bus.sessions``)."""
SYSTEM_USER_KEY = "system-user"
"""The key of the Secret ``<fullname>-nats-callout`` holding the system user's public key,
which NATS reads from its environment (``$STRIDE_NATS_SYSTEM_USER``) in the Helm chart's
configuration."""

CA_KEY_NAME = "ca.key"
CA_DAYS = 3650
CERT_DAYS = 365
RENEW_WITHIN_DAYS = 30
LOCAL_NAMES = ("localhost",)
LOCAL_ADDRESSES = ("127.0.0.1", "::1")


class CertificateError(ValueError):
    """A bad argument or an unusable folder; the message names it."""


@dataclass(frozen=True)
class Issued:
    """What :func:`init` did."""

    folder: Path
    created: tuple[str, ...]
    """Files written this time (names within ``folder``)."""
    kept: tuple[str, ...]
    """Identities whose certificate was already there and still good."""


def write_private(path: Path, data: bytes, mode: int) -> None:
    """Write ``data`` to ``path`` with ``mode`` from the start (no window with wider rights)."""
    temporary = path.with_name(f".{path.name}.tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    os.chmod(temporary, mode)
    os.replace(temporary, path)


def _key_bytes(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Stride"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def _make_ca(folder: Path, key_path: Path) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = _now()
    certificate = (
        x509.CertificateBuilder()
        .subject_name(_name("Stride CA"))
        .issuer_name(_name("Stride CA"))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=CA_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    write_private(key_path, _key_bytes(key), 0o600)
    write_private(
        folder / CA_CERT_NAME, certificate.public_bytes(serialization.Encoding.PEM), 0o644
    )
    return key, certificate


def _load_ca(
    folder: Path, key_path: Path
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate] | None:
    cert_path = folder / CA_CERT_NAME
    if not key_path.exists() and not cert_path.exists():
        return None
    if not key_path.exists() or not cert_path.exists():
        raise CertificateError(
            f"{folder}: has only one of {key_path.name} ({key_path}) and {CA_CERT_NAME}; "
            "restore the other or empty the folder to make a new CA (every certificate is "
            "then re-issued)"
        )
    key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise CertificateError(f"{key_path}: not an EC private key")
    return key, x509.load_pem_x509_certificate(cert_path.read_bytes())


@dataclass(frozen=True)
class Signer:
    """A signer's certificate, once checked against the CA: its name and public key."""

    identity: str
    """The certificate's common name (the identity it was issued to)."""
    key: ec.EllipticCurvePublicKey
    not_before: float
    not_after: float


def verified_signer(der: bytes, cas: Sequence[x509.Certificate]) -> Signer:
    """The identity and key of the DER certificate ``der`` if one of ``cas`` issued it (the
    check of a token's or an event's signer); :class:`CertificateError` says why not."""
    try:
        certificate = x509.load_der_x509_certificate(der)
    except ValueError as error:
        raise CertificateError(f"not a certificate ({error})") from None
    for ca in cas:
        try:
            certificate.verify_directly_issued_by(ca)
        except (ValueError, TypeError, InvalidSignature):
            continue
        break
    else:
        raise CertificateError("not issued by this deployment's CA")
    names = certificate.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    key = certificate.public_key()
    if not names or not isinstance(key, ec.EllipticCurvePublicKey):
        raise CertificateError("no identity (common name) or no EC key")
    return Signer(
        str(names[0].value),
        key,
        certificate.not_valid_before_utc.timestamp(),
        certificate.not_valid_after_utc.timestamp(),
    )


def _still_good(path: Path, ca: x509.Certificate, names: set[str]) -> bool:
    """An existing certificate signed by ``ca``, naming at least ``names``, that does not
    expire soon."""
    if not path.exists() or not path.with_suffix(".key").exists():
        return False
    try:
        certificate = x509.load_pem_x509_certificate(path.read_bytes())
        certificate.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    if certificate.not_valid_after_utc - _now() < dt.timedelta(days=RENEW_WITHIN_DAYS):
        return False
    try:
        alternative = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    except x509.ExtensionNotFound:
        return False
    present = {str(name) for name in alternative.value.get_values_for_type(x509.DNSName)}
    present |= {str(a) for a in alternative.value.get_values_for_type(x509.IPAddress)}
    return names <= present


def _sans(identity: str, extra: Sequence[str]) -> tuple[list[x509.GeneralName], set[str]]:
    dns = [identity, f"stride-{identity}", *LOCAL_NAMES]
    addresses = list(LOCAL_ADDRESSES)
    for name in extra:
        try:
            addresses.append(str(ipaddress.ip_address(name)))
        except ValueError:
            dns.append(name)
    dns = list(dict.fromkeys(dns))
    addresses = list(dict.fromkeys(addresses))
    general: list[x509.GeneralName] = [x509.DNSName(name) for name in dns]
    general += [x509.IPAddress(ipaddress.ip_address(address)) for address in addresses]
    return general, {*dns, *addresses}


def _issue(
    folder: Path,
    identity: str,
    ca_key: ec.EllipticCurvePrivateKey,
    ca: x509.Certificate,
    sans: list[x509.GeneralName],
    days: int,
) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    now = _now()
    certificate = (
        x509.CertificateBuilder()
        .subject_name(_name(identity))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(min(now + dt.timedelta(days=days), ca.not_valid_after_utc))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    write_private(folder / f"{identity}.key", _key_bytes(key), 0o600)
    write_private(
        folder / f"{identity}.crt", certificate.public_bytes(serialization.Encoding.PEM), 0o644
    )


def init(
    folder: Path,
    *,
    identities: Sequence[str] = IDENTITIES,
    extra_sans: Sequence[str] = (),
    days: int = CERT_DAYS,
    owner: tuple[int, int] | None = None,
    ca_key: Path | None = None,
) -> Issued:
    """Make (or complete) ``folder``'s CA and certificates; see the module docstring.

    ``ca_key``: where the CA's private key lives (default ``folder/ca.key``). Keep it out
    of a folder that every service mounts: whoever reads it can issue any identity."""
    if days < 1:
        raise CertificateError(f"--days: must be >= 1, got {days}")
    for identity in identities:
        if not identity or "/" in identity or identity.startswith("."):
            raise CertificateError(f"identity {identity!r}: must be a plain name")
    if folder.exists() and not folder.is_dir():
        raise CertificateError(f"{folder}: exists and is not a folder")
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(folder, 0o700)
    created: list[str] = []
    key_path = folder / CA_KEY_NAME if ca_key is None else ca_key
    key_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    loaded = _load_ca(folder, key_path)
    if loaded is None:
        signing_key, ca = _make_ca(folder, key_path)
        created += [CA_CERT_NAME, CA_KEY_NAME if ca_key is None else str(key_path)]
    else:
        signing_key, ca = loaded
    seed = folder / CALLOUT_SEED_NAME
    if not seed.exists():
        import nkeys  # only here: every process imports this module, few make keys

        write_private(seed, nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_ACCOUNT), 0o600)
        created.append(CALLOUT_SEED_NAME)
    system_seed = folder / SYSTEM_SEED_NAME
    if not system_seed.exists():
        import nkeys

        write_private(system_seed, nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER), 0o600)
        created.append(SYSTEM_SEED_NAME)
    kept: list[str] = []
    for identity in identities:
        sans, names = _sans(identity, extra_sans)
        if _still_good(folder / f"{identity}.crt", ca, names):
            kept.append(identity)
            continue
        _issue(folder, identity, signing_key, ca, sans, days)
        created += [f"{identity}.crt", f"{identity}.key"]
    if owner is not None:
        os.chown(folder, *owner)
        for path in folder.iterdir():
            os.chown(path, *owner)
    return Issued(folder, tuple(created), tuple(kept))


def kubernetes_secrets(
    folder: Path,
    fullname: str,
    namespace: str | None = None,
    identities: Sequence[str] = IDENTITIES,
) -> str:
    """One ``kubernetes.io/tls`` Secret per identity from ``folder`` (as YAML documents)."""
    if not fullname:
        raise CertificateError("--fullname: must not be empty (the Helm release's fullname)")
    ca = (folder / CA_CERT_NAME).read_bytes()
    documents = []
    for identity in identities:
        data = {
            "tls.crt": (folder / f"{identity}.crt").read_bytes(),
            "tls.key": (folder / f"{identity}.key").read_bytes(),
            "ca.crt": ca,
        }
        lines = [
            "apiVersion: v1",
            "kind: Secret",
            "type: kubernetes.io/tls",
            "metadata:",
            f"  name: {fullname}-{identity}-tls",
            *([f"  namespace: {namespace}"] if namespace else []),
            "  labels:",
            "    app.kubernetes.io/part-of: stride",
            f"    app.kubernetes.io/component: {identity}",
            "data:",
            *(f"  {key}: {base64.b64encode(value).decode()}" for key, value in data.items()),
        ]
        documents.append("\n".join(lines) + "\n")
    import nkeys

    seed = (folder / CALLOUT_SEED_NAME).read_bytes().strip()
    issuer = nkeys.from_seed(seed).public_key
    system_seed = (folder / SYSTEM_SEED_NAME).read_bytes().strip()
    system_user = nkeys.from_seed(system_seed).public_key
    callout = {
        CALLOUT_SEED_NAME: seed,
        "issuer": issuer,
        SYSTEM_SEED_NAME: system_seed,
        SYSTEM_USER_KEY: system_user,
    }
    documents.append(
        "\n".join(
            [
                "apiVersion: v1",
                "kind: Secret",
                "type: Opaque",
                "metadata:",
                f"  name: {fullname}-nats-callout",
                *([f"  namespace: {namespace}"] if namespace else []),
                "  labels:",
                "    app.kubernetes.io/part-of: stride",
                "    app.kubernetes.io/component: nats-callout",
                "data:",
                *(f"  {key}: {base64.b64encode(value).decode()}" for key, value in callout.items()),
            ]
        )
        + "\n"
    )
    return "---\n".join(documents)


def owner_argument(text: str) -> tuple[int, int]:
    user, _, group = text.partition(":")
    try:
        return int(user), int(group or user)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not UID:GID") from None


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m stride.runtime.certs init DIR ...`` (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="python -m stride.runtime.certs")
    commands = parser.add_subparsers(dest="command", required=True)
    command = commands.add_parser("init", help="make a CA and a certificate per identity")
    command.add_argument("folder", type=Path)
    command.add_argument("--san", action="append", default=[], help="another DNS name or IP")
    command.add_argument("--days", type=int, default=CERT_DAYS)
    command.add_argument("--owner", type=owner_argument, help="UID:GID to give the files to")
    command.add_argument("--ca-key", type=Path, help="the CA's key, kept out of the folder")
    command.add_argument("--kubernetes-secrets", type=Path, help="also write Secrets here")
    command.add_argument("--fullname", default="stride", help="the Helm release's fullname")
    command.add_argument("--namespace", default=None)
    arguments = parser.parse_args(argv)
    try:
        issued = init(
            arguments.folder,
            extra_sans=arguments.san,
            days=arguments.days,
            owner=arguments.owner,
            ca_key=arguments.ca_key,
        )
        if arguments.kubernetes_secrets is not None:
            write_private(
                arguments.kubernetes_secrets,
                kubernetes_secrets(
                    arguments.folder, arguments.fullname, arguments.namespace
                ).encode(),
                0o600,
            )
    except (CertificateError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(
        f"{issued.folder}: wrote {len(issued.created)} files, kept {len(issued.kept)} certificates"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
