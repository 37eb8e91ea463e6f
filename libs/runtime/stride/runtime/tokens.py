"""Signed bearer tokens: who a user is, and which job a pod works for.

mTLS (:mod:`.tls`) says which *program* calls (the CLI, a trainer, the optimizer); it does
not say which user runs the CLI, nor which job a trainer's pod belongs to, and every pod
holds the same ``trainer`` certificate. Those two come from tokens, JWTs (RFC 7519) signed
with ES256 and sent as ``authorization: Bearer <token>``:

- **user tokens** (``typ: user``): ``sub`` is the user (whose quotas apply: a team's
  quota lists its members), ``admin`` whether the user sees and manages every job.
  Signed with the key of the ``users`` identity, which only the suite's administrator
  holds (``stride up`` keeps it in the state folder; ``stride token create`` mints one).
- **job tokens** (``typ: job``): ``job``, ``pod`` and ``role``, signed by the pod watcher
  when it creates the pod, short-lived (an hour by default) and rewritten before they
  expire into a file the pod's processes read on every call (as Kubernetes projects
  service-account tokens). A job token may also bind the pod's own key (``cnf.jwk``, a
  proof-of-possession key, RFC 7800): the pod watcher makes a key per pod and gives it
  to the pod beside the token, and what the pod publishes on the bus is signed with it
  (:mod:`stride.bus.signing`), so a token seen in a message is no use without the key.

A token carries its signer's certificate (the JWS ``x5c`` header, RFC 7515 sec. 4.1.6). A
verifier needs nothing but the deployment's CA, which every process already trusts for
mTLS: it checks that the CA issued that certificate, that the certificate is the right
signer's (its common name is ``users`` for user tokens, ``podwatcher`` for job tokens, so
a service cannot mint tokens with its own key), that the signature is the certificate's
key's, and the audience, expiry and claims. Nothing a caller says about itself outside a
verified token is trusted.
"""

from __future__ import annotations

import base64
import functools
import math
import os
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jwt
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from jwt.algorithms import ECAlgorithm

from stride.runtime.certs import CertificateError, verified_signer
from stride.runtime.tls import TlsMaterial

USER_ISSUER = "users"
"""The identity whose key signs user tokens (:data:`.tls.IDENTITIES`)."""
JOB_ISSUER = "podwatcher"
"""The identity whose key signs job tokens: the service that creates pods."""
AUDIENCE = "stride"
ALGORITHM = "ES256"

TOKEN_ENV = "STRIDE_TOKEN"
"""A user token itself (the CLI and other user clients)."""
TOKEN_FILE_ENV = "STRIDE_TOKEN_FILE"
"""A file holding a user token (``stride up`` writes them into its state folder)."""
JOB_TOKEN_FILE_ENV = "STRIDE_JOB_TOKEN_FILE"
"""A file holding the pod's job token, rewritten by the pod watcher before it expires."""

USER_TOKEN_TTL = 90 * 24 * 3600.0
"""Default life of a user token (``stride token create --days``)."""
MAX_USER_TOKEN_TTL = 365 * 24 * 3600.0
"""The longest a user token may live: revocations are kept a little longer (the bus's
``STRIDE_AUTH`` stream)."""
JOB_TOKEN_TTL = 3600.0
"""Life of a job token; the pod watcher rewrites it at half that age."""
LEEWAY_SECONDS = 30.0
"""Clock skew tolerated between the signer and a verifier."""
MAX_TOKEN_BYTES = 8192
"""Longer bearer values are refused before any parsing."""
NAME_LIMIT = 128
_VERIFIED_CACHE = 4096
"""Verified tokens a verifier remembers (a few hundred bytes each)."""


class TokenError(Exception):
    """A token could not be made or is not valid; the message says why."""


