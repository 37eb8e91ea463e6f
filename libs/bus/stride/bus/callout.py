"""NATS users for training pods, one per job: the auth callout the pod watcher answers.

Every Stride service connects to NATS as its own user, named by its certificate
(:mod:`.permissions`). A training pod's agent instead connects with its *job token*: NATS
finds no user for the agent's certificate and, as its configuration's ``auth_callout``
block says, asks the pod watcher (``$SYS.REQ.USER.AUTH``; NATS 2.10+, centralized mode). The
pod watcher checks the token as every server checks it (the suite's CA signed its signer,
the pod watcher; not expired, not revoked, :class:`~stride.runtime.tokens.Verifier`) and
that the client's certificate is an agent's, and answers with a NATS user for that one job
and pod (:func:`~.permissions.agent_permissions`): it may publish that job's step metrics
and control acknowledgements, and subscribe to that job's control commands and its own
inbox, nothing of another job. Anything else is refused, and the refusal says why (NATS
logs it and the agent's connection fails with "Authorization Violation").

Wire format (NATS's auth callout, from its documentation): the server sends a JWT of type
``authorization_request`` signed by the server's own key, naming the connecting client's
``user_nkey``, its CONNECT options (``auth_token``) and its TLS chain; the answer is a JWT of
type ``authorization_response`` signed by the *issuer* (an account nkey whose public half the
server configuration names), for the server (``aud``: its id) and the client (``sub``: its
``user_nkey``), carrying either an ``error`` or a user JWT with the permissions. JWTs here
are NATS's: header ``{"typ":"JWT","alg":"ed25519-nkey"}``, base64url without padding,
ed25519 signatures by nkeys (the ``nkeys`` package). No Python library writes NATS JWTs, so
the few claims needed are written here.

The issuer's seed is ``nats-callout.nk`` beside the certificates (made by ``stride certs
init``); only the pod watcher needs it, and NATS needs its public key
(``stride.bus.lockdown`` writes it into the configuration).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nkeys
import structlog
from cryptography import x509
from cryptography.x509.oid import NameOID

from stride.bus import permissions
from stride.runtime.certs import CALLOUT_SEED_NAME
from stride.runtime.tokens import JobIdentity, TokenError

log = structlog.get_logger(__name__)

QUEUE = "stride-auth-callout"
"""Pod watcher replicas share the requests."""
SEED_NAME = CALLOUT_SEED_NAME
"""The issuer's seed, beside the certificates."""
ISSUER_ENV = "STRIDE_NATS_CALLOUT_ISSUER"
"""Where a NATS configuration that is not generated per deployment (the Helm chart's) reads
the issuer's public key from (``issuer: $STRIDE_NATS_CALLOUT_ISSUER``)."""
GLOBAL_ACCOUNT = "$G"
"""The account of a configuration without accounts, where the agents' users are made."""
MAX_REQUEST_BYTES = 64 * 1024
SESSION_SECONDS = 300.0
"""The longest a pod's NATS user lives (its JWT's ``exp``; never past its job token's). The
agent then reconnects, presenting its job token as rewritten meanwhile, and the callout
issues a new user while the token is valid. It bounds how long a session outlives its
token where nothing disconnects it sooner (a pod watcher restarted since it issued the
user, or a NATS without the system user: ``stride.bus.sessions``); five minutes costs an
agent one reconnect in that time."""


class CalloutError(Exception):
    """A request the callout refuses; the message says why."""


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def encode_jwt(claims: dict[str, Any], signer: Any) -> str:
    """A NATS JWT of ``claims`` signed by the nkey ``signer``. Its ``jti`` is the claims'
    hash (base32 of SHA-512/256), as NATS's own tools make it."""
    body = {key: value for key, value in claims.items() if key != "jti"}
    digest = hashlib.new("sha512_256", json.dumps(body, sort_keys=True).encode()).digest()
    body["jti"] = base64.b32encode(digest).decode().rstrip("=")
    header = _b64(json.dumps({"typ": "JWT", "alg": "ed25519-nkey"}).encode())
    payload = _b64(json.dumps(body).encode())
    signature = signer.sign(f"{header}.{payload}".encode())
    return f"{header}.{payload}.{_b64(signature)}"


