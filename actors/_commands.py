"""What goes in and out of a session: commands, results, effects, events.

All frozen, slotted and keyword-only, except the four results the seed
exported (attachment, created, detached, resume result): seed programs may
build those positionally, so they keep the seed's field order. A field
marked `local` holds a callable of this process (a transport's
``send``, an ``on_accepted``) and cannot cross a wire: the JSON codec
(``tests/message_codec.py``, until library code carries commands between
processes) leaves it out and takes it back as a binding. A
field marked `secret` holds a resume token: it is left out of every
repr.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import MISSING, dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from actors._credential import ResumeToken
from actors._journal import JournalEntry
from actors._quick_init import quick_init

__all__ = [
    "AbortResume",
    "Acknowledge",
    "Activate",
    "ActivationOutcome",
    "ActivationPayloadFactory",
    "AuthenticateResume",
    "BeginResume",
    "Close",
    "Command",
    "Deliver",
    "DetachedAttachment",
    "Effect",
    "EndResume",
    "EventAccepted",
    "HasAttachment",
    "IsCurrentAttachment",
    "LifecycleEvent",
    "LifecycleKind",
    "Notify",
    "ReleaseAttachment",
    "ReplayCountingFactory",
    "Resume",
    "ResumeResult",
    "RetireAttachment",
    "SendEvent",
    "SendEvents",
    "SessionCreated",
    "SessionGenerations",
    "SettleLeaseGeneration",
    "Tick",
    "TickResult",
    "TransportAttachment",
]

SendCallable = Callable[[dict[str, object]], Awaitable[None]]
"""A transport's async ``send(frame)``. The session never calls it; the
outbox on the loop that owns the transport does, each attachment's frames in
order."""
CloseCallable = Callable[[str], Awaitable[None]]
"""A transport's async ``close(reason)``. Its owner calls it (for example on a
``replaced_attachment``); the library calls it only when it gives up on the
transport itself (the reasons are in docs/shutdown.md)."""
ActivationPayloadFactory = Callable[[ResumeToken, int], Mapping[str, object]]
"""``factory(new_token, attachment_generation) -> payload``: the activation
frame a ``resume`` sends first on the new transport, before the replay."""


@runtime_checkable
class ReplayCountingFactory(Protocol):
    """An activation payload factory that also wants the replay's length.

    Still callable as the seed's ``factory(token, generation)``; where it has
    ``activation_payload``, the outbox calls that instead, with the number of
    replayed events that will follow the activation on the wire.
    """

    def __call__(self, token: ResumeToken, generation: int) -> Mapping[str, object]: ...

    def activation_payload(
        self, token: ResumeToken, generation: int, replayed: int
    ) -> Mapping[str, object]:
        """The activation frame, knowing that ``replayed`` events follow it."""
        ...


def local(default: object = MISSING) -> Any:
    """A field holding a process-local callable: no repr, not encoded."""
    return field(default=default, repr=False, compare=False, metadata={"local": True})


def secret() -> Any:
    """A field holding a resume token: never in a repr."""
    return field(repr=False, metadata={"secret": True})


# -- transports and results ------------------------------------------------


@dataclass(frozen=True, slots=True)
class TransportAttachment:
    """One connection of a session, numbered by its attachment generation."""

    generation: int
    send: SendCallable = local()
    close: CloseCallable = local()


@dataclass(frozen=True, slots=True)
class SessionCreated:
    """What ``create`` answers: the new session's first attachment and its resume token.

    ``attachment_generation`` is 1; ``resume_token`` (a `ResumeToken`,
    its ``plaintext`` for the client) is left out of the repr.
    """

    session_id: str
    attachment_generation: int
    resume_token: ResumeToken = secret()


@dataclass(frozen=True, slots=True)
class DetachedAttachment:
    """The transport a detach dropped, with the engine lease generation it was serving."""

    session_id: str
    attachment_generation: int
    lease_generation: int


@dataclass(frozen=True, slots=True)
class ResumeResult:
    """What ``resume`` answers.

    ``attachment_generation``: the new attachment's; ``resume_token``: the
    rotated token (the presented one is dead), left out of the repr;
    ``replay_entries``: the journaled events after the client's last
    sequence, in order (sent already when the resume had an
    ``activation_payload_factory``; the caller's to send otherwise, as in
    the seed); ``replaced_attachment``: the transport this resume took over
    from, for its owner to close, or ``None``.
    """

    session_id: str
    attachment_generation: int
    resume_token: ResumeToken = secret()
    replay_entries: tuple[JournalEntry, ...] = ()
    replaced_attachment: TransportAttachment | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class TickResult:
    pruned: int
    expired: bool


# -- commands ----------------------------------------------------------------


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class SendEvent:
    payload: Mapping[str, object] = field(repr=False)
    journal: bool = True
    on_accepted: Callable[[], None] | None = local(None)


@dataclass(frozen=True, slots=True, kw_only=True)
class SendEvents:
    """A batch, frames in order, one reply.

    ``atomic`` (the default): all recorded or none, the reply a tuple of
    entries. Not atomic (coalesced ``send_event_nowait`` calls): each event
    stands or falls alone, as separate calls would, and the reply holds, per
    payload, its entry (``None`` unjournaled) or the error that refused it.
    """

    payloads: tuple[Mapping[str, object], ...] = field(repr=False)
    journal: bool = True
    atomic: bool = True


@dataclass(frozen=True, slots=True, kw_only=True)
class Acknowledge:
    sequence: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ReleaseAttachment:
    """Detach; ``None`` means whichever connection is attached now."""

    attachment_generation: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class BeginResume:
    pass


@dataclass(frozen=True, slots=True, kw_only=True)
class EndResume:
    pass


@dataclass(frozen=True, slots=True, kw_only=True)
class SettleLeaseGeneration:
    lease_generation: int


@dataclass(frozen=True, slots=True, kw_only=True)
class HasAttachment:
    pass


@dataclass(frozen=True, slots=True, kw_only=True)
class IsCurrentAttachment:
    attachment_generation: int


@dataclass(frozen=True, slots=True, kw_only=True)
class AuthenticateResume:
    resume_token: str = secret()
    last_received_server_event_seq: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Resume:
    resume_token: str = secret()
    last_received_server_event_seq: int
    send: SendCallable = local()
    close: CloseCallable = local()
    activation_payload_factory: ActivationPayloadFactory | None = local(None)
    lease_generation: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ActivationOutcome:
    """Internal: how a resume's activation (and replay) went on the wire."""

    attachment_generation: int
    delivered: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class AbortResume:
    """Internal: the resume's caller was cancelled before it saw the result.

    Rolls the resume of ``attachment_generation`` back as a failed activation
    would, if it is still the current one; otherwise it changes nothing.
    """

    attachment_generation: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Tick:
    """Internal: logical time moved; prune by TTL and check the grace."""

    now: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Close:
    pass