@dataclass(frozen=True)
class UserIdentity:
    """A verified user token."""

    user: str
    admin: bool = False
    token_id: str = ""
    expires: float = 0.0
    issued_at: float = 0.0

    def describe(self) -> str:
        return f"user {self.user!r}" + (" (admin)" if self.admin else "")


@dataclass(frozen=True)
class JobIdentity:
    """A verified job token: the pod it was given to and the job it works for."""

    job_id: str
    pod: str
    role: str
    token_id: str = ""
    expires: float = 0.0
    key: ec.EllipticCurvePublicKey | None = field(default=None, compare=False, repr=False)
    """The pod's own key the token binds (``cnf.jwk``), if it binds one."""
    issued_at: float = 0.0

    def describe(self) -> str:
        return f"job {self.job_id!r} (pod {self.pod!r}, {self.role})"


Identity = UserIdentity | JobIdentity


def check_claim_name(value: Any, field: str) -> str:
    """``value`` if it may be a token's user, job, pod or role name; else :class:`TokenError`."""
    if not isinstance(value, str) or not value or len(value) > NAME_LIMIT:
        raise TokenError(f"{field}: must be a non-empty string of at most {NAME_LIMIT} chars")
    if any(ord(char) < 32 or char in "\x7f" for char in value):
        raise TokenError(f"{field}: control characters are not allowed")
    return value


class Signer:
    """Mints tokens with one identity's key; the token carries that identity's certificate."""

    def __init__(self, material: TlsMaterial) -> None:
        try:
            key = serialization.load_pem_private_key(material.key, password=None)
            chain = x509.load_pem_x509_certificates(material.certificate)
        except ValueError as error:
            raise TokenError(f"the key or certificate of {material.identity!r}: {error}") from None
        if not isinstance(key, ec.EllipticCurvePrivateKey) or not chain:
            raise TokenError(f"{material.identity!r} needs an EC P-256 key and a certificate")
        self.identity = material.identity
        self._key = key
        der = chain[0].public_bytes(serialization.Encoding.DER)
        self._x5c = [base64.b64encode(der).decode()]

    def _mint(self, claims: dict[str, Any], ttl: float) -> str:
        if not ttl > 0:
            raise TokenError(f"ttl: must be > 0 seconds, got {ttl!r}")
        now = time.time()
        payload = {
            **claims,
            "iss": self.identity,
            "aud": AUDIENCE,
            # To the millisecond, rounded down (a NumericDate may hold fractions, RFC 7519
            # sec. 2): a token made after a user's tokens were revoked is not caught by it,
            # one made before always is.
            "iat": math.floor(now * 1000) / 1000,
            "nbf": int(now),
            "exp": int(now + ttl),
            "jti": uuid.uuid4().hex,
        }
        return jwt.encode(payload, self._key, algorithm=ALGORITHM, headers={"x5c": self._x5c})

    def user_token(
        self,
        user: str,
        *,
        admin: bool = False,
        ttl: float = USER_TOKEN_TTL,
    ) -> str:
        """A token for ``user`` (only the ``users`` identity's tokens are accepted as such),
        living at most :data:`MAX_USER_TOKEN_TTL`."""
        check_claim_name(user, "user")
        if ttl > MAX_USER_TOKEN_TTL:
            raise TokenError(
                f"ttl: a user token lives at most {MAX_USER_TOKEN_TTL / 86400:g} days, "
                f"got {ttl / 86400:g}"
            )
        claims = {"sub": user, "typ": "user", "admin": bool(admin)}
        return self._mint(claims, ttl)

    def job_token(
        self,
        job_id: str,
        pod: str,
        role: str,
        *,
        ttl: float = JOB_TOKEN_TTL,
        pod_key: ec.EllipticCurvePublicKey | None = None,
    ) -> str:
        """A token for one pod of one job (only the pod watcher's are accepted as such),
        binding ``pod_key`` (the public half of the pod's own key) if given."""
        claims: dict[str, Any] = {
            "sub": f"{check_claim_name(job_id, 'job')}/{check_claim_name(pod, 'pod')}",
            "typ": "job",
            "job": job_id,
            "pod": pod,
            "role": check_claim_name(role, "role"),
        }
        if pod_key is not None:
            if not isinstance(pod_key.curve, ec.SECP256R1):
                raise TokenError(f"pod_key: must be an EC P-256 key, got {pod_key.curve.name}")
            claims["cnf"] = {"jwk": ECAlgorithm.to_jwk(pod_key, as_dict=True)}
        return self._mint(claims, ttl)


