"""The job API (``stride.api.admission.v1.AdmissionService``) over :class:`Submissions`.

Who may call (:data:`ACCESS`), by the caller's verified user token:

- any user submits jobs, and sees, lists and cancels **their own**; a job's ``user`` is the
  token's, never the spec's (a spec naming someone else is PERMISSION_DENIED), except
  that an admin may submit on another user's behalf by naming them in ``spec.user`` (as
  ``kubectl --as``; replays and load generators submit many users' jobs this way);
- a user reads the quotas that bind them; admins see and manage every job and quota, and
  drive a stepped replay clock.

A user's submissions are limited by who they are (issue 37): a rate per user
(:class:`~stride.runtime.auth.RateLimiter` keyed by the token's user, RESOURCE_EXHAUSTED
saying when to retry), a default cap on their active jobs, and the spec fields only an
admin or a granting quota may set (:mod:`stride.admission.domain.limits`). An admin is
trusted with all of it.

In plain text (``STRIDE_INSECURE=1``) nothing is verified: the spec's ``user`` stands, a
spec without one is :data:`ANONYMOUS`'s, and every caller is trusted as an admin is.
"""

from __future__ import annotations

import math
import re
import unicodedata
from datetime import UTC
from typing import Any

import grpc

from stride.admission.adapters.convert import timestamp
from stride.admission.domain.limits import Submitter
from stride.admission.domain.quotas import Quota, make_quota
from stride.admission.share_requests import ShareRequests
from stride.admission.usecases import ExactMoment, StoredJob, Submissions
from stride.api.admission.v1 import admission_service_pb2 as pb
from stride.api.admission.v1 import admission_service_pb2_grpc as pb_grpc
from stride.events.v1 import job_pb2
from stride.runtime import auth
from stride.runtime.errors import (
    InvalidArgument,
    PermissionDenied,
    ResourceExhausted,
    Unavailable,
)
from stride.runtime.tokens import NAME_LIMIT, TokenError, check_claim_name
from stride.vocabulary import InvalidWord, check_job_id, check_name, echo
from stride.vocabulary.jobspec import MAX_DEADLINE_AHEAD, PRIORITY_BY_NUMBER, Priority
from stride.vocabulary.tenants import KUBERNETES_TENANT_PREFIX, tenant_namespace

Context = grpc.aio.ServicerContext[Any, Any]


def job_to_proto(job: StoredJob) -> pb.Job:
    """The API form of a stored job."""
    message = pb.Job(
        job_id=job.job_id,
        spec=job.spec,
        state=pb.JobState.Value(f"JOB_STATE_{job.state}"),
        submitted_at=timestamp(job.submitted_at),
    )
    if job.decision is not None:
        message.decision.CopyFrom(job.decision)
    if job.share is not None:
        message.share.CopyFrom(job.share)
    return message


def _user(value: str) -> str | None:
    """The ListJobs filter: empty for everyone, else a user name by the job spec's rule."""
    if not value:
        return None
    try:
        return check_name(value, "user")
    except InvalidWord as error:
        raise InvalidArgument(error.field, error.problem) from None


def _request_id(value: str) -> str:
    """An idempotency key is opaque, but it is stored: no control characters (a NUL cannot
    be stored in PostgreSQL text), as for the spec's own text fields."""
    if any(unicodedata.category(character) == "Cc" for character in value):
        raise InvalidArgument("request_id", f"{echo(value)} contains a control character")
    return value


def quota_status(quota: Quota, submissions: int, active: int) -> pb.QuotaStatus:
    """The API form of a quota and its use."""
    return pb.QuotaStatus(
        quota=pb.Quota(
            scope=quota.scope,
            max_active_jobs=quota.max_active_jobs,
            max_submissions=quota.max_submissions,
            window_seconds=quota.window_seconds,
            members=list(quota.members),
            source=quota.source,
            max_priority=_priority_number(quota.max_priority),
            allow_simulated=quota.allow_simulated,
        ),
        use=pb.QuotaUse(active_jobs=active, submissions=submissions),
    )


def _priority_number(word: Priority | None) -> job_pb2.Priority.ValueType:
    """A quota's ``max_priority`` on the wire (None: unspecified)."""
    if word is None:
        return job_pb2.PRIORITY_UNSPECIFIED
    return job_pb2.Priority.Value(f"PRIORITY_{word.name}")


def _priority_word(number: int) -> str:
    """A quota's ``max_priority`` as the word the domain checks ("" for unspecified; an
    unknown number is kept as digits, so the check names it)."""
    if not number:
        return ""
    word = PRIORITY_BY_NUMBER.get(number)
    return word.value if word is not None else str(number)


