"""User and job tokens (stride.runtime.tokens): what verifies, and why the rest does not."""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from stride.runtime import tls
from stride.runtime.certs import init
from stride.runtime.tokens import (
    JobIdentity,
    Revocations,
    Signer,
    TokenError,
    TokenSource,
    UserIdentity,
    Verifier,
    bearer,
    new_pod_key,
    read_pod_key,
    token_id_of,
    write_pod_key,
    write_token,
)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("tokens") / "tls"
    init(target)
    return target


def signer(folder: Path, identity: str) -> Signer:
    material = tls.load(identity, {tls.TLS_DIR_ENV: str(folder)})
    assert material is not None
    return Signer(material)


def verifier(folder: Path) -> Verifier:
    return Verifier((folder / "ca.crt").read_bytes())


def test_a_user_token_verifies_as_its_user(folder: Path) -> None:
    token = signer(folder, "users").user_token("alice")
    identity = verifier(folder).verify(token)
    assert isinstance(identity, UserIdentity)
    assert (identity.user, identity.admin) == ("alice", False)
    assert identity.expires > time.time() + 80 * 86400
    admin = verifier(folder).verify(signer(folder, "users").user_token("root", admin=True))
    assert isinstance(admin, UserIdentity) and admin.admin


def test_a_job_token_names_its_job_pod_and_role(folder: Path) -> None:
    token = signer(folder, "podwatcher").job_token("job-a", "job-a-worker-0", "worker")
    identity = verifier(folder).verify(token)
    assert isinstance(identity, JobIdentity)
    assert identity == JobIdentity(
        "job-a",
        "job-a-worker-0",
        "worker",
        identity.token_id,
        identity.expires,
        issued_at=identity.issued_at,
    )
    assert 3500 < identity.expires - time.time() <= 3600
    assert abs(identity.expires - identity.issued_at - 3600) <= 1


@pytest.mark.parametrize(
    ("identity", "kind", "signer_name"),
    [
        ("podwatcher", "user", "podwatcher"),  # only the users key makes user tokens
        ("admission", "user", "admission"),
        ("users", "job", "users"),  # only the podwatcher makes job tokens
        ("dispatcher", "job", "dispatcher"),
        ("trainer", "job", "trainer"),  # every pod holds this key
    ],
)
def test_a_token_signed_by_the_wrong_identity_is_refused(
    folder: Path, identity: str, kind: str, signer_name: str
) -> None:
    mint = signer(folder, identity)
    token = (
        mint.user_token("mallory", admin=True)
        if kind == "user"
        else mint.job_token("job-b", "job-b-worker-0", "worker")
    )
    with pytest.raises(TokenError, match=rf"must be signed by .*this one is by '{signer_name}'"):
        verifier(folder).verify(token)