_EXPECTED_SIGNER = {"user": USER_ISSUER, "job": JOB_ISSUER}


class Revocations:
    """Revoked tokens (admission publishes them; every server follows them:
    ``stride.wiring``): one token by its id, every token of a user issued at or before a
    moment (an administrator's doing), or every job token of a job issued until it ended.
    Kept as long as the tokens they name could live."""

    def __init__(self) -> None:
        self._tokens: set[str] = set()
        self._until: dict[tuple[str, str], float] = {}
        """("user", name) or ("job", id) -> its tokens issued at or before this are revoked."""

    def revoke_token(self, token_id: str) -> None:
        self._tokens.add(token_id)

    def revoke_user(self, user: str, issued_before: float) -> None:
        """Every token of ``user`` issued at or before ``issued_before`` (a later revocation
        of the same user moves the moment; an earlier one replayed late does not)."""
        self._revoke_until(("user", user), issued_before)

    def revoke_job(self, job_id: str, issued_before: float) -> None:
        """Every job token of ``job_id`` issued at or before ``issued_before`` (it ended)."""
        self._revoke_until(("job", job_id), issued_before)

    def _revoke_until(self, whose: tuple[str, str], issued_before: float) -> None:
        self._until[whose] = max(issued_before, self._until.get(whose, issued_before))

    def check(self, identity: Identity) -> None:
        """Raise :class:`TokenError` if ``identity``'s token was revoked."""
        if identity.token_id and identity.token_id in self._tokens:
            raise TokenError(f"revoked (token {identity.token_id}); ask for a new one")
        whose = (
            ("user", identity.user)
            if isinstance(identity, UserIdentity)
            else ("job", identity.job_id)
        )
        until = self._until.get(whose)
        if until is None or identity.issued_at > until:
            return
        if isinstance(identity, JobIdentity):
            raise TokenError(f"revoked: job {identity.job_id!r} has ended")
        raise TokenError(
            f"revoked: every token of user {identity.user!r} issued until "
            f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(until))}; ask for a new one"
        )

    def __len__(self) -> int:
        return len(self._tokens) + len(self._until)


