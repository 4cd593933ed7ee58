"""SessionState: the seed registry's per-session rules, driven with a fake clock.

Detach, attachment queries and lease settlement are in
``test_state_attachment.py``; authentication, resume, activation and recovery
in ``test_state_resume.py``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest

from actors._commands import (
    Acknowledge,
    ActivationOutcome,
    AuthenticateResume,
    BeginResume,
    Close,
    Deliver,
    EndResume,
    EventAccepted,
    HasAttachment,
    IsCurrentAttachment,
    Notify,
    ReleaseAttachment,
    Resume,
    RetireAttachment,
    SendEvent,
    SendEvents,
    SessionCreated,
    SettleLeaseGeneration,
    Tick,
    TickResult,
)
from actors._errors import (
    InvalidInputError,
    InvalidPayloadError,
    InvalidSequenceError,
    InvalidSessionIdError,
    SessionError,
    UnknownSessionError,
)
from actors._journal import JournalEntry
from actors._state import SessionConfig, SessionState
from tests.helpers import (
    FakeClock,
    World,
    activation_payload,
    auth,
    config,
    fails,
    ok,
    open_world,
    resume,
    resume_command,
    wire_close,
    wire_send,
)


def counter() -> tuple[list[int], Callable[[], None]]:
    calls: list[int] = []
    return calls, lambda: calls.append(1)


# -- create ----------------------------------------------------------------------


def test_open_attaches_generation_one_with_the_given_lease_and_a_working_token() -> None:
    clock = FakeClock()
    state, transition = SessionState.open(
        session_id="s1",
        config=config(),
        send=wire_send,
        close=wire_close,
        lease_generation=7,
        clock=clock,
    )
    created = transition.reply
    assert isinstance(created, SessionCreated)
    assert (created.session_id, created.attachment_generation) == ("s1", 1)
    assert len(created.resume_token.plaintext) == 43
    assert (state.attachment_generation, state.lease_generation) == (1, 7)
    assert ok(state.handle(IsCurrentAttachment(attachment_generation=1))) is True
    token = created.resume_token.plaintext
    assert (
        ok(state.handle(AuthenticateResume(resume_token=token, last_received_server_event_seq=0)))
        is None
    )
    [notify] = transition.effects
    assert isinstance(notify, Notify) and notify.event.kind == "created"
    state.check_invariants()


@pytest.mark.parametrize("session_id", ["", 7, None])
def test_strict_open_rejects_a_session_id_that_is_not_a_non_empty_string(session_id: Any) -> None:
    with pytest.raises(InvalidSessionIdError):
        SessionState.open(session_id=session_id, config=config(), send=wire_send, close=wire_close)


@pytest.mark.parametrize(
    "overrides",
    [
        {"replay_ttl_s": 0},
        {"replay_ttl_s": math.nan},
        {"replay_max_bytes": 0},
        {"replay_max_events": 0},
        {"disconnect_grace_s": -1.0},
        {"disconnect_grace_s": math.nan},
    ],
)
def test_config_rejects_invalid_limits(overrides: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        config(**overrides)


# -- send_event --------------------------------------------------------------------


def test_journaled_send_while_attached_accepts_before_delivering_the_stamped_frame() -> None:
    world = open_world()
    calls, callback = counter()
    transition = world.state.handle(SendEvent(payload={"x": 1}, on_accepted=callback))
    entry = ok(transition)
    assert isinstance(entry, JournalEntry) and entry.sequence == 1
    accepted, deliver = transition.effects
    assert isinstance(accepted, EventAccepted) and accepted.callback is callback
    assert isinstance(deliver, Deliver)
    assert deliver.attachment_generation == 1
    assert [dict(frame) for frame in deliver.frames] == [{"x": 1, "server_event_seq": 1}]
    assert deliver.on_delivered is None
    assert calls == []  # the shell runs it, never the state


def test_journaled_send_without_callback_only_delivers() -> None:
    world = open_world()
    transition = world.state.handle(SendEvent(payload={"x": 1}))
    assert [type(effect) for effect in transition.effects] == [Deliver]


def test_journaled_send_while_detached_records_and_accepts_without_delivering() -> None:
    world = open_world()
    ok(world.state.handle(ReleaseAttachment()))
    _, callback = counter()
    transition = world.state.handle(SendEvent(payload={"x": 1}, on_accepted=callback))
    assert ok(transition).sequence == 1
    [accepted] = transition.effects
    assert isinstance(accepted, EventAccepted) and accepted.callback is callback
    assert [e.sequence for e in world.state.journal.replay_after(0)] == [1]


def test_unjournaled_send_while_attached_runs_on_accepted_only_after_delivery() -> None:
    world = open_world()
    _, callback = counter()
    transition = world.state.handle(
        SendEvent(payload={"audio": b"\x00\x01"}, journal=False, on_accepted=callback)
    )
    assert ok(transition) is None
    [deliver] = transition.effects
    assert isinstance(deliver, Deliver)
    assert deliver.frames == ({"audio": b"\x00\x01"},)
    assert deliver.on_delivered is callback
    assert world.state.journal.last_sequence == 0


def test_unjournaled_send_while_detached_has_no_effect_and_no_callback() -> None:
    world = open_world()
    ok(world.state.handle(ReleaseAttachment()))
    _, callback = counter()
    transition = world.state.handle(
        SendEvent(payload={"a": 1}, journal=False, on_accepted=callback)
    )
    assert ok(transition) is None
    assert transition.effects == ()


def test_send_events_delivers_the_whole_batch_in_order_in_one_delivery() -> None:
    world = open_world()
    transition = world.state.handle(SendEvents(payloads=({"n": 1}, {"n": 2}, {"n": 3})))
    assert [entry.sequence for entry in ok(transition)] == [1, 2, 3]
    [deliver] = transition.effects
    assert isinstance(deliver, Deliver)
    assert [frame["n"] for frame in deliver.frames] == [1, 2, 3]
    assert [frame["server_event_seq"] for frame in deliver.frames] == [1, 2, 3]


def test_unjournaled_send_events_replies_one_none_per_payload() -> None:
    world = open_world()
    transition = world.state.handle(SendEvents(payloads=({"n": 1}, {"n": 2}), journal=False))
    assert ok(transition) == (None, None)
    assert world.state.journal.last_sequence == 0


def test_delivery_targets_the_generation_attached_now() -> None:
    world = open_world()
    resume(world)
    [deliver, *_] = world.state.handle(SendEvent(payload={})).effects
    assert isinstance(deliver, Deliver) and deliver.attachment_generation == 2


# -- acknowledge --------------------------------------------------------------------


def test_acknowledge_drops_entries_and_replies_with_the_count() -> None:
    world = open_world()
    for n in range(3):
        world.state.handle(SendEvent(payload={"n": n}))
    assert ok(world.state.handle(Acknowledge(sequence=2))) == 2
    assert [e.sequence for e in world.state.journal.replay_after(2)] == [3]


@pytest.mark.parametrize("sequence", [-1, 4])
def test_acknowledge_out_of_range_is_a_value_error(sequence: int) -> None:
    world = open_world()
    world.state.handle(SendEvent(payload={}))
    error = fails(world.state.handle(Acknowledge(sequence=sequence)), InvalidSequenceError)
    assert isinstance(error, ValueError)


# -- close -------------------------------------------------------------------------------


def test_close_returns_and_retires_the_attachment() -> None:
    world = open_world()
    transition = world.state.handle(Close())
    attachment = ok(transition)
    assert attachment is not None and attachment.generation == 1
    retire, notify = transition.effects
    assert retire == RetireAttachment(attachment_generation=1, reason="closed")
    assert isinstance(notify, Notify) and notify.event.kind == "closed"
    assert world.state.closed


def test_close_while_detached_returns_none() -> None:
    world = open_world()
    ok(world.state.handle(ReleaseAttachment()))
    transition = world.state.handle(Close())
    assert ok(transition) is None
    assert [type(e) for e in transition.effects] == [Notify]


ALL_COMMANDS: list[Any] = [
    SendEvent(payload={}),
    SendEvent(payload={}, journal=False),
    SendEvents(payloads=({},)),
    Acknowledge(sequence=0),
    ReleaseAttachment(),
    BeginResume(),
    EndResume(),
    SettleLeaseGeneration(lease_generation=1),
    HasAttachment(),
    IsCurrentAttachment(attachment_generation=1),
    AuthenticateResume(resume_token="t", last_received_server_event_seq=0),
    Resume(resume_token="t", last_received_server_event_seq=0, send=wire_send, close=wire_close),
    ActivationOutcome(attachment_generation=1, delivered=False),
    Tick(now=0.0),
    Close(),
]


@pytest.mark.parametrize("command", ALL_COMMANDS, ids=lambda c: type(c).__name__)
def test_every_command_after_close_answers_unknown_session(command: Any) -> None:
    world = open_world()
    ok(world.state.handle(Close()))
    before = world.state.snapshot()
    error = fails(world.state.handle(command), UnknownSessionError)
    assert isinstance(error, KeyError)
    assert str(error) == "unknown duplex attachment session: s1"
    assert world.state.snapshot() == before


# -- tick --------------------------------------------------------------------------------


def test_tick_prunes_expired_entries_even_for_an_idle_session() -> None:
    world = open_world(replay_ttl_s=10.0)
    world.state.handle(SendEvents(payloads=({}, {})))
    now = world.clock.now
    assert ok(world.state.handle(Tick(now=now + 9.9))) == TickResult(pruned=0, expired=False)
    assert ok(world.state.handle(Tick(now=now + 10.0))) == TickResult(pruned=2, expired=False)
    assert world.state.journal.retained_bytes == 0


def test_tick_expires_a_session_left_detached_for_the_grace() -> None:
    world = open_world(disconnect_grace_s=30.0)
    ok(world.state.handle(ReleaseAttachment()))
    detached_at = world.clock.now
    assert ok(world.state.handle(Tick(now=detached_at + 29.9))).expired is False
    assert ok(world.state.handle(Tick(now=detached_at + 30.0))).expired is True


def test_tick_never_expires_an_attached_session_or_without_a_grace() -> None:
    attached = open_world(disconnect_grace_s=1.0)
    assert ok(attached.state.handle(Tick(now=attached.clock.now + 1e6))).expired is False
    no_grace = open_world()
    ok(no_grace.state.handle(ReleaseAttachment()))
    assert ok(no_grace.state.handle(Tick(now=no_grace.clock.now + 1e6))).expired is False


def test_tick_does_not_expire_while_a_resume_is_pending() -> None:
    world = open_world(disconnect_grace_s=1.0)
    ok(world.state.handle(ReleaseAttachment()))
    ok(world.state.handle(BeginResume()))
    late = world.clock.now + 100.0
    assert ok(world.state.handle(Tick(now=late))).expired is False
    ok(world.state.handle(EndResume()))
    assert ok(world.state.handle(Tick(now=late))).expired is True


def test_tick_does_not_expire_while_an_activation_is_in_flight() -> None:
    world = open_world(disconnect_grace_s=1.0)
    command = resume_command(world, activation_payload_factory=activation_payload)
    ok(world.state.handle(command))
    ok(world.state.handle(ReleaseAttachment(attachment_generation=2)))
    late = world.clock.now + 100.0
    assert ok(world.state.handle(Tick(now=late))).expired is False
    ok(world.state.handle(ActivationOutcome(attachment_generation=2, delivered=True)))
    assert ok(world.state.handle(Tick(now=late))).expired is True


# -- input checks --------------------------------------------------------------------------


def untyped(value: object) -> Any:
    """Input a type checker would refuse, as a careless caller would send it."""
    return value


STRICT_REJECTIONS: dict[str, Callable[[World], Any]] = {
    "nan-payload": lambda w: SendEvent(payload={"x": math.nan}),
    "int-key": lambda w: SendEvent(payload=untyped({1: "x"})),
    "unjournaled-pairs": lambda w: SendEvent(payload=untyped([("a", 1)]), journal=False),
    "batch-with-inf": lambda w: SendEvents(payloads=({"ok": 1}, {"bad": math.inf})),
    "bool-ack": lambda w: Acknowledge(sequence=True),
    "str-ack": lambda w: Acknowledge(sequence=untyped("1")),
    "str-release": lambda w: ReleaseAttachment(attachment_generation=untyped("1")),
    "bool-settle": lambda w: SettleLeaseGeneration(lease_generation=True),
    "none-token": lambda w: AuthenticateResume(
        resume_token=untyped(None), last_received_server_event_seq=0
    ),
    "float-resume-seq": lambda w: resume_command(w, last_received_server_event_seq=1.0),
    "str-resume-lease": lambda w: resume_command(w, lease_generation="2"),
}


@pytest.mark.parametrize("name", STRICT_REJECTIONS)
def test_strict_input_errors_change_nothing(name: str) -> None:
    world = open_world()
    ok(world.state.handle(SendEvent(payload={"n": 0})))
    before = world.state.snapshot()
    fails(world.state.handle(STRICT_REJECTIONS[name](world)), InvalidInputError)
    assert world.state.snapshot() == before
    assert ok(auth(world, world.token, 1)) is None
    assert ok(world.state.handle(SendEvent(payload={}))).sequence == 2


def test_lenient_session_accepts_what_the_seed_accepted() -> None:
    world = open_world(strict=False)
    assert ok(world.state.handle(SendEvent(payload=untyped([("a", 1)])))).sequence == 1
    assert ok(world.state.handle(SendEvent(payload={"x": math.nan}))).sequence == 2
    assert ok(world.state.handle(Acknowledge(sequence=True))) == 1
    assert ok(world.state.handle(ReleaseAttachment(attachment_generation=True))) is not None
    lenient = SessionState.open(
        session_id="", config=config(strict=False), send=wire_send, close=wire_close
    )
    assert lenient[0].session_id == ""


def test_payload_error_keeps_seed_builtin_bases() -> None:
    world = open_world()
    error = fails(world.state.handle(SendEvent(payload={"x": math.nan})), InvalidPayloadError)
    assert isinstance(error, TypeError) and isinstance(error, ValueError)
    assert isinstance(error, SessionError)


def test_handle_rejects_something_that_is_not_a_command() -> None:
    world = open_world()
    with pytest.raises(TypeError, match="not a session command"):
        world.state.handle("send")  # type: ignore[arg-type]


def test_session_config_defaults_to_strict_and_engine_owned_grace() -> None:
    cfg = SessionConfig(replay_ttl_s=1.0, replay_max_bytes=1)
    assert cfg.strict is True and cfg.disconnect_grace_s is None


def test_a_non_atomic_batch_refuses_each_bad_event_alone() -> None:
    world = open_world(replay_max_bytes=160)
    transition = world.state.handle(
        SendEvents(
            payloads=({"n": 1}, {"n": float("nan")}, {"n": 2}, {"n": "x" * 200}), atomic=False
        )
    )
    results = ok(transition)
    assert [type(r).__name__ for r in results] == [
        "JournalEntry",
        "InvalidPayloadError",
        "JournalEntry",
        "JournalOverflowError",
    ]
    assert [r.sequence for r in results if isinstance(r, JournalEntry)] == [1, 2]
    (deliver,) = [e for e in transition.effects if isinstance(e, Deliver)]
    assert [f["n"] for f in deliver.frames] == [1, 2]
    # Overflow stays sticky for what follows, as single sends would see it.
    assert world.state.journal.overflowed
