"""Letting clients in: who they are, then opening and resuming sessions for the gateway.

The ``authenticate`` hook names a connection's identity (`Admission.identify`).

A ``session.open`` passes the shared secret and the session caps, which are
reserved before the awaited create so concurrent opens cannot pass them; a
``session.resume`` follows the seed's flow (``authenticate_resume``, then
``begin_resume``/``resume``/``end_resume``) and must come from the identity
that opened the session. A session's place is given back when it ends
(`Admission.release`, from the registry's observer).

Throttles never refuse a right credential: the token (one SHA-256) or the
secret is checked first, and only a wrong one is answered ``*_throttled``
once its client address, or (for resumes) its session, failed too often
within the window. An ``unknown_session`` is no failure: after a restart
every client resumes a session the server no longer knows.
"""

from __future__ import annotations

import contextlib
import hmac
import secrets
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

import anyio
import anyio.to_thread

from actors._credential import ResumeToken
from actors._errors import (
    InvalidResumeTokenError,
    InvalidSequenceError,
    JournalGapError,
    SessionError,
    StoreUnavailableError,
)
from actors._store import identity_fingerprint
from supervisor.doors._door import AsyncSessionRegistry
from supervisor.gateway._auth import Authenticate, Handshake, Unauthorized
from supervisor.gateway._config import GatewayConfig, GatewayCounters
from supervisor.gateway._limits import AddressCounter
from supervisor.gateway._protocol import OpenSession, ProtocolError, ResumeSession
from supervisor.gateway._throttles import Throttles

__all__ = ["Admission", "Close", "Send", "UntilStored", "store_unavailable"]

Send = Callable[[Mapping[str, object]], Awaitable[None]]
Close = Callable[[str], Awaitable[None]]
#: Runs a store call until the store answers (`Departures.until_stored`).
UntilStored = Callable[[str, Callable[[], Awaitable[object]]], Awaitable[None]]

#: A ``journal_gap`` whose reason is ``store_lost``: the bundled clients end
#: with `FatalCloseError` and this message, so the application sees why.
_STORE_LOST = (
    "the session store lost the events after its head (a failover): resume again "
    "from the same sequence to go on without them, or open a new session"
)


def store_unavailable() -> ProtocolError:
    """An open or resume the session store could not take: nothing changed, the
    client may try again (close 4503, as ``overloaded``)."""
    return ProtocolError("store_unavailable", "the session store is unreachable; try again")


@dataclass(slots=True)
class _Activation:
    """The ``session.resumed`` frame; a ReplayCountingFactory."""

    session_id: str
    last_client_seq: int

    def __call__(self, token: ResumeToken, generation: int) -> dict[str, object]:
        return self.activation_payload(token, generation, -1)

    def activation_payload(
        self, token: ResumeToken, generation: int, replayed: int
    ) -> dict[str, object]:
        return {
            "type": "session.resumed",
            "session_id": self.session_id,
            "resume_token": token.plaintext,
            "attachment_generation": generation,
            "replayed": replayed,
            "last_client_seq": self.last_client_seq,
        }