class Verifier:
    """Checks tokens against the deployment's CA (see the module docstring), and against
    ``revocations`` if given."""

    def __init__(self, ca_pem: bytes, revocations: Revocations | None = None) -> None:
        self.revocations = revocations
        try:
            self._cas = tuple(x509.load_pem_x509_certificates(ca_pem))
        except ValueError as error:
            raise TokenError(f"the CA certificate: {error}") from None
        self._verified: dict[str, Identity] = {}
        """Tokens verified before, oldest first (see :meth:`verify`)."""

    @functools.lru_cache(maxsize=256)  # noqa: B019 - a verifier lives as long as its server
    def _signer(self, der: bytes) -> tuple[str, ec.EllipticCurvePublicKey, float, float]:
        """A signer certificate's name, key and validity, once its CA signature checked."""
        try:
            signer = verified_signer(der, self._cas)
        except CertificateError as error:
            raise TokenError(f"x5c: the signer's certificate: {error}") from None
        return signer.identity, signer.key, signer.not_before, signer.not_after

    def verify(self, token: str) -> Identity:
        """The identity in ``token``; :class:`TokenError` says why it is not accepted.

        A token verified before is answered from a small cache (a pod sends the same token
        on every call) until it expires; a signature is checked once per token. Whether it
        was revoked is checked on every call."""
        if not token or len(token) > MAX_TOKEN_BYTES:
            raise TokenError(f"must be 1 to {MAX_TOKEN_BYTES} characters")
        known = self._verified.get(token)
        if known is not None and time.time() > known.expires + LEEWAY_SECONDS:
            del self._verified[token]
            known = None
        if known is None:
            known = self._verify(token)
            if len(self._verified) >= _VERIFIED_CACHE:
                self._verified.pop(next(iter(self._verified)))
            self._verified[token] = known
        if self.revocations is not None:
            self.revocations.check(known)
        return known

    def _verify(self, token: str) -> Identity:
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError as error:
            raise TokenError(f"not a JWT ({error})") from None
        if header.get("alg") != ALGORITHM:
            raise TokenError(f"alg: must be {ALGORITHM}, got {header.get('alg')!r}")
        chain = header.get("x5c")
        if not isinstance(chain, list) or len(chain) != 1 or not isinstance(chain[0], str):
            raise TokenError("x5c: must hold exactly the signer's certificate")
        try:
            der = base64.b64decode(chain[0], validate=True)
        except ValueError:
            raise TokenError("x5c: not base64") from None
        signer, key, not_before, not_after = self._signer(der)
        now = time.time()
        if not not_before - LEEWAY_SECONDS <= now <= not_after + LEEWAY_SECONDS:
            raise TokenError(f"the signer's certificate ({signer!r}) is expired or not yet valid")
        try:
            claims = jwt.decode(
                token,
                key,
                algorithms=[ALGORITHM],
                audience=AUDIENCE,
                leeway=LEEWAY_SECONDS,
                options={"require": ["exp", "iat", "iss", "sub", "aud"]},
            )
        except jwt.ExpiredSignatureError:
            raise TokenError("expired; ask for a new one") from None
        except jwt.PyJWTError as error:
            raise TokenError(str(error)) from None
        kind = claims.get("typ")
        expected = _EXPECTED_SIGNER.get(kind) if isinstance(kind, str) else None
        if expected is None:
            raise TokenError(f"typ: must be 'user' or 'job', got {kind!r}")
        if signer != expected or claims.get("iss") != expected:
            raise TokenError(
                f"a {kind} token must be signed by {expected!r}; this one is by {signer!r}"
            )
        token_id = str(claims.get("jti", ""))
        expires = float(claims["exp"])
        if kind == "user":
            return UserIdentity(
                check_claim_name(claims["sub"], "sub"),
                claims.get("admin") is True,
                token_id,
                expires,
                float(claims["iat"]),
            )
        return JobIdentity(
            check_claim_name(claims.get("job"), "job"),
            check_claim_name(claims.get("pod"), "pod"),
            check_claim_name(claims.get("role"), "role"),
            token_id,
            expires,
            _bound_key(claims),
            float(claims["iat"]),
        )


def token_id_of(token: str) -> str:
    """The id (``jti``) a token names, read without verifying it: to show it or to name it
    in a revocation (the server decides what a revocation means)."""
    try:
        claims = jwt.decode(token.strip(), options={"verify_signature": False})
    except jwt.PyJWTError as error:
        raise TokenError(f"not a JWT ({error})") from None
    token_id = claims.get("jti")
    if not isinstance(token_id, str) or not token_id:
        raise TokenError("it names no id (jti)")
    return token_id


def _bound_key(claims: Mapping[str, Any]) -> ec.EllipticCurvePublicKey | None:
    """The key a job token binds (``cnf.jwk``: an EC P-256 public JWK), None if none."""
    confirmation = claims.get("cnf")
    if confirmation is None:
        return None
    jwk = confirmation.get("jwk") if isinstance(confirmation, dict) else None
    if not isinstance(jwk, dict) or "d" in jwk:
        raise TokenError("cnf: must hold the pod's public key as cnf.jwk")
    try:
        key = ECAlgorithm.from_jwk(jwk)
    except jwt.PyJWTError as error:
        raise TokenError(f"cnf.jwk: {error}") from None
    if not isinstance(key, ec.EllipticCurvePublicKey) or not isinstance(key.curve, ec.SECP256R1):
        raise TokenError("cnf.jwk: must be an EC P-256 public key")
    return key