ANONYMOUS = "anonymous"
"""Whose a job without a ``user`` is when nobody is authenticated (plain text)."""
_USERS = auth.rule(users=True)
_ADMINS = auth.rule(admins=True)
_USERS_OR_OPERATOR = auth.rule(auth.OPERATOR, users=True)
"""Users, and the pod watcher for Kubernetes namespaces' jobs (``StrideJob``)."""
_OPTIMIZER = auth.rule("optimizer")
"""The optimizer's verified identity alone: no user or admin asks for a share this way."""
SERVICE = pb.DESCRIPTOR.services_by_name["AdmissionService"].full_name
CLOCK_SERVICE = pb.DESCRIPTOR.services_by_name["ReplayClockService"].full_name
ACCESS = {
    **auth.rules(
        SERVICE,
        {
            "SubmitJob": _USERS_OR_OPERATOR,
            "GetJob": _USERS_OR_OPERATOR,
            "ListJobs": _USERS,
            "CancelJob": _USERS_OR_OPERATOR,
            "SetQuota": _ADMINS,
            "GetQuota": _USERS,
            "ListQuotas": _USERS,
            "DeleteQuota": _ADMINS,
            "RevokeTokens": _ADMINS,
            "RequestShare": _OPTIMIZER,
        },
    ),
    **auth.rules(CLOCK_SERVICE, {"Advance": _ADMINS}),
}


def _not_yours(what: str, caller: auth.Caller) -> PermissionDenied:
    return PermissionDenied(f"{what}; {caller.describe()} sees and acts on their own only")


class AdmissionApi(pb_grpc.AdmissionServiceServicer):
    """gRPC servicer; errors are raised as domain errors and mapped by the server."""

    def __init__(
        self,
        submissions: Submissions,
        rate: auth.RateLimiter | None = None,
        requests: ShareRequests | None = None,
    ) -> None:
        self.submissions = submissions
        self.requests = requests
        """Decides the optimizer's share requests (None: refused as unavailable)."""
        self.rate = rate
        """Submissions per user a second (None: not limited)."""

    def _throttle(self, user: str) -> None:
        """Take one submission from ``user``'s bucket, or refuse saying when to retry."""
        if self.rate is None:
            return
        wait = self.rate.take(user)
        if wait > 0:
            raise ResourceExhausted(
                f"submission rate: user {user!r} submits more than {self.rate.rate:g} jobs a "
                f"second (burst {self.rate.burst:g}, STRIDE_ADMISSION_SUBMIT_RATE_PER_SECOND "
                f"and _BURST); none is left now: retry in {max(wait, 0.001):.3f} s"
            )

    async def _own_job(self, job_id: str) -> StoredJob:
        """The job, if the caller may see it (its submitter, or an admin)."""
        job = await self.submissions.get(check_job_id(job_id, raise_as=InvalidArgument))
        auth.require_owner(job_id, job.spec.user, "not found")
        return job

    async def SubmitJob(
        self, request: pb.SubmitJobRequest, context: Context
    ) -> pb.SubmitJobResponse:
        if not request.HasField("spec"):
            raise InvalidArgument("spec", "is required")
        spec = request.spec
        caller = auth.current()
        if not caller.authenticated and not spec.user:
            spec.user = ANONYMOUS
        if caller.is_service(auth.OPERATOR) and tenant_namespace(spec.user) is None:
            raise PermissionDenied(
                f"spec.user: {echo(spec.user)} is not a Kubernetes namespace's user "
                f"({KUBERNETES_TENANT_PREFIX}<namespace>): the pod watcher submits StrideJobs "
                "only, as their namespace"
            )
        if caller.user is not None and not (caller.user.admin and spec.user):
            if spec.user and spec.user != caller.user.user:
                raise PermissionDenied(
                    f"spec.user: {echo(spec.user)} is not the submitter: a job's user comes "
                    f"from the token ({caller.user.user!r}); leave spec.user empty"
                )
            spec.user = caller.user.user
        submitter = Submitter(spec.user, trusted=caller.admin)
        if not submitter.trusted:
            self._throttle(spec.user)
        job = await self.submissions.submit(spec, _request_id(request.request_id), submitter)
        return pb.SubmitJobResponse(job=job_to_proto(job))

    async def GetJob(self, request: pb.GetJobRequest, context: Context) -> pb.GetJobResponse:
        return pb.GetJobResponse(job=job_to_proto(await self._own_job(request.job_id)))

    async def ListJobs(self, request: pb.ListJobsRequest, context: Context) -> pb.ListJobsResponse:
        wanted = _user(request.user) or ""
        caller = auth.current()
        if not caller.admin:
            assert caller.user is not None  # the rule admits users only
            if wanted and wanted != caller.user.user:
                raise _not_yours(f"user: {wanted!r} is another user", caller)
            wanted = caller.user.user
        jobs = await self.submissions.list(wanted, request.page_size)
        return pb.ListJobsResponse(jobs=[job_to_proto(job) for job in jobs])

    async def CancelJob(
        self, request: pb.CancelJobRequest, context: Context
    ) -> pb.CancelJobResponse:
        job = await self._own_job(request.job_id)
        job = await self.submissions.cancel(job.job_id)
        return pb.CancelJobResponse(job=job_to_proto(job))

    async def SetQuota(self, request: pb.SetQuotaRequest, context: Context) -> pb.SetQuotaResponse:
        if not request.HasField("quota"):
            raise InvalidArgument("quota", "is required")
        given = request.quota
        if given.source and given.source != "api":
            raise InvalidArgument("quota.source", "is set by the service; leave it empty")
        quota = make_quota(
            given.scope,
            given.max_active_jobs,
            given.max_submissions,
            given.window_seconds,
            list(given.members),
            "api",
            max_priority=_priority_word(given.max_priority),
            allow_simulated=given.allow_simulated,
        )
        return pb.SetQuotaResponse(status=quota_status(*await self.submissions.set_quota(quota)))

    async def GetQuota(self, request: pb.GetQuotaRequest, context: Context) -> pb.GetQuotaResponse:
        found = await self.submissions.quota(request.scope)
        caller = auth.current()
        if not _binds_caller(found[0], caller):
            raise _not_yours(f"scope: {request.scope!r} does not bind you", caller)
        return pb.GetQuotaResponse(status=quota_status(*found))

    async def ListQuotas(
        self, request: pb.ListQuotasRequest, context: Context
    ) -> pb.ListQuotasResponse:
        caller = auth.current()
        listed = [
            item for item in await self.submissions.quotas() if _binds_caller(item[0], caller)
        ]
        return pb.ListQuotasResponse(quotas=[quota_status(*item) for item in listed])

    async def DeleteQuota(
        self, request: pb.DeleteQuotaRequest, context: Context
    ) -> pb.DeleteQuotaResponse:
        await self.submissions.delete_quota(request.scope)
        return pb.DeleteQuotaResponse()

    async def RevokeTokens(
        self, request: pb.RevokeTokensRequest, context: Context
    ) -> pb.RevokeTokensResponse:
        if bool(request.token_id) == bool(request.user):
            raise InvalidArgument("token_id", "give exactly one of token_id and user")
        if request.token_id and not TOKEN_ID.fullmatch(request.token_id):
            raise InvalidArgument(
                "token_id",
                f"{echo(request.token_id)} is not a token id (32 lowercase hexadecimal "
                "characters: `stride token create` prints it)",
            )
        if request.user:
            try:
                check_claim_name(request.user, "user")
            except TokenError:
                raise InvalidArgument(
                    "user", f"must be 1 to {NAME_LIMIT} characters without control characters"
                ) from None
        if len(request.reason) > MAX_REASON_LENGTH:
            raise InvalidArgument("reason", f"must be at most {MAX_REASON_LENGTH} characters")
        caller = auth.current()
        revocation = await self.submissions.revoke_tokens(
            token_id=request.token_id,
            user=request.user,
            reason=request.reason,
            revoked_by=caller.user.user if caller.user is not None else caller.describe(),
        )
        return pb.RevokeTokensResponse(revocation=revocation)

    async def RequestShare(
        self, request: pb.RequestShareRequest, context: Context
    ) -> pb.RequestShareResponse:
        if self.requests is None:
            raise Unavailable("this admission service takes no share requests")
        return await self.requests.request(request)