def decode_jwt(token: str) -> dict[str, Any]:
    """The claims of a NATS JWT; :class:`CalloutError` if it is malformed.

    The server's signature on a request is not checked: only the server publishes on
    :data:`~.permissions.CALLOUT_SUBJECT` (no Stride user may), and a forged request could
    gain nothing, as the user it obtains is bound to the ``user_nkey`` the forger named,
    while the server accepts an answer only for the nkey of the client it asked about."""
    try:
        header, payload, _signature = token.split(".")
        if json.loads(_unb64(header)).get("alg") != "ed25519-nkey":
            raise CalloutError("not an ed25519-nkey JWT")
        claims = json.loads(_unb64(payload))
    except CalloutError:
        raise
    except (ValueError, TypeError, AttributeError, binascii.Error) as error:
        raise CalloutError(f"malformed request JWT: {type(error).__name__}") from None
    if not isinstance(claims, dict):
        raise CalloutError("malformed request JWT: claims are not an object")
    return claims


@dataclass(frozen=True)
class Issuer:
    """The account nkey that signs the agents' NATS users."""

    keys: Any

    @classmethod
    def from_file(cls, path: Path) -> Issuer:
        try:
            seed = path.read_bytes().strip()
        except OSError as error:
            raise CalloutError(f"cannot read the callout issuer's seed {path}: {error}") from None
        return cls.from_seed(seed, str(path))

    @classmethod
    def from_seed(cls, seed: bytes, where: str = "the seed") -> Issuer:
        try:
            keys = nkeys.from_seed(seed)
            public = keys.public_key.decode()
        except (nkeys.NkeysError, ValueError, binascii.Error) as error:
            raise CalloutError(f"{where}: not an nkey seed ({error})") from None
        if not public.startswith("A"):
            raise CalloutError(f"{where}: an account seed (SA...) is needed, got {public[0]}...")
        return cls(keys)

    @property
    def public_key(self) -> str:
        public: bytes = self.keys.public_key
        return public.decode()


def public_key_of(path: Path) -> str:
    """The issuer's public key (``A...``) from its seed file, for the server configuration."""
    return Issuer.from_file(path).public_key


def _certificate_identity(client_tls: Any) -> str | None:
    """The common name of the client's verified certificate, if NATS sent one."""
    try:
        pem = client_tls["verified_chains"][0][0]
        certificate = x509.load_pem_x509_certificate(pem.encode())
        names = certificate.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    except (KeyError, IndexError, TypeError, ValueError, AttributeError):
        return None
    return str(names[0].value) if names else None


@dataclass(frozen=True)
class Session:
    """A NATS user the callout issued to a pod: whose token opened it, until when."""

    user_nkey: str
    token: str
    job: JobIdentity
    expires: float

    @property
    def user_name(self) -> str:
        """The NATS user's name (what NATS reports as its ``authorized_user``)."""
        return user_name(self.job)


def user_name(job: JobIdentity) -> str:
    """The name of a pod's NATS user."""
    return f"agent:{job.job_id}/{job.pod}"