def new_pod_key() -> ec.EllipticCurvePrivateKey:
    """A fresh key for one pod (see :meth:`Signer.job_token`'s ``pod_key``)."""
    return ec.generate_private_key(ec.SECP256R1())


def write_pod_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    """Write a pod's key (PEM, PKCS#8) readable by its owner only, atomically."""
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    _write_private(path, pem)


def read_pod_key(path: Path) -> ec.EllipticCurvePrivateKey:
    """A pod's key written by :func:`write_pod_key`; :class:`TokenError` names the problem."""
    try:
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except (OSError, ValueError) as error:
        raise TokenError(f"the pod key {path}: {error}") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or not isinstance(key.curve, ec.SECP256R1):
        raise TokenError(f"the pod key {path}: must be an EC P-256 key")
    return key


def bearer(metadata: Any) -> str | None:
    """The bearer token of a call's metadata (None: no ``authorization`` entry).

    Raises :class:`TokenError` for an ``authorization`` value that is not ``Bearer <token>``.
    """
    values = [
        value
        for key, value in (metadata or ())
        if key == "authorization" and isinstance(value, str)
    ]
    if not values:
        return None
    if len(values) > 1:
        raise TokenError("authorization: sent more than once")
    scheme, _, token = values[0].strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise TokenError("authorization: must be 'Bearer <token>'")
    return token.strip()


class TokenSource:
    """Where a client's bearer token comes from: a value, or a file read again whenever it
    changed (the pod watcher rewrites job tokens before they expire)."""

    def __init__(self, token: str | None = None, path: Path | None = None) -> None:
        self._token = token
        self.path = path
        self._seen: tuple[float, int] | None = None

    def __call__(self) -> str | None:
        if self.path is None:
            return self._token
        try:
            status = self.path.stat()
            stamp = (status.st_mtime, status.st_size)
            if stamp != self._seen:
                self._token = self.path.read_text().strip() or None
                self._seen = stamp
        except OSError as error:
            raise TokenError(f"cannot read the token file {self.path}: {error}") from None
        return self._token

    @classmethod
    def for_pod(cls, environ: Mapping[str, str] | None = None) -> TokenSource | None:
        """The token of a job's clients (checkpoints, shards, the agent): the pod's job token
        (``STRIDE_JOB_TOKEN_FILE``), else a user's (an admin running them as a tool)."""
        return cls.from_environment(environ, job=True) or cls.from_environment(environ)

    @classmethod
    def from_environment(
        cls, environ: Mapping[str, str] | None = None, *, job: bool = False
    ) -> TokenSource | None:
        """The token the environment names: ``STRIDE_JOB_TOKEN_FILE`` for a pod's clients
        (``job``), else ``STRIDE_TOKEN`` or ``STRIDE_TOKEN_FILE``; None if it names none."""
        env = os.environ if environ is None else environ
        if job:
            path = env.get(JOB_TOKEN_FILE_ENV, "").strip()
            return cls(path=Path(path)) if path else None
        value = env.get(TOKEN_ENV, "").strip()
        if value:
            return cls(token=value)
        path = env.get(TOKEN_FILE_ENV, "").strip()
        return cls(path=Path(path)) if path else None


def write_token(path: Path, token: str) -> None:
    """Write a token readable by its owner only, replacing any older one atomically."""
    _write_private(path, (token + "\n").encode())


def _write_private(path: Path, content: bytes) -> None:
    temporary = path.with_name(f".{path.name}.tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(content)
    os.chmod(temporary, 0o600)
    os.replace(temporary, path)