def test_a_token_of_another_deployment_is_refused(folder: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    init(other)
    token = signer(other, "users").user_token("alice", admin=True)
    with pytest.raises(TokenError, match=r"not issued by this deployment's CA"):
        verifier(folder).verify(token)


def test_an_expired_token_is_refused(folder: Path) -> None:
    token = signer(folder, "users").user_token("alice", ttl=0.001)
    time.sleep(0.01)
    # Within the 30 s leeway it still verifies; a verifier checks exp with that leeway.
    assert isinstance(verifier(folder).verify(token), UserIdentity)
    _, payload, _ = token.split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    claims["exp"] = int(time.time()) - 120
    material = tls.load("users", {tls.TLS_DIR_ENV: str(folder)})
    assert material is not None
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    key = load_pem_private_key(material.key, None)
    x5c = jwt.get_unverified_header(token)["x5c"]
    stale = jwt.encode(claims, key, algorithm="ES256", headers={"x5c": x5c})  # type: ignore[arg-type]
    with pytest.raises(TokenError, match="expired"):
        verifier(folder).verify(stale)


def test_a_job_token_binds_the_pods_key_and_a_bad_binding_is_refused(
    folder: Path, tmp_path: Path
) -> None:
    pod_key = new_pod_key()
    write_pod_key(tmp_path / "pod.key", pod_key)
    assert (tmp_path / "pod.key").stat().st_mode & 0o777 == 0o600
    reread = read_pod_key(tmp_path / "pod.key")
    assert reread.private_numbers() == pod_key.private_numbers()
    token = signer(folder, "podwatcher").job_token(
        "job-a", "job-a-worker-0", "worker", pod_key=reread.public_key()
    )
    identity = verifier(folder).verify(token)
    assert isinstance(identity, JobIdentity) and identity.key is not None
    assert identity.key.public_numbers() == pod_key.public_key().public_numbers()
    # Without one, none is bound.
    plain = verifier(folder).verify(signer(folder, "podwatcher").job_token("job-a", "p", "chief"))
    assert isinstance(plain, JobIdentity) and plain.key is None
    # Only P-256 keys are bound.
    other_curve = ec.generate_private_key(ec.SECP384R1()).public_key()
    with pytest.raises(TokenError, match="pod_key: must be an EC P-256 key"):
        signer(folder, "podwatcher").job_token("job-a", "p", "chief", pod_key=other_curve)
    # A binding that is not a public key is refused when verified.
    material = tls.load("podwatcher", {tls.TLS_DIR_ENV: str(folder)})
    assert material is not None
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    key = load_pem_private_key(material.key, None)
    x5c = jwt.get_unverified_header(token)["x5c"]
    claims = jwt.decode(token, options={"verify_signature": False})
    for cnf, problem in (
        ("key", "must hold the pod's public key"),
        ({"jwk": {"kty": "EC", "crv": "P-256", "x": "AA", "y": "AA"}}, "cnf.jwk"),
        ({"jwk": {**claims["cnf"]["jwk"], "d": "AA"}}, "must hold the pod's public key"),
    ):
        bad = jwt.encode({**claims, "cnf": cnf}, key, algorithm="ES256", headers={"x5c": x5c})  # type: ignore[arg-type]
        with pytest.raises(TokenError, match=problem):
            verifier(folder).verify(bad)
    # A pod key file that is not one names the file.
    (tmp_path / "bad.key").write_text("not a key")
    with pytest.raises(TokenError, match=r"the pod key .*bad\.key"):
        read_pod_key(tmp_path / "bad.key")


def test_a_changed_claim_breaks_the_signature(folder: Path) -> None:
    token = signer(folder, "users").user_token("alice")
    header, payload, signature = token.split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    claims["admin"] = True
    forged = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
    with pytest.raises(TokenError, match=r"[Ss]ignature"):
        verifier(folder).verify(f"{header}.{forged}.{signature}")


def test_a_key_of_ones_own_with_a_borrowed_certificate_is_refused(folder: Path) -> None:
    """The x5c names the users certificate, but the signature is another key's."""
    genuine = signer(folder, "users").user_token("alice")
    x5c = jwt.get_unverified_header(genuine)["x5c"]
    own_key = ec.generate_private_key(ec.SECP256R1())
    claims = jwt.decode(genuine, options={"verify_signature": False})
    claims["admin"] = True
    forged = jwt.encode(claims, own_key, algorithm="ES256", headers={"x5c": x5c})
    with pytest.raises(TokenError, match=r"[Ss]ignature"):
        verifier(folder).verify(forged)


@pytest.mark.parametrize(
    ("token", "problem"),
    [
        ("", "must be 1 to"),
        ("x" * 9000, "must be 1 to"),
        ("not-a-jwt", "not a JWT"),
        (jwt.encode({"sub": "a"}, "s" * 32, algorithm="HS256"), "alg: must be ES256"),
        (jwt.encode({"sub": "a"}, None, algorithm="none"), "alg: must be ES256"),  # type: ignore[arg-type]
    ],
)
def test_garbage_is_refused_with_a_reason(folder: Path, token: str, problem: str) -> None:
    with pytest.raises(TokenError, match=problem):
        verifier(folder).verify(token)


def test_an_es256_token_without_x5c_is_refused(folder: Path) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    token = jwt.encode({"sub": "alice", "typ": "user"}, key, algorithm="ES256")
    with pytest.raises(TokenError, match="x5c"):
        verifier(folder).verify(token)


@pytest.mark.parametrize(
    ("metadata", "expected"),
    [
        ((), None),
        ((("authorization", "Bearer abc"),), "abc"),
        ((("authorization", "bearer  abc "),), "abc"),
    ],
)
def test_bearer_reads_the_authorization_entry(metadata: tuple, expected: str | None) -> None:  # type: ignore[type-arg]
    assert bearer(metadata) == expected


@pytest.mark.parametrize(
    "metadata",
    [
        (("authorization", "Basic YTpi"),),
        (("authorization", "Bearer"),),
        (("authorization", "Bearer a"), ("authorization", "Bearer b")),
    ],
)
def test_bearer_refuses_other_schemes_and_repeats(metadata: tuple) -> None:  # type: ignore[type-arg]
    with pytest.raises(TokenError, match="authorization"):
        bearer(metadata)


def test_a_token_file_is_read_again_when_rewritten(tmp_path: Path) -> None:
    path = tmp_path / "pod.token"
    write_token(path, "first")
    assert path.stat().st_mode & 0o777 == 0o600
    source = TokenSource(path=path)
    assert source() == "first"
    write_token(path, "second-and-longer")
    assert source() == "second-and-longer"
    path.unlink()
    with pytest.raises(TokenError, match="cannot read the token file"):
        source()


def test_the_environment_names_the_token(tmp_path: Path) -> None:
    path = tmp_path / "t"
    write_token(path, "from-file")
    assert TokenSource.from_environment({}) is None
    given = TokenSource.from_environment({"STRIDE_TOKEN": "inline", "STRIDE_TOKEN_FILE": str(path)})
    assert given is not None and given() == "inline"
    from_file = TokenSource.from_environment({"STRIDE_TOKEN_FILE": str(path)})
    assert from_file is not None and from_file() == "from-file"
    job = TokenSource.from_environment({"STRIDE_JOB_TOKEN_FILE": str(path)}, job=True)
    assert job is not None and job() == "from-file"
    assert TokenSource.from_environment({"STRIDE_TOKEN": "user"}, job=True) is None


@pytest.mark.parametrize("user", ["", "x" * 200, "a\nb"])
def test_bad_names_are_refused_when_minting(folder: Path, user: str) -> None:
    with pytest.raises(TokenError, match="user"):
        signer(folder, "users").user_token(user)


def test_revoked_tokens_are_refused_even_when_verified_before(folder: Path) -> None:
    """One token by its id; a user's tokens issued until a moment (later ones still work);
    a job token by its id. The cache of verified tokens does not outlive a revocation."""
    revocations = Revocations()
    checking = Verifier((folder / "ca.crt").read_bytes(), revocations)
    users = signer(folder, "users")
    first, second = users.user_token("alice"), users.user_token("alice")
    bob = users.user_token("bob")
    job = signer(folder, "podwatcher").job_token("job-a", "job-a-worker-0", "worker")
    for token in (first, second, bob, job):
        checking.verify(token)  # cached from here on
    revocations.revoke_token(token_id_of(first))
    with pytest.raises(TokenError, match=f"revoked \\(token {token_id_of(first)}\\)"):
        checking.verify(first)
    verified = checking.verify(second)
    assert isinstance(verified, UserIdentity) and verified.issued_at > 0
    issued = verified.issued_at
    revocations.revoke_user("alice", issued)
    with pytest.raises(TokenError, match="every token of user 'alice' issued until"):
        checking.verify(second)
    checking.verify(bob)
    # A revocation replayed late never moves the moment back.
    revocations.revoke_user("alice", issued - 3600)
    with pytest.raises(TokenError, match="revoked"):
        checking.verify(second)
    # Tokens made after the moment work (iat is in whole seconds: one second later).
    revocations.revoke_user("carol", time.time() - 5)
    checking.verify(users.user_token("carol"))
    revocations.revoke_token(token_id_of(job))
    with pytest.raises(TokenError, match="revoked"):
        checking.verify(job)
    assert len(revocations) == 4
    # Without revocations, nothing is checked.
    verifier(folder).verify(first)


def test_a_token_names_its_id_and_a_user_token_lives_a_year_at_most(folder: Path) -> None:
    users = signer(folder, "users")
    token = users.user_token("alice")
    assert token_id_of(token) == verifier(folder).verify(token).token_id
    assert len(token_id_of(token)) == 32
    with pytest.raises(TokenError, match="not a JWT"):
        token_id_of("not a token")
    unsigned = jwt.encode({"sub": "x"}, "k" * 32, algorithm="HS256")
    with pytest.raises(TokenError, match="names no id"):
        token_id_of(unsigned)
    with pytest.raises(TokenError, match="at most 365 days, got 366"):
        users.user_token("alice", ttl=366 * 86400)


def test_an_ended_jobs_tokens_are_refused_and_later_ones_are_not(folder: Path) -> None:
    revocations = Revocations()
    checking = Verifier((folder / "ca.crt").read_bytes(), revocations)
    pods = signer(folder, "podwatcher")
    before = pods.job_token("job-a", "job-a-worker-0", "worker")
    other = pods.job_token("job-b", "job-b-worker-0", "worker")
    ended = checking.verify(before).issued_at + 0.0005
    revocations.revoke_job("job-a", ended)
    with pytest.raises(TokenError, match="revoked: job 'job-a' has ended"):
        checking.verify(before)
    checking.verify(other)
    time.sleep(0.002)
    checking.verify(pods.job_token("job-a", "job-a-worker-0", "worker"))  # minted after
    # A user token naming the same string as its user is no job token.
    checking.verify(signer(folder, "users").user_token("job-a"))
