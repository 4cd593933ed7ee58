"""What a session actor and its supervisor say to each other.

The vocabulary of `actors._session`, kept apart so that module holds the
actor itself: the mail a session's mailbox carries (a door's `Call`,
the supervisor's `Restart`, `FailSession`, `Passivate`,
`Shutdown`, the store's answers `Committed` and `Fenced`) and the
`CrashReport` a session sends up. What every session of a registry shares
(`SessionContext`) and the owner it reports to are `actors._session`'s.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from actors._commands import CloseCallable, Command, SendCallable
from actors._lifecycle import unknown_session_answer
from actors._mailbox import SessionMailbox
from actors._ports import Outbox, Reply
from actors._quick_init import quick_init
from actors._store import StoredSession

__all__ = [
    "NO_REPLY",
    "Call",
    "Committed",
    "CrashReport",
    "FailSession",
    "Fenced",
    "Mail",
    "Opening",
    "Passivate",
    "Replaced",
    "Restart",
    "Shutdown",
    "answer_unknown",
    "carried_call",
]


def answer_unknown(reply: Reply, command: Command, session_id: str) -> None:
    """Answer ``command`` as the seed answered it for a session it did not know."""
    transition = unknown_session_answer(command, session_id)
    if transition.error is not None:
        reply.fail(transition.error)
    else:
        reply.resolve(transition.reply)


@dataclass(frozen=True, slots=True, kw_only=True)
class CrashReport:
    """A session's crash, for its supervisor to decide on."""

    session_id: str
    mailbox: SessionMailbox = field(repr=False)
    #: The incarnation that crashed (one that failed to reactivate has stopped).
    actor_urn: str
    #: ``handle``: a command's handler; ``reactivate``: bringing a parked session back.
    during: Literal["handle", "reactivate"]
    #: The registry's clock at the crash: the restart budget counts the crash
    #: then, not when the supervisor gets to the report.
    crashed_at: float
    #: The restored state passed its invariant check (always True for ``reactivate``).
    state_sound: bool = True
    #: A retried internal command crashed again: restarting would loop.
    retry_crashed: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class Opening:
    """What a new session is opened with (its create call)."""

    send: SendCallable = field(repr=False)
    close: CloseCallable = field(repr=False)
    lease_generation: int
    outbox: Outbox = field(repr=False)
    reply: Reply = field(repr=False)


class Mail:
    __slots__ = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class Replaced(Mail):
    """The supervisor: the store refused this epoch's lease renewal."""

    epoch: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Committed(Mail):
    """The committer: the store answered this session's commit (or create) in flight."""

    #: ``None``: durable; otherwise the store's refusal (or a bug in it).
    error: BaseException | None = field(default=None, repr=False)
    #: A create's answer: the session's first epoch.
    epoch: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Fenced(Mail):
    """The committer: the store fenced this session's commit whose answer was
    lost (`BatchingStore.fence`), or could not be reached to do it."""

    #: The session as the fence left it (``None``: ``error`` says why not).
    stored: StoredSession | None = field(default=None, repr=False)
    error: BaseException | None = field(default=None, repr=False)


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class Call(Mail):
    """A command from a front door, its reply, and for a resume the new outbox."""

    command: Command
    reply: Reply = field(repr=False)
    outbox: Outbox | None = field(default=None, repr=False)
    #: An internal command (an outcome, a tick) is retried once after a crash.
    internal: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class Shutdown(Mail):
    """The registry stops: answer everything with RegistryClosedError and stop."""

    reply: Reply | None = field(default=None, repr=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class Restart(Mail):
    """The supervisor's decision after a crash: go on with what was held."""


@dataclass(frozen=True, slots=True, kw_only=True)
class FailSession(Mail):
    """The supervisor's decision after a crash: close the session, answer everyone."""

    reason: str = "session_failed"


@dataclass(frozen=True, slots=True, kw_only=True)
class Passivate(Mail):
    """The supervisor proposes parking; the actor parks only if still idle then."""

    now: float
    after_s: float
    #: The sweep's tick for this session, riding along (``None``: none). A
    #: session that parks at once when a tick would change nothing (no event
    #: past its TTL, the grace not over) skips it: from then on the sweep
    #: prunes and expires its parked data. Else the tick runs first, as if it
    #: had come alone, and the proposal after it. Its reply is answered either way.
    tick: Call | None = None


def carried_call(mail: object) -> Call | None:
    """The call ``mail`` carries (itself, or a proposal's tick): what must be
    answered when ``mail`` will never run."""
    if isinstance(mail, Call):
        return mail
    if isinstance(mail, Passivate):
        return mail.tick
    return None


class _NoReply:
    def resolve(self, value: object) -> None:
        return None

    def fail(self, error: BaseException) -> None:
        return None


NO_REPLY: Reply = _NoReply()
