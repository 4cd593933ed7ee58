"""One error tree: every error of ours derives from `SessionError`.

Each class also derives from the built-in base the seed raised in the same
situation, so code written against the seed (``except KeyError``, ``except
ValueError``, ``except RuntimeError``) keeps catching what it caught before.

No message built here ever contains a resume token: errors carry session ids,
sequences and sizes, nothing secret.
"""

from __future__ import annotations

from typing import Literal

__all__ = [
    "ActivationAbortedError",
    "DuplicateSessionError",
    "GapReason",
    "InvalidInputError",
    "InvalidPayloadError",
    "InvalidResumeTokenError",
    "InvalidSequenceError",
    "InvalidSessionIdError",
    "JournalGapError",
    "JournalOverflowError",
    "RegistryClosedError",
    "SendTimeoutError",
    "SessionCrashedError",
    "SessionError",
    "SessionFailedError",
    "SessionReplacedError",
    "StoreError",
    "StoreOutcomeUnknownError",
    "StoreUnavailableError",
    "TokenConflictError",
    "UnknownSessionError",
]

GapReason = Literal["ttl", "acknowledged", "overflow", "store_lost"]
"""What dropped the first missing event of a `JournalGapError`: its
TTL ran out, the client acknowledged it, the journal overflowed, or the
session store lost it (``store_lost``: a session taken over from a store
that lost its last writes, e.g. a Redis replica promoted before they reached
it, asked for a replay beyond the head it holds)."""


class SessionError(Exception):
    """Base of every error this project raises on purpose."""


class UnknownSessionError(SessionError, KeyError):
    """The registry holds no session under this id (the seed's ``KeyError``)."""

    def __init__(self, session_id: str) -> None:
        super().__init__(f"unknown duplex attachment session: {session_id}")
        self.session_id = session_id

    def __str__(self) -> str:
        # KeyError.__str__ would repr() the message and wrap it in quotes.
        return str(self.args[0])


class DuplicateSessionError(SessionError, ValueError):
    """``create`` was given a session id that already exists."""

    def __init__(self, session_id: str) -> None:
        super().__init__(f"duplex attachment session already exists: {session_id}")
        self.session_id = session_id


class InvalidResumeTokenError(SessionError, RuntimeError):
    """The presented token is neither the current one nor a live recovery token."""


class JournalOverflowError(SessionError, RuntimeError):
    """The journal hit its byte (or event) cap; overflow is sticky."""


class JournalGapError(SessionError, RuntimeError):
    """A replay cannot be complete: events after ``requested`` are gone.

    ``first_retained`` is the oldest sequence still held (``head + 1`` when the
    journal is empty), ``head`` the newest sequence issued, and ``reason`` what
    dropped the first missing event: its TTL ran out, the client acknowledged
    it, the journal overflowed and stopped recording, or the session store
    lost it (``store_lost``: ``requested`` is beyond the ``head`` of a journal
    loaded from the store).
    """

    def __init__(
        self,
        message: str,
        *,
        requested: int,
        first_retained: int,
        head: int,
        reason: GapReason,
    ) -> None:
        super().__init__(message)
        self.requested = requested
        self.first_retained = first_retained
        self.head = head
        self.reason: GapReason = reason


class InvalidInputError(SessionError, TypeError, ValueError):
    """Rejected input. Both ``TypeError`` and ``ValueError``: the seed raised either."""


class InvalidPayloadError(InvalidInputError):
    """A payload that cannot be journaled or sent (strict mode: not JSON)."""


class InvalidSequenceError(InvalidInputError):
    """A sequence that is negative, newer than the journal head, or not an int.

    (A replay asked beyond the head of a journal loaded from the store is a
    `JournalGapError` with reason ``store_lost`` instead.)
    """


class InvalidSessionIdError(InvalidInputError):
    """A session id that is not a non-empty string (strict mode)."""


class SessionCrashedError(SessionError):
    """The session crashed while handling this call; the call left no trace.

    Retryable: the session was restored to its state before the call and
    restarted (or, past its restart budget, closed). The original exception
    is the ``__cause__``.
    """

    retryable = True


class SessionFailedError(SessionError):
    """The session was closed by its supervisor while this call waited on it."""


class SendTimeoutError(SessionError, TimeoutError):
    """A transport's send ran past the registry's ``send_timeout_s``.

    The library then gives up on that transport: it stops the attachment's
    outbox and calls its ``close("send_timeout")``; the owner still detaches.
    """


class ActivationAbortedError(SessionError):
    """A resume's caller was cancelled before its activation was delivered;
    the resume was rolled back like a failed activation."""


class RegistryClosedError(SessionError):
    """The registry was shut down before (or while) handling this call."""


class StoreError(SessionError):
    """The session store refused or failed a write; the call left no trace."""


class StoreUnavailableError(StoreError, ConnectionError):
    """The session store could not be reached (Redis down, a timeout).

    The transition was undone in memory: retry once the store is back.
    """


class StoreOutcomeUnknownError(StoreUnavailableError):
    """A write reached the store (or may have) but its answer was lost: a
    connection that broke or timed out after the request was sent.

    `RedisStore.commit` may raise it to a program of its own; a registry's
    session never passes it on: it fences the write and reads whether it was
    applied before it answers anyone (`actors._store_binding.StoreBinding.settle`).
    """


class SessionReplacedError(StoreError, UnknownSessionError):
    """Another owner took this session over (its lease has a newer epoch, or
    this owner's lease ran out): this process no longer serves it."""


class TokenConflictError(StoreError, InvalidResumeTokenError):
    """Another resume rotated the token first (the store's compare-and-set)."""
