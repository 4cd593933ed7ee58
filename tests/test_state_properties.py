"""Property tests: the journal against a list model, and SessionState under random commands."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from actors._commands import (
    Acknowledge,
    ActivationOutcome,
    BeginResume,
    Close,
    Command,
    Deliver,
    DetachedAttachment,
    EndResume,
    HasAttachment,
    IsCurrentAttachment,
    ReleaseAttachment,
    Resume,
    SendEvent,
    SendEvents,
    SettleLeaseGeneration,
    Tick,
)
from actors._errors import (
    InvalidResumeTokenError,
    InvalidSequenceError,
    JournalGapError,
    JournalOverflowError,
    SessionError,
    UnknownSessionError,
)
from actors._journal import EventJournal
from actors._state import SessionConfig, SessionState, Transition
from tests.helpers import FakeClock, activation_payload, make_journal, wire_close, wire_send

TTL = 5.0
payloads = st.dictionaries(
    st.text(alphabet="abé日", max_size=3),
    st.one_of(
        st.integers(-5, 10**6),
        st.text(alphabet='xyé日😀"\\', max_size=8),
        st.booleans(),
        st.none(),
        st.floats(allow_nan=False, allow_infinity=False, width=32),
    ),
    max_size=3,
)

# -- (a) the journal against a list model -----------------------------------------------


class ListJournal:
    """The journal's rules over a plain list; every dropped sequence keeps its reason."""

    def __init__(self, max_bytes: int, max_events: int | None) -> None:
        self.max_bytes, self.max_events = max_bytes, max_events
        self.entries: list[tuple[int, float, dict[str, Any], int]] = []
        self.head, self.dropped, self.overflowed = 0, 0, False
        self.reasons: dict[int, str] = {}

    def prune(self, now: float) -> int:
        kept = [e for e in self.entries if e[1] > now - TTL]
        gone = self.entries[: len(self.entries) - len(kept)]
        assert self.entries[len(gone) :] == kept  # expiry is always from the head
        for sequence, *_ in gone:
            self.reasons[sequence] = "ttl"
            self.dropped = max(self.dropped, sequence)
        self.entries = kept
        return len(gone)

    def record_many(self, batch: list[dict[str, Any]], now: float) -> list[int]:
        if self.overflowed:
            raise JournalOverflowError
        staged = []
        for offset, payload in enumerate(batch):
            sequenced = {**payload, "server_event_seq": self.head + 1 + offset}
            text = json.dumps(sequenced, separators=(",", ":"), ensure_ascii=False)
            staged.append((self.head + 1 + offset, now, sequenced, len(text.encode())))
        self.prune(now)
        size = sum(e[3] for e in self.entries) + sum(e[3] for e in staged)
        count = len(self.entries) + len(staged)
        if size > self.max_bytes or (self.max_events is not None and count > self.max_events):
            self.overflowed = True
            raise JournalOverflowError
        self.entries += staged
        self.head += len(staged)
        return [e[0] for e in staged]

    def acknowledge(self, sequence: int) -> int:
        if sequence < 0 or sequence > self.head:
            raise InvalidSequenceError
        gone = [e for e in self.entries if e[0] <= sequence]
        for entry in gone:
            self.reasons[entry[0]] = "acknowledged"
        self.entries = self.entries[len(gone) :]
        self.dropped = max(self.dropped, sequence)
        return len(gone)

    def replay_after(self, sequence: int, now: float) -> list[int]:
        if sequence < 0:
            raise InvalidSequenceError
        self.prune(now)
        if self.overflowed:
            raise JournalGapError("", requested=0, first_retained=0, head=0, reason="overflow")
        if sequence < self.dropped:
            reason: Any = self.reasons[sequence + 1]
            raise JournalGapError("", requested=0, first_retained=0, head=0, reason=reason)
        if sequence > self.head:
            raise InvalidSequenceError
        return [e[0] for e in self.entries if e[0] > sequence]


def outcome_of(call: Any) -> object:
    try:
        result = call()
    except JournalGapError as gap:
        return ("gap", gap.reason)
    except SessionError as error:
        return type(error).__name__
    if isinstance(result, tuple):
        return [entry.sequence for entry in result]
    return result


def apply(
    journal: EventJournal, model: ListJournal, op: str, arg: Any, now: float
) -> tuple[object, object]:
    """Run one operation on the journal and on the model; return both outcomes."""
    if op == "record":
        got = outcome_of(lambda: journal.record(arg[0]))
        if not isinstance(got, str | tuple):
            got = [got.sequence]  # type: ignore[attr-defined]
        return got, outcome_of(lambda: model.record_many(arg, now))
    if op == "record_many":
        return outcome_of(lambda: journal.record_many(arg)), outcome_of(
            lambda: model.record_many(arg, now)
        )
    if op == "ack":
        return outcome_of(lambda: journal.acknowledge(arg)), outcome_of(
            lambda: model.acknowledge(arg)
        )
    if op == "replay":
        return outcome_of(lambda: journal.replay_after(arg)), outcome_of(
            lambda: model.replay_after(arg, now)
        )
    assert op == "prune"
    return outcome_of(lambda: journal.prune(now + arg)), outcome_of(lambda: model.prune(now + arg))


