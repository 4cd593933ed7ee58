"""A crash at any failpoint leaves the session exactly as it was before the command.

Each scenario builds a session (unarmed), then issues one command. For every
name in FAILPOINTS, every scenario that passes it is run again with a crash
injected there; the crash must propagate, the snapshot must equal the one
taken before, the observable answers must equal those of an identical session
that never saw the command, and re-running the command must give the same
transition as running it on that untouched twin.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import pytest

from actors._commands import (
    AbortResume,
    Acknowledge,
    ActivationOutcome,
    AuthenticateResume,
    BeginResume,
    Close,
    Command,
    EndResume,
    HasAttachment,
    IsCurrentAttachment,
    ReleaseAttachment,
    SendEvent,
    SendEvents,
    SettleLeaseGeneration,
    Tick,
)
from actors._credential import ResumeToken
from actors._errors import SessionError
from actors._journal import JournalEntry
from actors._state import FAILPOINTS
from tests.helpers import World, activation_payload, auth, ok, open_world, resume_command


class InjectedCrashError(RuntimeError):
    """A bug in a handler: not a SessionError, so it must undo the transition."""


class InjectedBaseCrashError(BaseException):
    """Something that is not even an Exception (cancellation-like)."""


class Injector:
    """Failpoints that record every step and raise at the armed one."""

    def __init__(self) -> None:
        self.armed: str | None = None
        self.crash: type[BaseException] = InjectedCrashError
        self.hits: list[str] = []

    def hit(self, name: str, session_id: str) -> None:
        self.hits.append(name)
        if name == self.armed:
            raise self.crash(f"injected at {name}")


@dataclass(frozen=True)
class Scenario:
    name: str
    setup: Callable[[World], object]
    command: Callable[[World], Command]


def _noop() -> None:
    return None


def with_expiring_journal(world: World) -> None:
    """Events 1-2 are past their TTL at the current time (not yet pruned); 3 is not."""
    ok(world.state.handle(SendEvents(payloads=({"n": 1}, {"n": 2}))))
    world.clock.advance(6.0)
    ok(world.state.handle(SendEvent(payload={"n": 3})))
    world.clock.advance(5.0)


def with_activation(world: World, *, lease: int = 5) -> None:
    """Resume with an activation factory under a begin_resume claim; outcome pending."""
    with_expiring_journal(world)
    ok(world.state.handle(BeginResume()))
    command = resume_command(
        world, activation_payload_factory=activation_payload, lease_generation=lease
    )
    world.token = ok(world.state.handle(command)).resume_token.plaintext


def with_resume_without_factory(world: World) -> None:
    """Detached, then resumed with no activation factory: nothing left in flight."""
    with_expiring_journal(world)
    ok(world.state.handle(ReleaseAttachment()))
    world.token = ok(world.state.handle(resume_command(world))).resume_token.plaintext


def with_failed_activation(world: World) -> None:
    with_activation(world)
    ok(world.state.handle(ActivationOutcome(attachment_generation=2, delivered=False)))


def then(*steps: Callable[[World], object]) -> Callable[[World], None]:
    def setup(world: World) -> None:
        for step in steps:
            step(world)

    return setup


def handle(command: Command) -> Callable[[World], object]:
    return lambda world: ok(world.state.handle(command))


SCENARIOS = [
    Scenario(
        "send-journaled",
        with_expiring_journal,
        lambda w: SendEvent(payload={"n": "new"}, on_accepted=_noop),
    ),
    Scenario(
        "send-unjournaled",
        with_expiring_journal,
        lambda w: SendEvent(payload={"n": "raw"}, journal=False, on_accepted=_noop),
    ),
    Scenario(
        "send-batch", with_expiring_journal, lambda w: SendEvents(payloads=({"a": 1}, {"b": 2}))
    ),
    Scenario(
        "send-burst-not-atomic",
        with_expiring_journal,
        lambda w: SendEvents(payloads=({"a": 1}, {"bad": float("nan")}, {"b": 2}), atomic=False),
    ),
    Scenario(
        "send-batch-unjournaled",
        with_expiring_journal,
        lambda w: SendEvents(payloads=({"a": 1},), journal=False),
    ),
    Scenario("acknowledge", with_expiring_journal, lambda w: Acknowledge(sequence=3)),
    Scenario(
        "release", with_expiring_journal, lambda w: ReleaseAttachment(attachment_generation=1)
    ),
    Scenario("begin-resume", with_expiring_journal, lambda w: BeginResume()),
    Scenario(
        "end-resume-owes-orphan",
        then(
            handle(BeginResume()),
            handle(ReleaseAttachment()),
            handle(SettleLeaseGeneration(lease_generation=4)),
        ),
        lambda w: EndResume(),
    ),
    Scenario(
        "settle-to-attached",
        with_expiring_journal,
        lambda w: SettleLeaseGeneration(lease_generation=3),
    ),
    Scenario(
        "settle-returned",
        handle(ReleaseAttachment()),
        lambda w: SettleLeaseGeneration(lease_generation=3),
    ),
    Scenario("has-attachment", with_expiring_journal, lambda w: HasAttachment()),
    Scenario(
        "is-current", with_expiring_journal, lambda w: IsCurrentAttachment(attachment_generation=1)
    ),
    Scenario(
        "authenticate",
        with_expiring_journal,
        lambda w: AuthenticateResume(resume_token=w.token, last_received_server_event_seq=3),
    ),
    Scenario(
        "resume-with-activation-and-orphan",
        then(
            with_expiring_journal,
            handle(BeginResume()),
            handle(SettleLeaseGeneration(lease_generation=6)),
        ),
        lambda w: resume_command(
            w, activation_payload_factory=activation_payload, lease_generation=5
        ),
    ),
    Scenario(
        "resume-with-recovery-token",
        with_failed_activation,
        lambda w: resume_command(w, w.tokens["created"]),
    ),
    Scenario(
        "activation-failed",
        with_activation,
        lambda w: ActivationOutcome(attachment_generation=2, delivered=False),
    ),
    Scenario(
        "activation-delivered",
        with_activation,
        lambda w: ActivationOutcome(attachment_generation=2, delivered=True),
    ),
    Scenario(
        "abort-activating-resume",
        with_activation,
        lambda w: AbortResume(attachment_generation=2),
    ),
    Scenario(
        "abort-resume-without-activation",
        with_resume_without_factory,
        lambda w: AbortResume(attachment_generation=2),
    ),
    Scenario(
        "tick",
        then(with_expiring_journal, handle(ReleaseAttachment())),
        lambda w: Tick(now=w.clock.now),
    ),
    Scenario("close", with_expiring_journal, lambda w: Close()),
]


def build(scenario: Scenario, injector: Injector) -> World:
    world = open_world(failpoints=injector, replay_ttl_s=10.0, disconnect_grace_s=5.0)
    scenario.setup(world)
    injector.hits.clear()
    return world


def summary(value: object) -> object:
    """A comparable picture of a value with tokens and local callables left out."""
    if isinstance(value, ResumeToken):
        return "<token>"
    if isinstance(value, JournalEntry):
        return ("entry", value.sequence, value.created_monotonic, dict(value.payload))
    if isinstance(value, BaseException):
        return (type(value).__name__, str(value))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = dataclasses.fields(value)
        pairs = [
            (f.name, summary(getattr(value, f.name))) for f in fields if not f.metadata.get("local")
        ]
        return (type(value).__name__, tuple(pairs))
    if isinstance(value, Mapping):
        return {key: summary(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return tuple(summary(item) for item in value)
    return value


def observe(world: World) -> list[object]:
    """What callers can learn about the session (it may prune, as callers would)."""
    state, journal = world.state, world.state.journal
    seen: list[object] = [
        summary(state.handle(HasAttachment())),
        [summary(state.handle(IsCurrentAttachment(attachment_generation=g))) for g in range(1, 5)],
        (state.attachment_generation, state.lease_generation, state.pending_resumes),
        (state.orphaned_lease_generation, state.activation_in_flight, state.closed),
        (journal.last_sequence, journal.retained_bytes, journal.overflowed, len(journal)),
    ]
    for sequence in range(journal.last_sequence + 1):
        try:
            seen.append(summary(journal.replay_after(sequence)))
        except SessionError as error:
            seen.append(summary(error))
    tokens = {"current": world.token, **world.tokens}
    seen.extend((role, summary(auth(world, token, 0).error)) for role, token in tokens.items())
    seen.append(summary(state.handle(Tick(now=world.clock.now + 5.0))))
    return seen


def glance(world: World) -> tuple[object, ...]:
    """Answers that change nothing, read right after the crash."""
    state, journal = world.state, world.state.journal
    return (
        ok(state.handle(HasAttachment())),
        [ok(state.handle(IsCurrentAttachment(attachment_generation=g))) for g in range(1, 5)],
        (
            journal.last_sequence,
            journal.retained_bytes,
            len(journal),
            journal.first_retained_sequence,
        ),
    )


def hits_of(scenario: Scenario) -> list[str]:
    injector = Injector()
    world = build(scenario, injector)
    world.state.handle(scenario.command(world))
    return list(injector.hits)


def check_atomic(scenario: Scenario, failpoint: str, crash: type[BaseException]) -> None:
    twin_injector = Injector()
    twin = build(scenario, twin_injector)
    injector = Injector()
    world = build(scenario, injector)
    before = world.state.snapshot()
    injector.armed, injector.crash = failpoint, crash
    with pytest.raises(crash, match=f"injected at {failpoint}"):
        world.state.handle(scenario.command(world))
    injector.armed = None
    assert injector.hits[-1] == failpoint
    assert world.state.snapshot() == before, f"{scenario.name}: state changed at {failpoint}"
    world.state.check_invariants()
    assert glance(world) == glance(twin), f"{scenario.name}: answers differ at {failpoint}"
    # The same command now runs as if the crashed attempt never happened.
    retried = world.state.handle(scenario.command(world))
    untouched = twin.state.handle(scenario.command(twin))
    assert summary(retried) == summary(untouched), scenario.name
    assert observe(world) == observe(twin), f"{scenario.name}: answers differ at {failpoint}"


@pytest.mark.parametrize("failpoint", FAILPOINTS)
def test_crash_at_failpoint_leaves_no_trace(failpoint: str) -> None:
    reaching = [scenario for scenario in SCENARIOS if failpoint in hits_of(scenario)]
    assert reaching, f"no scenario reaches failpoint {failpoint}"
    for scenario in reaching:
        check_atomic(scenario, failpoint, InjectedCrashError)


@pytest.mark.parametrize("failpoint", ["send_event.effects", "resume.attached", "close.closed"])
def test_a_base_exception_crash_also_leaves_no_trace(failpoint: str) -> None:
    for scenario in SCENARIOS:
        if failpoint in hits_of(scenario):
            check_atomic(scenario, failpoint, InjectedBaseCrashError)


def test_scenarios_pass_exactly_the_declared_failpoints() -> None:
    hit = {name for scenario in SCENARIOS for name in hits_of(scenario)}
    assert hit == set(FAILPOINTS)
    assert len(FAILPOINTS) == len(set(FAILPOINTS))


def test_a_domain_error_is_an_answer_not_a_crash() -> None:
    injector = Injector()
    world = build(SCENARIOS[0], injector)
    transition = world.state.handle(Acknowledge(sequence=99))
    assert transition.error is not None and transition.effects == ()
    assert injector.hits == ["acknowledge.enter"]


def test_crash_in_a_command_whose_journal_drop_was_undone_keeps_entries_replayable() -> None:
    scenario = SCENARIOS[0]
    injector = Injector()
    world = build(scenario, injector)
    retained = len(world.state.journal)
    injector.armed = "send_event.recorded"
    with pytest.raises(InjectedCrashError):
        world.state.handle(scenario.command(world))
    assert len(world.state.journal) == retained == 3
    world.clock.now -= 5.0  # before the TTL of events 1 and 2 ran out
    assert [e.sequence for e in world.state.journal.replay_after(0)] == [1, 2, 3]
