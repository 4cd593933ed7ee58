"""The state machine's vocabulary: its configuration, failpoints and outcomes.

Kept apart from `actors._state` so that module holds the machine itself.
Pure: no I/O, no threads, no event loop.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from actors._commands import Effect, TransportAttachment
from actors._errors import InvalidInputError, InvalidSessionIdError, SessionError
from actors._fields import SessionFields
from actors._journal import JournalSnapshot
from actors._quick_init import quick_init

__all__ = [
    "FAILPOINTS",
    "LIFECYCLE_FAILPOINTS",
    "NO_FAILPOINTS",
    "Failpoints",
    "SessionConfig",
    "StateSnapshot",
    "Transition",
    "check_generation",
    "check_session_id",
]

#: Every failpoint a transition passes, ``"<command>.<step>"``.
FAILPOINTS: tuple[str, ...] = (
    "send_event.enter",
    "send_event.recorded",
    "send_event.effects",
    "acknowledge.enter",
    "acknowledge.removed",
    "release_attachment.enter",
    "release_attachment.detached",
    "begin_resume.enter",
    "begin_resume.claimed",
    "end_resume.enter",
    "end_resume.released",
    "settle_lease_generation.enter",
    "settle_lease_generation.parked",
    "has_attachment.enter",
    "is_current_attachment.enter",
    "authenticate_resume.enter",
    "authenticate_resume.verified",
    "resume.enter",
    "resume.verified",
    "resume.rotated",
    "resume.attached",
    "activation_outcome.enter",
    "activation_outcome.rolled_back",
    "abort_resume.enter",
    "abort_resume.rolled_back",
    "tick.enter",
    "tick.pruned",
    "close.enter",
    "close.closed",
)


#: Failpoints of passivation and reactivation (beyond any one command).
LIFECYCLE_FAILPOINTS: tuple[str, ...] = (
    "passivate.enter",
    "passivate.parked",
    "reactivate.enter",
    "reactivate.restored",
)


class Failpoints(Protocol):
    """Told of each step a transition passes; may raise to inject a crash there."""

    def hit(self, name: str, session_id: str) -> None: ...


class _NoFailpoints:
    def hit(self, name: str, session_id: str) -> None:
        return None


NO_FAILPOINTS: Failpoints = _NoFailpoints()


def check_session_id(session_id: object, *, strict: bool) -> str:
    if strict and (not isinstance(session_id, str) or not session_id):
        raise InvalidSessionIdError("session id must be a non-empty string")
    return session_id  # type: ignore[return-value]


def check_generation(value: object, *, what: str, optional: bool) -> None:
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInputError(f"{what} must be an int, got {type(value).__name__}")


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionConfig:
    """Per-session limits; the registry hands the same one to every session."""

    replay_ttl_s: float
    replay_max_bytes: int
    replay_max_events: int | None = None
    #: ``None``: the engine owns the grace (the seed's rule). A number: a
    #: session left detached, with no resume claimed, that long is expired.
    disconnect_grace_s: float | None = None
    #: Strict input checks (the native doors); ``False`` takes what the seed took.
    strict: bool = True

    def __post_init__(self) -> None:
        if not self.replay_ttl_s > 0:
            raise ValueError("replay_ttl_s must be positive")
        if self.replay_max_bytes <= 0:
            raise ValueError("replay_max_bytes_per_session must be positive")
        if self.replay_max_events is not None and self.replay_max_events <= 0:
            raise ValueError("replay_max_events_per_session must be positive")
        grace = self.disconnect_grace_s
        if grace is not None and (math.isnan(grace) or grace < 0):
            raise ValueError("disconnect_grace_s must be None or >= 0")


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class Transition:
    """A command's outcome: ``reply`` or ``error`` for the caller, then ``effects``."""

    reply: object = None
    error: SessionError | None = None
    effects: tuple[Effect, ...] = ()


class StateSnapshot(NamedTuple):
    """The whole state at one point, O(1) to take; compares equal iff states match.

    A named tuple, not a frozen dataclass: every command takes one, and a
    frozen dataclass's per-field ``object.__setattr__`` made it ~2.5x dearer
    (a measured share of every awaited send).
    """

    journal: JournalSnapshot
    #: Immutable, so the snapshot holds the live state's own record.
    fields: SessionFields
    # What only a live session has (never parked or stored).
    attachment: TransportAttachment | None
    pending_resumes: int
    activations: tuple[tuple[int, bytes], ...]
    closed: bool

    def __repr__(self) -> str:  # digests are not tokens, but stay out of logs anyway
        return (
            f"StateSnapshot(attachment_generation={self.fields.attachment_generation}, "
            f"lease_generation={self.fields.lease_generation}, closed={self.closed})"
        )