Command = (
    SendEvent
    | SendEvents
    | Acknowledge
    | ReleaseAttachment
    | BeginResume
    | EndResume
    | SettleLeaseGeneration
    | HasAttachment
    | IsCurrentAttachment
    | AuthenticateResume
    | Resume
    | ActivationOutcome
    | AbortResume
    | Tick
    | Close
)


# -- effects -----------------------------------------------------------------

LifecycleKind = Literal[
    "created",
    "detached",
    "resumed",
    "restarted",
    "failed",
    "expired",
    "closed",
    "send_failed",
    "send_timeout",
    "invalid_token",
    "passivated",
    "reactivated",
    "registry_unhealthy",
    "registry_healthy",
    "event_refused",
    "taken_over",
    "replaced",
]
"""The ``kind`` of a `LifecycleEvent`: every event an observer hears
(docs/shutdown.md says when each comes)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LifecycleEvent:
    """What an observer is told. Never carries a token."""

    kind: LifecycleKind
    session_id: str
    attachment_generation: int | None = None
    lease_generation: int | None = None
    reason: str | None = None

    @classmethod
    def about(
        cls, kind: LifecycleKind, session: SessionGenerations, reason: str | None
    ) -> LifecycleEvent:
        """``kind`` of ``session`` (live or parked), with its generations."""
        return cls(
            kind=kind,
            session_id=session.session_id,
            attachment_generation=session.attachment_generation,
            lease_generation=session.lease_generation,
            reason=reason,
        )


class SessionGenerations(Protocol):
    """What a `LifecycleEvent` tells of a session: a live state's or a parked one's."""

    @property
    def session_id(self) -> str: ...

    @property
    def attachment_generation(self) -> int: ...

    @property
    def lease_generation(self) -> int: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class EventAccepted:
    """Run the caller's ``on_accepted`` (the event is journaled)."""

    callback: Callable[[], None] = local()


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class Deliver:
    """Put ``frames`` on attachment ``attachment_generation``'s wire, in order.

    ``awaited``: the command's caller gets its reply only once these frames'
    sends finished (and the send's error if one failed). ``on_delivered``
    runs after a successful send: an unjournaled event's ``on_accepted``.
    ``encoded``: each frame's compact JSON (UTF-8) when the journal already
    made it (a journaled event's), else empty: a transport that writes JSON
    text need not encode the frame again.
    """

    attachment_generation: int
    frames: tuple[Mapping[str, object], ...] = field(repr=False)
    awaited: bool = True
    on_delivered: Callable[[], None] | None = local(None)
    encoded: tuple[bytes, ...] = field(default=(), repr=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class Activate:
    """Build the activation frame, send it, then the replay; report the outcome.

    The caller's reply waits for the outcome; the shell answers the session
    with `ActivationOutcome` before it answers the caller.
    """

    attachment_generation: int
    resume_token: ResumeToken = secret()
    payload_factory: ActivationPayloadFactory = local()
    replay: tuple[JournalEntry, ...] = field(repr=False, default=())


@dataclass(frozen=True, slots=True, kw_only=True)
class RetireAttachment:
    """Stop generation ``attachment_generation``'s outbox; frames not yet sent are dropped."""

    attachment_generation: int
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Notify:
    event: LifecycleEvent


Effect = EventAccepted | Deliver | Activate | RetireAttachment | Notify
