"""Shared test helpers: a fake clock, dummy transports and transition checks."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, TypeVar

from actors._commands import (
    AuthenticateResume,
    HasAttachment,
    IsCurrentAttachment,
    Resume,
)
from actors._errors import SessionError
from actors._journal import EventJournal, JournalEntry
from actors._state import NO_FAILPOINTS, Failpoints, SessionConfig, SessionState, Transition
from supervisor.testing import FakeClock as FakeClock


async def wire_send(frame: dict[str, object]) -> None:
    """A transport ``send`` the state machine must never call."""
    raise AssertionError("the pure state machine called a transport send")


async def wire_close(reason: str) -> None:
    """A transport ``close`` the state machine must never call."""
    raise AssertionError("the pure state machine called a transport close")


def activation_payload(token: Any, generation: int) -> dict[str, object]:
    return {"type": "session.resumed", "attachment_generation": generation}


def config(**overrides: Any) -> SessionConfig:
    values: dict[str, Any] = {"replay_ttl_s": 60.0, "replay_max_bytes": 10_000}
    values.update(overrides)
    return SessionConfig(**values)


@dataclass
class World:
    """A session under test with its clock and the tokens it handed out."""

    state: SessionState
    clock: FakeClock
    token: str
    tokens: dict[str, str] = field(default_factory=dict)


def open_world(
    *,
    session_id: str = "s1",
    lease_generation: int = 0,
    failpoints: Failpoints = NO_FAILPOINTS,
    **config_overrides: Any,
) -> World:
    clock = FakeClock()
    state, created = SessionState.open(
        session_id=session_id,
        config=config(**config_overrides),
        send=wire_send,
        close=wire_close,
        lease_generation=lease_generation,
        clock=clock,
        failpoints=failpoints,
    )
    token = created.reply.resume_token.plaintext  # type: ignore[attr-defined]
    return World(state=state, clock=clock, token=token, tokens={"created": token})


def ok(transition: Transition) -> Any:
    """The reply of a transition that must have succeeded."""
    assert transition.error is None, f"unexpected error: {transition.error!r}"
    return transition.reply


ErrorT = TypeVar("ErrorT", bound=SessionError)


def fails(transition: Transition, error_type: type[ErrorT]) -> ErrorT:
    """The error of a transition that must have failed with ``error_type``, effect-free."""
    assert isinstance(transition.error, error_type), transition
    assert transition.reply is None
    assert transition.effects == ()
    return transition.error


def make_journal(
    clock: FakeClock | None = None, *, max_bytes: int = 10_000, ttl_s: float = 10.0, **kwargs: Any
) -> EventJournal:
    return EventJournal(max_bytes=max_bytes, ttl_s=ttl_s, clock=clock or FakeClock(), **kwargs)


def sequences(entries: tuple[JournalEntry, ...]) -> list[int]:
    return [entry.sequence for entry in entries]


def resume_command(world: World, token: str | None = None, **overrides: Any) -> Resume:
    """A Resume with the world's current token, caught up to the journal head."""
    fields: dict[str, Any] = {
        "resume_token": world.token if token is None else token,
        "last_received_server_event_seq": world.state.journal.last_sequence,
        "send": wire_send,
        "close": wire_close,
    }
    fields.update(overrides)
    return Resume(**fields)


def resume(world: World, token: str | None = None, **overrides: Any) -> Any:
    """A resume that must succeed; the world learns the rotated token. Returns the reply."""
    reply = ok(world.state.handle(resume_command(world, token, **overrides)))
    world.token = reply.resume_token.plaintext
    return reply


def auth(world: World, token: str, seq: Any) -> Transition:
    return world.state.handle(
        AuthenticateResume(resume_token=token, last_received_server_event_seq=seq)
    )


def has(world: World) -> bool:
    return bool(ok(world.state.handle(HasAttachment())))


def current(world: World, generation: int) -> bool:
    return bool(ok(world.state.handle(IsCurrentAttachment(attachment_generation=generation))))


def leases(world: World) -> tuple[int, int | None]:
    """(lease the attached connection serves, lease parked for the next activation)."""
    return world.state.lease_generation, world.state.orphaned_lease_generation


class ThreadReply:
    """A reply a test thread blocks on (for ``system.call`` straight to an actor).

    The first answer wins.
    """

    __slots__ = ("_error", "_event", "_lock", "_value")

    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._value: object = None
        self._error: BaseException | None = None

    def resolve(self, value: object) -> None:
        with self._lock:
            if not self._event.is_set():
                self._value = value
                self._event.set()

    def fail(self, error: BaseException) -> None:
        with self._lock:
            if not self._event.is_set():
                self._error = error
                self._event.set()

    def wait(self, timeout: float | None) -> Any:
        if not self._event.wait(timeout):
            raise TimeoutError(f"no answer within {timeout} s")
        if self._error is not None:
            raise self._error
        return self._value
