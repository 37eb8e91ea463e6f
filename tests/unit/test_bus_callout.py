"""The auth callout's answers (stride.bus.callout), request by request: a user scoped to the
pod's job, signed by the issuer, for the client NATS asked about; refusals naming why; and
requests that are not requests."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Any

import nacl.signing
import nkeys
import pytest

from stride.bus import callout, permissions, topics
from stride.bus.callout import Callout, CalloutError, Issuer, decode_jwt, encode_jwt
from stride.runtime import certs, tls
from stride.runtime.tokens import Verifier
from stride.testing.channels import job_token, user_token

JOB = "job-calloutunit01"


def _keys(prefix: int) -> Any:
    return nkeys.from_seed(nkeys.encode_seed(os.urandom(32), prefix))


SERVER = _keys(nkeys.PREFIX_BYTE_SERVER)
CLIENT = _keys(nkeys.PREFIX_BYTE_USER)


def _request(token: str | None, identity: str = "agent", **changes: Any) -> bytes:
    """An authorization request as nats-server sends one."""
    folder = Path(os.environ[tls.TLS_DIR_ENV])
    nats: dict[str, Any] = {
        "server_id": {"id": SERVER.public_key.decode(), "name": "n", "version": "2.15.1"},
        "user_nkey": CLIENT.public_key.decode(),
        "connect_opts": {"auth_token": token} if token is not None else {},
        "client_tls": {"verified_chains": [[(folder / f"{identity}.crt").read_text()]]},
        "type": "authorization_request",
        "version": 2,
    }
    nats.update(changes)
    claims = {"iss": SERVER.public_key.decode(), "aud": "nats-authorization-request", "nats": nats}
    return encode_jwt(claims, SERVER).encode()


@pytest.fixture
def answering() -> Callout:
    folder = Path(os.environ[tls.TLS_DIR_ENV])
    material = tls.load("podwatcher")
    assert material is not None
    return Callout(Issuer.from_file(folder / callout.SEED_NAME), Verifier(material.ca).verify)


def _verified(token: str, issuer: str) -> dict[str, Any]:
    """The claims of a NATS JWT whose signature the issuer's public key checks."""
    header, payload, signature = token.split(".")
    raw = base64.b32decode(issuer + "=" * (-len(issuer) % 8))[1:-2]
    pad = "=" * (-len(signature) % 4)
    nacl.signing.VerifyKey(raw).verify(
        f"{header}.{payload}".encode(), base64.urlsafe_b64decode(signature + pad)
    )
    assert json.loads(base64.urlsafe_b64decode(header + "==="))["alg"] == "ed25519-nkey"
    return decode_jwt(token)


def test_a_pods_job_token_gets_a_user_for_its_job_signed_for_that_client(
    answering: Callout,
) -> None:
    issuer = answering.issuer.public_key
    response = _verified(answering.answer(_request(job_token(JOB, "pod-3"))).decode(), issuer)
    assert response["iss"] == issuer
    assert response["sub"] == CLIENT.public_key.decode()
    assert response["aud"] == SERVER.public_key.decode()
    assert response["nats"]["type"] == "authorization_response"
    assert "error" not in response["nats"]
    user = _verified(response["nats"]["jwt"], issuer)
    assert user["sub"] == CLIENT.public_key.decode() and user["aud"] == "$G"
    allowed = permissions.agent_permissions(JOB, "pod-3")
    assert user["nats"]["pub"]["allow"] == list(allowed.publish)
    assert user["nats"]["sub"]["allow"] == list(allowed.subscribe)


def test_the_pods_user_names_only_its_job_and_its_own_inbox() -> None:
    allowed = permissions.agent_permissions(JOB, "pod-3")
    assert topics.STEP_METRICS.subject(JOB) in allowed.publish
    assert topics.CONTROL_ACK.subject(JOB) in allowed.publish
    assert topics.CONTROL_COMMAND.subject(JOB) in allowed.subscribe
    assert f"{permissions.inbox_prefix('agent')}.{JOB}.pod-3.>" in allowed.subscribe
    every_job = {t.pattern() for t in (topics.STEP_METRICS, topics.CONTROL_ACK)}
    assert not every_job & set(allowed.publish)
    assert topics.CONTROL_COMMAND.pattern() not in allowed.subscribe
    assert f"{permissions.inbox_prefix('agent')}.>" not in allowed.subscribe
    assert not any(subject.startswith("$SYS") for subject in allowed.subscribe)
    with pytest.raises(ValueError, match="not a subject token"):
        permissions.agent_permissions("job.*", "pod-3")
    # And the configuration has no shared agent user any more.
    assert "agent" not in {user["user"] for user in permissions.server_users(tls.IDENTITIES)}


@pytest.mark.parametrize(
    ("token", "identity", "reason"),
    [
        (None, "agent", "no job token"),
        ("", "agent", "no job token"),
        ("junk", "agent", "job token refused"),
        ("user", "agent", "a user's token opens no pod's NATS user"),
        ("job", "trainer", "certificate 'trainer' has no NATS user"),
    ],
)
def test_anything_else_is_refused_saying_why(
    answering: Callout, token: str | None, identity: str, reason: str
) -> None:
    given = {"user": user_token("alice"), "job": job_token(JOB)}.get(token or "", token)
    response = decode_jwt(answering.answer(_request(given, identity)).decode())
    assert "jwt" not in response["nats"]
    assert reason in response["nats"]["error"]


def test_what_is_not_an_authorization_request_gets_no_answer(answering: Callout) -> None:
    for request, reason in (
        (b"junk", "malformed request JWT"),
        (b"a.b.c", "malformed request JWT"),
        (b"x" * (callout.MAX_REQUEST_BYTES + 1), "at most"),
        (_request(job_token(JOB), type="authorization_response"), "not an authorization request"),
        (_request(job_token(JOB), user_nkey=None), "without user_nkey"),
    ):
        with pytest.raises(CalloutError, match=reason):
            answering.answer(request)


def test_the_issuer_must_be_an_account_seed(tmp_path: Path) -> None:
    (tmp_path / "user.nk").write_bytes(nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER))
    with pytest.raises(CalloutError, match="an account seed"):
        Issuer.from_file(tmp_path / "user.nk")
    (tmp_path / "junk.nk").write_text("not a seed")
    with pytest.raises(CalloutError, match="not an nkey seed"):
        Issuer.from_file(tmp_path / "junk.nk")
    with pytest.raises(CalloutError, match="cannot read"):
        Issuer.from_file(tmp_path / "missing.nk")
    certs.init(tmp_path / "tls", identities=())
    assert callout.public_key_of(tmp_path / "tls" / callout.SEED_NAME).startswith("A")
