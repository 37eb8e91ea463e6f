"""Who may call which method: one rule per gRPC method, checked before the handler runs.

A caller is what was verified about it, never what it says:

- the **peer**: the identity in its client certificate, verified by mutual TLS
  (:func:`.tls.peer_identities`): which program calls (``optimizer``, ``trainer``, ``cli``);
- a **token** (:mod:`.tokens`), if it sent one: a *user* (``stride`` CLI and other user
  clients) or a *job* (a pod's agent and trainer).

Every service declares a :class:`Rule` for each of its methods (:func:`rules`); a method
without one is refused, so a new method is closed until someone decides who may call it
(``tests/unit/test_access_rules.py`` checks every method of every service has one). A rule
admits the callers it names: peers of some service identities (the services that call it
on the system's behalf), any user, admins only, or job tokens. The handler then scopes what
it touches to the caller (:func:`current`): a user's own jobs, a job token's own job.

Health and reflection are open to every verified peer (the probes have certificates).

Plain text (``STRIDE_INSECURE=1``) verifies nothing: every call is allowed, as an
unauthenticated caller, with the warning that mode already logs at start-up.
"""

from __future__ import annotations

import contextvars
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from stride.runtime.errors import NotFound, PermissionDenied, ResourceExhausted, Unauthenticated
from stride.runtime.tls import peer_identities
from stride.runtime.tokens import (
    JobIdentity,
    TokenError,
    UserIdentity,
    Verifier,
    bearer,
)
from stride.vocabulary.tenants import tenant_namespace

OPEN_SERVICES = (
    "grpc.health.v1.Health",
    "grpc.reflection.v1alpha.ServerReflection",
    "grpc.reflection.v1.ServerReflection",
)
"""Services any verified peer may call."""


@dataclass(frozen=True)
class Rule:
    """Who may call one method (any one of these suffices)."""

    services: frozenset[str] = frozenset()
    """Peers (mTLS identities) that call it on the system's behalf, without a token."""
    users: bool = False
    """Any user token (the handler limits it to the user's own jobs)."""
    admins: bool = False
    """Admin user tokens (implied by ``users``)."""
    jobs: bool = False
    """Job tokens (the handler limits it to the token's job)."""

    def describe(self) -> str:
        parts = []
        if self.users:
            parts.append("a user token")
        elif self.admins:
            parts.append("an admin's user token")
        if self.jobs:
            parts.append("a job token")
        if self.services:
            parts.append("the identity of " + " or ".join(sorted(self.services)))
        return " or ".join(parts) or "nobody (closed)"


def rule(*services: str, users: bool = False, admins: bool = False, jobs: bool = False) -> Rule:
    return Rule(frozenset(services), users, admins or users, jobs)


OPERATOR = "podwatcher"
r"""The identity that submits ``StrideJob``\ s, for the namespaces' users only."""


@dataclass(frozen=True)
class Caller:
    """What was verified about the caller of the current call."""

    peers: tuple[str, ...] = ()
    user: UserIdentity | None = None
    job: JobIdentity | None = None
    authenticated: bool = True
    """False in plain text: nothing was verified (and everything allowed)."""

    @property
    def admin(self) -> bool:
        return not self.authenticated or (self.user is not None and self.user.admin)

    def is_service(self, *names: str) -> bool:
        """Whether the peer is one of these services and sent no token of its own."""
        return self.user is None and self.job is None and any(p in names for p in self.peers)

    def describe(self) -> str:
        if not self.authenticated:
            return "an unauthenticated caller (plain text)"
        if self.user is not None:
            return self.user.describe()
        if self.job is not None:
            return self.job.describe()
        return "peer " + ("/".join(self.peers) or "unknown") + " without a token"

    def key(self) -> str:
        """Whom a rate limit counts this call against: the user, the pod, or the peer."""
        if self.user is not None:
            return f"user {self.user.user!r}"
        if self.job is not None:
            return f"pod {self.job.pod!r} of job {self.job.job_id!r}"
        return "peer " + ("/".join(self.peers) or "unknown")

    def may_see_user(self, owner: str) -> bool:
        """Whether this caller may see and act on a job of ``owner``'s: its owner, an
        admin, or the operator for a Kubernetes namespace's job
        (:mod:`stride.vocabulary.tenants`)."""
        if self.admin or (self.user is not None and self.user.user == owner):
            return True
        return self.is_service(OPERATOR) and tenant_namespace(owner) is not None

    def require_job(self, job_id: str, field: str) -> None:
        """A job token may only name its own job; other callers passed their rule."""
        if self.job is not None and job_id != self.job.job_id:
            raise PermissionDenied(
                f"{field}: {job_id!r} is another job; this caller holds a token for job "
                f"{self.job.job_id!r} and may only touch its own"
            )


UNAUTHENTICATED = Caller(authenticated=False)

_current: contextvars.ContextVar[Caller] = contextvars.ContextVar("stride_caller")


def current() -> Caller:
    """The caller of the call being handled (set by the server before the handler runs)."""
    try:
        return _current.get()
    except LookupError:
        raise RuntimeError("no call is being handled (auth.current outside a handler)") from None