class Admission:
    """The gateway's door for sessions: secrets, caps, throttles."""

    def __init__(
        self,
        config: GatewayConfig,
        registry: AsyncSessionRegistry,
        counters: GatewayCounters,
        until_stored: UntilStored,
        *,
        authenticate: Authenticate | None = None,
    ) -> None:
        self.config = config
        self.registry = registry
        self.counters = counters
        self._until_stored = until_stored
        self._authenticate = authenticate
        self.throttles = Throttles(config)
        # Counted from before the awaited create (a reservation) to the
        # session's end, so concurrent opens cannot pass the caps.
        self.sessions = AddressCounter(config.max_sessions, config.max_sessions_per_address)
        self._session_owner: dict[str, str] = {}
        self._identity: dict[str, object] = {}

    def throttled_addresses(self) -> int:
        """Keys (addresses, sessions) the failure throttles hold now (bounded, expiring)."""
        return len(self.throttles)

    def release(self, session_id: str) -> None:
        """The session ended: its place is free (idempotent)."""
        self._identity.pop(session_id, None)
        owner = self._session_owner.pop(session_id, None)
        if owner is not None:
            self.sessions.release(owner)

    async def identify(self, handshake: Handshake) -> object:
        """The ``authenticate`` hook's identity for ``handshake`` (``None``
        without a hook); `ProtocolError` if it refuses."""
        if self._authenticate is None:
            return None
        try:
            identity = self._authenticate(handshake)
            if isinstance(identity, Awaitable):
                identity = await identity
        except Unauthorized:
            identity = None
        if identity is None:
            self.refused_credential(handshake.client, "not authenticated")
        return identity

    def check_secret(self, address: str, presented: str | None) -> None:
        """The shared secret of ``session.open`` (if the gateway has one)."""
        expected = self.config.shared_secret
        if expected is None:
            return
        if presented is not None and hmac.compare_digest(presented.encode(), expected.encode()):
            return
        self.refused_credential(address, "session.open needs the gateway's secret")

    def refused_credential(self, address: str, message: str) -> None:
        """A wrong secret or identity from ``address``: counted, then refused."""
        raise self.throttles.failed_credential(address, message, anyio.current_time())

    async def open(
        self,
        send: Send,
        close: Close,
        address: str,
        frame: OpenSession,
        identity: object = None,
    ) -> tuple[str, int]:
        """Check the secret and the caps, create the session, send ``session.created``.
        The caller starts the engine's work on success."""
        self.check_secret(address, frame.secret)
        refusal = self.sessions.refusal(address)
        if refusal == "total":
            raise ProtocolError("overloaded", "the gateway holds its maximum of sessions")
        if refusal == "address":
            raise ProtocolError("too_many_sessions", "this address holds its maximum of sessions")
        session_id = "sess_" + secrets.token_urlsafe(12)
        # Reserved before the awaited create: concurrent opens see it.
        self.sessions.take(address)
        self._session_owner[session_id] = address
        self._identity[session_id] = identity
        try:
            created = await self.registry.create(session_id, send=send, close=close)
        except BaseException:
            self.release(session_id)
            raise
        created_frame = {
            "type": "session.created",
            "session_id": session_id,
            "resume_token": created.resume_token.plaintext,
            "attachment_generation": created.attachment_generation,
            "last_client_seq": 0,
        }
        try:
            await self._bind_identity(session_id, identity)
            await self.registry.send_event(session_id, created_frame, journal=False)
        except BaseException:
            # The token never reached anyone: nobody could resume this session.
            # Closed as a leave is (a crash or an unreachable store is tried
            # again), or it would stay routed to a socket nobody holds.
            with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
                await self._until_stored("close", lambda: self.registry.close(session_id))
            self.release(session_id)
            raise
        self.counters.sessions_opened += 1
        return session_id, created.attachment_generation

    async def _bind_identity(self, session_id: str, identity: object) -> None:
        """With a session store: keep the opener's identity for other processes."""
        store, fingerprint = self.registry.system.store, identity_fingerprint(identity)
        if store is not None and fingerprint is not None:
            await anyio.to_thread.run_sync(store.bind_identity, session_id, fingerprint)

    async def _same_identity(self, session_id: str, identity: object) -> bool:
        """A session this process did not open: is ``identity`` the one bound to
        it in the store (true when nothing is bound, or without a store)?"""
        store = self.registry.system.store
        if store is None:
            return True
        bound = await anyio.to_thread.run_sync(store.bound_identity, session_id)
        return bound is None or bound == identity_fingerprint(identity)

    def _failed_resume(self, address: str, session_id: str, error: ProtocolError) -> ProtocolError:
        return self.throttles.failed_resume(address, session_id, error, anyio.current_time())

    def _not_its_identity(self, address: str, session_id: str) -> ProtocolError:
        error = ProtocolError("unauthorized", "this session belongs to another identity")
        return self._failed_resume(address, session_id, error)

    async def _authenticate_resume(self, address: str, frame: ResumeSession) -> None:
        """The token, then the sequence (the seed's order), as protocol errors."""
        session_id = frame.session_id
        try:
            await self.registry.authenticate_resume(
                session_id,
                resume_token=frame.resume_token,
                last_received_server_event_seq=frame.last_received_server_event_seq,
            )
        except InvalidResumeTokenError:
            raise self._failed_resume(
                address,
                session_id,
                ProtocolError("invalid_resume_token", "the resume token is not valid"),
            ) from None
        except KeyError:
            raise ProtocolError("unknown_session", "no such session") from None
        except JournalGapError as gap:
            reasons = self.counters.gap_reasons
            reasons[gap.reason] = reasons.get(gap.reason, 0) + 1
            raise ProtocolError(
                "journal_gap",
                _STORE_LOST
                if gap.reason == "store_lost"
                else "events after that sequence are gone",
                requested=gap.requested,
                first_retained=gap.first_retained,
                head=gap.head,
                reason=gap.reason,
            ) from None
        except InvalidSequenceError as exc:
            raise ProtocolError("bad_request", str(exc)) from None

    async def resume(
        self,
        send: Send,
        close: Close,
        address: str,
        frame: ResumeSession,
        identity: object = None,
        *,
        last_client_seq: int = 0,
    ) -> tuple[str, int]:
        """The seed's resume flow; the replaced socket, if any, is closed ``replaced``.
        ``session.resumed`` says ``last_client_seq``."""
        session_id = frame.session_id
        if session_id not in self._identity and not await self._same_identity(session_id, identity):
            # Held by another process, opened by another identity: refused
            # before the token is tried, so nothing is taken over.
            raise self._not_its_identity(address, session_id)
        await self._authenticate_resume(address, frame)
        if session_id in self._identity and self._identity[session_id] != identity:
            # The token is right, the client is not the session's: no resume.
            raise self._not_its_identity(address, session_id)
        await self.registry.begin_resume(session_id)
        try:
            result = await self.registry.resume(
                session_id,
                resume_token=frame.resume_token,
                last_received_server_event_seq=frame.last_received_server_event_seq,
                send=send,
                close=close,
                activation_payload_factory=_Activation(session_id, last_client_seq),
            )
        except InvalidResumeTokenError:
            # Lost a race with another resume of the same token.
            raise self._failed_resume(
                address,
                session_id,
                ProtocolError("invalid_resume_token", "the resume token is not valid"),
            ) from None
        except StoreUnavailableError:
            raise store_unavailable() from None
        except (KeyError, SessionError) as exc:
            raise ProtocolError("session_failed", type(exc).__name__) from None
        finally:
            with anyio.CancelScope(shield=True):
                await self.registry.end_resume(session_id)
        self.counters.resumes += 1
        if session_id not in self._session_owner:
            self._identity[session_id] = identity  # taken over: checked here from now on
        if result.replaced_attachment is not None:
            self.counters.replaced += 1
            with anyio.move_on_after(2):
                await result.replaced_attachment.close("replaced")
        return session_id, result.attachment_generation