TOKEN_ID = re.compile(r"[0-9a-f]{32}")
"""A token's id: the ``jti`` :class:`stride.runtime.tokens.Signer` stamps (a UUID's hex)."""
MAX_REASON_LENGTH = 256


def _binds_caller(quota: Quota, caller: auth.Caller) -> bool:
    """Whether a user may read ``quota``: it binds them (admins read every quota)."""
    return caller.admin or (caller.user is not None and quota.binds(caller.user.user))


LATEST_CLOCK_SECONDS = 253_402_300_799 - int(MAX_DEADLINE_AHEAD.total_seconds())
"""The last second of year 9999, less the furthest a deadline may lie ahead of the clock."""


class ReplayClockApi(pb_grpc.ReplayClockServiceServicer):
    """The stepped replay clock (served only with ``replay_stepped``, on loopback)."""

    def __init__(self, submissions: Submissions) -> None:
        self.submissions = submissions

    async def Advance(self, request: pb.AdvanceRequest, context: Context) -> pb.AdvanceResponse:
        if not request.HasField("to"):
            raise InvalidArgument("to", "is required")
        stamp = request.to
        if not 0 <= stamp.nanos < 1_000_000_000:
            raise InvalidArgument("to", f"nanos must be in 0..999,999,999, got {stamp.nanos}")
        if not 0 <= stamp.seconds <= LATEST_CLOCK_SECONDS:
            raise InvalidArgument(
                "to",
                f"{stamp.seconds} seconds after 1970 is not a time a replay clock reaches "
                "(1970 to 9988, so deadlines ten years on are still times)",
            )
        target = stamp.ToDatetime(tzinfo=UTC).timestamp()
        exact = request.to_unix_seconds
        if exact:
            if not math.isfinite(exact) or abs(exact - target) > 1e-3:
                raise InvalidArgument(
                    "to_unix_seconds",
                    f"{exact!r} is not the instant `to` names ({target!r}, to a millisecond)",
                )
            target = exact
        now, upcoming, rounds = await self.submissions.advance(target, request.inclusive)
        reply = pb.AdvanceResponse(now=timestamp(ExactMoment.of(now)), rounds=rounds)
        if upcoming is not None:
            reply.next_round.CopyFrom(timestamp(ExactMoment.of(upcoming)))
            reply.next_round_unix_seconds = upcoming
        return reply