journal_ops = st.lists(
    st.one_of(
        st.tuples(st.just("record"), st.lists(payloads, min_size=1, max_size=1)),
        st.tuples(st.just("record_many"), st.lists(payloads, max_size=3)),
        st.tuples(st.just("ack"), st.integers(-1, 1000)),
        st.tuples(st.just("replay"), st.integers(-1, 1000)),
        st.tuples(st.just("prune"), st.sampled_from([-3.0, 0.0, 2.5, 5.0])),
        st.tuples(st.just("advance"), st.sampled_from([0.5, 1.0, 2.5, 5.0])),
    ),
    max_size=50,
)


@settings(deadline=None, max_examples=150)
@given(
    ops=journal_ops,
    max_bytes=st.sampled_from([120, 400, 10_000]),
    max_events=st.sampled_from([None, 3, 8]),
)
def test_journal_agrees_with_a_list_model(
    ops: list[tuple[str, Any]], max_bytes: int, max_events: int | None
) -> None:
    clock = FakeClock(0.0)
    journal = make_journal(
        clock, max_bytes=max_bytes, ttl_s=TTL, max_events=max_events, strict=True
    )
    model = ListJournal(max_bytes, max_events)
    for op, raw in ops:
        if op == "advance":
            clock.advance(raw)
            continue
        arg = raw % (model.head + 2) if op in ("ack", "replay") and raw >= 0 else raw
        got, expected = apply(journal, model, op, arg, clock.now)
        assert got == expected, (op, arg)
        journal.check_invariants()
        assert journal.last_sequence == model.head
        assert journal.overflowed == model.overflowed
        assert journal.retained_bytes == sum(e[3] for e in model.entries)
        assert len(journal) == len(model.entries)
        first = model.entries[0][0] if model.entries else model.head + 1
        assert journal.first_retained_sequence == first


# -- (b) SessionState under random command sequences --------------------------------------


