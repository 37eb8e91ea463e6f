"""Ending a pod's NATS session when its job token stops being valid.

NATS checks a client's credentials when it connects, not after: a pod's user from the auth
callout (:mod:`.callout`) lived as long as its connection, so a job that had ended (its job
tokens revoked) could still publish and subscribe on its open connection. Two things end
sessions now:

- every user the callout issues expires (:data:`~.callout.SESSION_SECONDS`, never past its
  job token); the agent reconnects and gets a new one while its token is valid;
- the pod watcher checks the token of every session it issued again every
  :data:`CHECK_SECONDS`, against the same verifier (and so the same revocations) as the
  callout, and asks NATS to disconnect the sessions whose token no longer passes
  (``$SYS.REQ.SERVER.<id>.KICK``, NATS 2.10+). The kicked client reconnects at once, and
  the callout refuses it, naming why.

Asking NATS which connection a user holds and disconnecting it are system-account requests:
the pod watcher has a second connection as the system account's one user (its nkey seed,
``nats-system.nk``, made by ``stride certs init``; ``stride.bus.permissions.server_config``
puts its public key in the configuration). Without it, sessions still end when their user
expires, and the pod watcher says so at start.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import structlog
from nats.errors import Error as NatsError
from nats.errors import TimeoutError as NatsTimeoutError

from stride.bus.callout import Callout, Session
from stride.runtime.tokens import TokenError

log = structlog.get_logger(__name__)

CHECK_SECONDS = 1.0
"""How often the sessions' tokens are checked again: a revocation reaches every server
within milliseconds, so a revoked session ends within about this."""
REPLY_SECONDS = 2.0
"""How long to wait for NATS's answer to a system request."""
GATHER_SECONDS = 0.25
"""After the first server answers a CONNZ ping, how long to wait for the rest of a cluster."""


class SessionGuard:
    """Disconnects the NATS sessions the callout issued whose token is no longer valid."""

    def __init__(self, system: Any, callout: Callout) -> None:
        self.system = system
        """A NATS connection as the system account's user."""
        self.callout = callout

    def ended(self) -> list[Session]:
        """The sessions whose token no longer verifies (revoked, or expired)."""
        found = []
        now = self.callout.now()
        for session in list(self.callout.sessions.values()):
            if session.expires < now:  # NATS ended it itself
                self.callout.sessions.pop(session.user_nkey, None)
                continue
            try:
                self.callout.verify(session.token)
            except TokenError as error:
                log.info(
                    "nats session ended",
                    job_id=session.job.job_id,
                    pod=session.job.pod,
                    why=str(error),
                )
                found.append(session)
        return found

    async def check(self) -> int:
        """Disconnect every ended session; how many connections were disconnected."""
        kicked = 0
        for session in self.ended():
            for server, cid in await self._connections(session.user_name):
                await self.system.request(
                    f"$SYS.REQ.SERVER.{server}.KICK",
                    json.dumps({"cid": cid}).encode(),
                    timeout=REPLY_SECONDS,
                )
                kicked += 1
            self.callout.sessions.pop(session.user_nkey, None)
        return kicked

    async def _connections(self, user: str) -> list[tuple[str, int]]:
        """(server id, connection id) of every connection of the NATS user named ``user``,
        on every server that answers. (A pod's connections share its user's name: a pod
        whose other token is still valid is back in at once, with it.)"""
        inbox = self.system.new_inbox()
        replies = await self.system.subscribe(inbox)
        try:
            await self.system.publish(
                "$SYS.REQ.SERVER.PING.CONNZ",
                json.dumps({"user": user, "auth": True}).encode(),
                reply=inbox,
            )
            found: list[tuple[str, int]] = []
            timeout = REPLY_SECONDS
            while True:
                try:
                    message = await replies.next_msg(timeout=timeout)
                except (NatsTimeoutError, TimeoutError):
                    return found
                answer = json.loads(message.data)
                server = answer.get("server", {}).get("id", "")
                for connection in (answer.get("data") or {}).get("connections") or []:
                    if connection.get("authorized_user") == user:
                        found.append((server, int(connection["cid"])))
                timeout = GATHER_SECONDS
        finally:
            await replies.unsubscribe()

    async def run(self, stop: asyncio.Event, interval: float = CHECK_SECONDS) -> None:
        """Check every ``interval`` seconds until ``stop`` is set; a NATS that does not
        answer is tried again at the next check."""
        while not stop.is_set():
            try:
                await self.check()
            except (NatsError, OSError, ValueError, KeyError) as error:
                log.warning("nats sessions not checked", error=f"{type(error).__name__}: {error}")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=interval)