def set_current(caller: Caller) -> contextvars.Token[Caller]:
    return _current.set(caller)


def require_owner(job_id: str, owner: str | None, unknown: str) -> None:
    """The current caller may see and act on job ``job_id``, which ``owner`` submitted:
    they are its owner or an admin. ``owner`` None: the service knows no such job (NOT_FOUND,
    saying ``unknown``; admins pass, and the service answers for itself)."""
    caller = current()
    if caller.admin:
        return
    if owner is None:
        raise NotFound(f"job {job_id!r}: {unknown}")
    if not caller.may_see_user(owner):
        raise PermissionDenied(
            f"job_id: {job_id!r} is another user's job; {caller.describe()} sees and acts on "
            "their own only"
        )


def rules(service: str, by_method: Mapping[str, Rule]) -> dict[str, Rule]:
    """A service's rules keyed by full method name (``/pkg.Service/Method``)."""
    return {f"/{service}/{method}": value for method, value in by_method.items()}


class RateLimiter:
    """A token bucket per identity (:meth:`Caller.key`): ``rate`` calls a second sustained,
    ``burst`` at once. The least recently seen identities are forgotten past ``max_keys``
    (a forgotten one starts again with a full bucket)."""

    def __init__(
        self,
        rate: float,
        burst: int,
        *,
        max_keys: int = 100_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if rate < 0 or burst < 1:
            raise ValueError(f"rate must be >= 0 and burst >= 1, got {rate!r}, {burst!r}")
        self.rate = rate
        self.burst = float(burst)
        self.max_keys = max_keys
        self.clock = clock
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()

    def take(self, key: str) -> float:
        """Take one call from ``key``'s bucket: 0.0 if allowed, else the seconds until one
        is free again (nothing taken)."""
        if self.rate == 0:
            return 0.0
        now = self.clock()
        tokens, then = self._buckets.pop(key, (self.burst, now))
        tokens = min(self.burst, tokens + (now - then) * self.rate)
        wait = 0.0
        if tokens >= 1.0:
            tokens -= 1.0
        else:
            wait = (1.0 - tokens) / self.rate
        self._buckets[key] = (tokens, now)
        if len(self._buckets) > self.max_keys:
            self._buckets.popitem(last=False)
        return wait


@dataclass
class Access:
    """A server's rules and how it checks tokens (None: plain text, nothing checked)."""

    rules: Mapping[str, Rule]
    verifier: Verifier | None
    open_services: tuple[str, ...] = field(default=OPEN_SERVICES)
    only_job: str | None = None
    """A server that serves one job only (a pod's agent): a job token for any other job is
    refused for every method."""
    limiter: RateLimiter | None = None
    """Calls per identity (None: no limit)."""
    service: str = "this service"
    """Named in a rate-limit refusal."""

    def authorize(self, method: str, context: Any) -> Caller:
        """The verified caller of ``method``; raises Unauthenticated (a token that does not
        verify) or PermissionDenied (the caller is not one the method's rule admits)."""
        if self.verifier is None:
            return UNAUTHENTICATED
        peers = peer_identities(context)
        service = method.lstrip("/").partition("/")[0]
        if service in self.open_services:
            return Caller(peers)
        try:
            token = bearer(context.invocation_metadata())
        except TokenError as error:
            raise Unauthenticated(str(error)) from None
        user: UserIdentity | None = None
        job: JobIdentity | None = None
        if token is not None:
            try:
                identity = self.verifier.verify(token)
            except TokenError as error:
                raise Unauthenticated(f"authorization: the bearer token {error}") from None
            if isinstance(identity, UserIdentity):
                user = identity
            else:
                job = identity
                if self.only_job is not None and job.job_id != self.only_job:
                    raise PermissionDenied(
                        f"this server serves job {self.only_job!r} only; the token is for "
                        f"job {job.job_id!r}"
                    )
        caller = Caller(peers, user, job)
        found = self.rules.get(method)
        if found is None:
            raise PermissionDenied(f"{method} has no access rule: it is closed to every caller")
        if (
            (user is not None and (found.users or (found.admins and user.admin)))
            or (job is not None and found.jobs)
            or caller.is_service(*found.services)
        ):
            if self.limiter is not None:
                wait = self.limiter.take(caller.key())
                if wait > 0:
                    raise ResourceExhausted(
                        f"rate limit: {caller.key()} calls {self.service} more than "
                        f"{self.limiter.rate:g} times a second (burst {self.limiter.burst:g}); "
                        f"retry in {max(wait, 0.001):.3f} s"
                    )
            return caller
        if token is None and (found.users or found.admins or found.jobs) and not found.services:
            raise Unauthenticated(
                f"{method} needs {found.describe()}: send 'authorization: Bearer <token>' "
                "(the CLI reads STRIDE_TOKEN, STRIDE_TOKEN_FILE or its state folder's token)"
            )
        raise PermissionDenied(f"{method} needs {found.describe()}; this is {caller.describe()}")