class SessionMachine(RuleBasedStateMachine):
    """Drives SessionState and a small model of the seed's attachment and lease rules."""

    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock(0.0)
        cfg = SessionConfig(
            replay_ttl_s=TTL, replay_max_bytes=500, replay_max_events=10, disconnect_grace_s=3.0
        )
        self.state, created = SessionState.open(
            session_id="p", config=cfg, send=wire_send, close=wire_close, clock=self.clock
        )
        self.token: str = created.reply.resume_token.plaintext  # type: ignore[attr-defined]
        self.issued = [self.token]
        self.recovery: str | None = None
        self.generation, self.attached, self.closed = 1, True, False
        self.lease, self.pending = 0, 0
        self.orphan: int | None = None
        self.detached_at: float | None = None
        self.in_flight: dict[int, str] = {}
        self.steps = 0

    def handle(self, command: Command) -> Transition:
        self.steps += 1
        transition = self.state.handle(command)
        if transition.error is not None:
            assert isinstance(transition.error, SessionError)
            assert transition.reply is None and transition.effects == ()
        if self.closed:
            assert isinstance(transition.error, UnknownSessionError)
        return transition

    def settle(self) -> int | None:
        if self.orphan is None or self.pending > 0:
            return None
        orphan, self.orphan = self.orphan, None
        if self.attached:
            self.lease = max(self.lease, orphan)
            return None
        return orphan

    def detach(self) -> None:
        self.attached, self.detached_at = False, self.clock.now

    @rule(payload=payloads, journal=st.booleans())
    def send(self, payload: dict[str, Any], journal: bool) -> None:
        transition = self.handle(SendEvent(payload=payload, journal=journal))
        delivered = [e for e in transition.effects if isinstance(e, Deliver)]
        if transition.error is None and not self.closed:
            assert [d.attachment_generation for d in delivered] == (
                [self.generation] if self.attached else []
            )

    @rule(batch=st.lists(payloads, max_size=3))
    def send_batch(self, batch: list[dict[str, Any]]) -> None:
        self.handle(SendEvents(payloads=tuple(batch)))

    @rule(raw=st.integers(-1, 1000))
    def acknowledge(self, raw: int) -> None:
        head = self.state.journal.last_sequence
        self.handle(Acknowledge(sequence=-1 if raw < 0 else raw % (head + 2)))

    @rule(which=st.sampled_from([None, 0, 1, 2]))
    def release(self, which: int | None) -> None:
        wanted = None if which is None else self.generation - which
        reply = self.handle(ReleaseAttachment(attachment_generation=wanted)).reply
        if self.closed:
            return
        if self.attached and wanted in (None, self.generation):
            assert reply == DetachedAttachment(
                session_id="p", attachment_generation=self.generation, lease_generation=self.lease
            )
            self.detach()
        else:
            assert reply is None

    @rule()
    def begin_resume(self) -> None:
        if self.handle(BeginResume()).error is None:
            self.pending += 1

    @rule()
    def end_resume(self) -> None:
        reply = self.handle(EndResume()).reply
        if not self.closed:
            self.pending = max(0, self.pending - 1)
            assert reply == self.settle()

    @rule(lease=st.integers(0, 12))
    def settle_lease(self, lease: int) -> None:
        reply = self.handle(SettleLeaseGeneration(lease_generation=lease)).reply
        if not self.closed:
            self.orphan = max(self.orphan or 0, lease)
            assert reply == self.settle()

    @rule(generation=st.integers(0, 6))
    def ask_attachment(self, generation: int) -> None:
        has = self.handle(HasAttachment()).reply
        current = self.handle(IsCurrentAttachment(attachment_generation=generation)).reply
        if not self.closed:
            assert has is self.attached
            assert current is (self.attached and generation == self.generation)

    @rule(
        pick=st.sampled_from(["current", "recovery", "old", "garbage"]),
        behind=st.integers(0, 3),
        factory=st.booleans(),
        lease=st.none() | st.integers(0, 12),
    )
    def resume(self, pick: str, behind: int, factory: bool, lease: int | None) -> None:
        token = {
            "current": self.token,
            "recovery": self.recovery or "garbage",
            "old": self.issued[max(0, len(self.issued) - 1 - behind)],
            "garbage": "g" * 43,
        }[pick]
        head = self.state.journal.last_sequence
        command = Resume(
            resume_token=token,
            last_received_server_event_seq=max(0, head - behind),
            send=wire_send,
            close=wire_close,
            activation_payload_factory=activation_payload if factory else None,
            lease_generation=lease,
        )
        transition = self.handle(command)
        if self.closed:
            return
        valid = token == self.token or (not self.attached and token == self.recovery)
        if not valid:
            assert isinstance(transition.error, InvalidResumeTokenError)
            return
        if transition.error is not None:
            assert isinstance(transition.error, JournalGapError | InvalidSequenceError)
            return
        reply: Any = transition.reply
        self.token, self.recovery = reply.resume_token.plaintext, None
        self.issued.append(self.token)
        self.generation += 1
        assert reply.attachment_generation == self.generation
        self.attached, self.detached_at = True, None
        self.lease = max(self.lease, lease or 0, self.orphan or 0)
        self.orphan = None
        if factory:
            self.in_flight[self.generation] = token

    @rule(pick=st.integers(0, 3), delivered=st.booleans())
    def activation_outcome(self, pick: int, delivered: bool) -> None:
        known = [*sorted(self.in_flight), self.generation + 1]
        generation = known[min(pick, len(known) - 1)]
        self.handle(ActivationOutcome(attachment_generation=generation, delivered=delivered))
        if self.closed or generation not in self.in_flight:
            return
        presented = self.in_flight.pop(generation)
        if not delivered and generation == self.generation:
            if self.attached:
                self.detach()
            self.recovery = presented
            self.orphan = max(self.orphan or 0, self.lease)

    @rule(dt=st.sampled_from([0.0, 1.0, 2.5, 3.0, 6.0]))
    def tick(self, dt: float) -> None:
        self.clock.advance(dt)
        reply: Any = self.handle(Tick(now=self.clock.now)).reply
        if not self.closed:
            expired = (
                self.detached_at is not None
                and self.pending == 0
                and not self.in_flight
                and self.clock.now - self.detached_at >= 3.0
            )
            assert reply.expired is expired

    @precondition(lambda self: self.steps > 20)
    @rule()
    def close(self) -> None:
        closing = self.handle(Close())
        if not self.closed:
            assert closing.error is None
            assert (closing.reply is not None) is self.attached
        self.closed = True

    @invariant()
    def state_matches_its_invariants_and_the_model(self) -> None:
        self.state.check_invariants()
        assert self.state.closed is self.closed
        if self.closed:
            return
        assert (self.state.attachment is not None) is self.attached
        assert self.state.attachment_generation == self.generation
        assert self.state.lease_generation == self.lease
        assert self.state.pending_resumes == self.pending
        assert self.state.orphaned_lease_generation == self.orphan
        assert self.state.activation_in_flight is bool(self.in_flight)


SessionMachine.TestCase.settings = settings(deadline=None, max_examples=120, stateful_step_count=40)
test_session_state_under_random_commands = SessionMachine.TestCase