class Callout:
    """Answers NATS's authorization requests for training pods (see the module)."""

    def __init__(
        self,
        issuer: Issuer,
        verify: Callable[[str], Any],
        now: Callable[[], float] = time.time,
        session_seconds: float = SESSION_SECONDS,
    ) -> None:
        self.issuer = issuer
        self.verify = verify
        """A token verifier's ``verify``: the identity, or :class:`TokenError`."""
        self.now = now
        self.session_seconds = session_seconds
        self.sessions: dict[str, Session] = {}
        """The users this callout issued, by user nkey, until they expire: what
        ``stride.bus.sessions`` checks again."""

    def answer(self, request: bytes) -> bytes:
        """The signed response to one request: a user for the pod, or an error naming why."""
        if len(request) > MAX_REQUEST_BYTES:
            raise CalloutError(f"request of {len(request)} bytes (at most {MAX_REQUEST_BYTES})")
        claims = decode_jwt(request.decode("utf-8", errors="replace"))
        nats = claims.get("nats") or {}
        if nats.get("type") != "authorization_request":
            raise CalloutError(f"not an authorization request: type {nats.get('type')!r}")
        user_nkey = nats.get("user_nkey")
        server = (nats.get("server_id") or {}).get("id")
        if not isinstance(user_nkey, str) or not isinstance(server, str):
            raise CalloutError("authorization request without user_nkey or server id")
        now = int(self.now())
        response: dict[str, Any] = {"type": "authorization_response", "version": 2}
        try:
            user, session = self._user(user_nkey, nats, now)
            response["jwt"] = user
            self._remember(session)
            job = session.job
            log.info("nats user for pod", job_id=job.job_id, pod=job.pod, role=job.role)
        except CalloutError as refusal:
            response["error"] = str(refusal)
            log.warning("nats connection refused", reason=str(refusal))
        return encode_jwt(
            {
                "iat": now,
                "iss": self.issuer.public_key,
                "sub": user_nkey,
                "aud": server,
                "nats": response,
            },
            self.issuer.keys,
        ).encode()

    def _remember(self, session: Session) -> None:
        now = self.now()
        for nkey in [nkey for nkey, known in self.sessions.items() if known.expires < now]:
            del self.sessions[nkey]
        self.sessions[session.user_nkey] = session

    def _user(self, user_nkey: str, nats: dict[str, Any], now: int) -> tuple[str, Session]:
        identity = _certificate_identity(nats.get("client_tls"))
        if identity != permissions.AGENT:
            raise CalloutError(
                f"certificate {identity or '(none)'!r} has no NATS user; only a pod's agent "
                "connects with a job token"
            )
        token = (nats.get("connect_opts") or {}).get("auth_token")
        if not isinstance(token, str) or not token:
            raise CalloutError("no job token (the agent sends its pod's job token)")
        try:
            job = self.verify(token)
        except TokenError as error:
            raise CalloutError(f"job token refused: {error}") from None
        if not isinstance(job, JobIdentity):
            raise CalloutError("a user's token opens no pod's NATS user; a job token is needed")
        allowed = permissions.agent_permissions(job.job_id, job.pod)
        expires = int(now + self.session_seconds)
        if job.expires:
            expires = min(expires, int(job.expires))
        claims: dict[str, Any] = {
            "iat": now,
            "exp": max(expires, now + 1),
            "iss": self.issuer.public_key,
            "sub": user_nkey,
            "name": user_name(job),
            "aud": GLOBAL_ACCOUNT,
            "nats": {
                "pub": {"allow": list(allowed.publish)},
                "sub": {"allow": list(allowed.subscribe)},
                "subs": -1,
                "data": -1,
                "payload": -1,
                "type": "user",
                "version": 2,
            },
        }
        return encode_jwt(claims, self.issuer.keys), Session(user_nkey, token, job, expires)


async def serve(nc: Any, callout: Callout) -> Any:
    """Answer ``$SYS.REQ.USER.AUTH`` on the NATS connection ``nc`` (a queue group, so pod
    watcher replicas share it); the subscription. A request that cannot be answered at all
    (not a signed request) gets no reply: NATS then refuses the client after its timeout."""

    async def handle(message: Any) -> None:
        try:
            reply = callout.answer(message.data)
        except CalloutError as error:
            log.warning("auth callout request dropped", reason=str(error))
            return
        await message.respond(reply)

    return await nc.subscribe(permissions.CALLOUT_SUBJECT, queue=QUEUE, cb=handle)
