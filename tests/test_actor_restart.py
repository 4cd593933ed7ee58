"""Crashes at every failpoint, through the real actors, and the restart budget."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import pytest

from actors._commands import AbortResume
from actors._errors import (
    InvalidResumeTokenError,
    JournalGapError,
    SessionCrashedError,
)
from actors._state import FAILPOINTS
from supervisor._faults import FaultPlan, InjectedFaultError
from supervisor._policy import RestartPolicy
from supervisor.doors._threads import ThreadSessionRegistry
from tests.actor_support import (
    WAIT,
    Background,
    Events,
    FakeClock,
    GatedPlan,
    Wire,
    activation,
    registry,
    settle,
)
from tests.helpers import ThreadReply

INTERNAL = ("activation_outcome.", "abort_resume.", "tick.")
QUEUED = 20


@dataclass
class Ctx:
    reg: ThreadSessionRegistry
    plan: GatedPlan
    clock: FakeClock
    wire: Wire
    token: str
    wire2: Wire = field(default_factory=Wire)
    accepted: list[str] = field(default_factory=list)
    new_token: str | None = None
    #: A resume whose activation's outcome is the crashing command: it runs
    #: on the registry's loop, which the gate holds, so it is not waited on.
    resuming: Background | None = None


def _failing_send(frame: dict[str, object]) -> None:
    raise ConnectionError("client went away")


def _start(ctx: Ctx, failpoint: str) -> Background | None:
    """Prepare and issue the call that will crash at ``failpoint``."""
    reg, s = ctx.reg, "s"
    if failpoint.startswith("send_event."):
        return Background(
            lambda: reg.send_event(s, {"n": "crash"}, on_accepted=lambda: ctx.accepted.append("x"))
        )
    if failpoint.startswith("acknowledge."):
        return Background(lambda: reg.acknowledge(s, 2))
    if failpoint.startswith("release_attachment."):
        return Background(lambda: reg.release_attachment(s))
    if failpoint.startswith("begin_resume."):
        return Background(lambda: reg.begin_resume(s))
    if failpoint.startswith("end_resume."):
        reg.begin_resume(s)
        return Background(lambda: reg.end_resume(s))
    if failpoint.startswith("settle_lease_generation."):
        return Background(lambda: reg.settle_lease_generation(s, 7))
    if failpoint.startswith("has_attachment."):
        return Background(lambda: reg.has_attachment(s))
    if failpoint.startswith("is_current_attachment."):
        return Background(lambda: reg.is_current_attachment(s, 1))
    if failpoint.startswith("authenticate_resume."):
        return Background(
            lambda: reg.authenticate_resume(
                s, resume_token=ctx.token, last_received_server_event_seq=0
            )
        )
    if failpoint.startswith("resume."):
        return Background(
            lambda: reg.resume(
                s,
                resume_token=ctx.token,
                last_received_server_event_seq=2,
                send=ctx.wire2.send_blocking,
                close=ctx.wire2.close_blocking,
                activation_payload_factory=activation,
            )
        )
    if failpoint.startswith("activation_outcome."):
        send = ctx.wire2.send_blocking if failpoint.endswith(".enter") else _failing_send
        ctx.resuming = Background(
            lambda: reg.resume(
                s,
                resume_token=ctx.token,
                last_received_server_event_seq=2,
                send=send,
                close=ctx.wire2.close_blocking,
                activation_payload_factory=activation,
            )
        )
        return None
    if failpoint.startswith("abort_resume."):
        # A resume whose caller was cancelled before it saw the result: the
        # door sends AbortResume as an internal command.
        result = reg.resume(
            s,
            resume_token=ctx.token,
            last_received_server_event_seq=2,
            send=ctx.wire2.send_blocking,
            close=ctx.wire2.close_blocking,
        )
        generation = result.attachment_generation

        def abort() -> object:
            reply = ThreadReply()
            command = AbortResume(attachment_generation=generation)
            reg.system.call(s, command, reply, internal=True)
            return reply.wait(WAIT)

        return Background(abort)
    if failpoint.startswith("tick."):
        ctx.clock.now += 61  # past the TTL: the tick has something to prune
        return Background(reg.sweep)
    if failpoint.startswith("close."):
        return Background(lambda: reg.close(s))
    raise AssertionError(f"no scenario for {failpoint}")


def _check_state(ctx: Ctx, failpoint: str) -> None:
    """The crashed command left no trace (read through public answers)."""
    reg, s = ctx.reg, "s"
    if failpoint.startswith("acknowledge."):
        assert reg.acknowledge(s, 2) == 2  # nothing was removed by the crashed ack
    elif failpoint.startswith(("release_attachment.", "has_attachment.", "is_current")):
        assert reg.has_attachment(s) is True
        assert reg.is_current_attachment(s, 1) is True
    elif failpoint.startswith("begin_resume."):
        reg.detach(s)
        assert reg.settle_lease_generation(s, 5) == 5  # no pending resume claimed
    elif failpoint.startswith("end_resume."):
        reg.detach(s)
        assert reg.settle_lease_generation(s, 5) is None  # still one claim pending
        assert reg.end_resume(s) == 5
    elif failpoint.startswith("settle_lease_generation."):
        released = reg.release_attachment(s)
        assert released is not None
        assert released.lease_generation == 0
    elif failpoint.startswith(("authenticate_resume.", "resume.")):
        assert reg.is_current_attachment(s, 1) is True
        assert list(ctx.wire2.frames) == []
        reg.authenticate_resume(s, resume_token=ctx.token, last_received_server_event_seq=0)
        result = reg.resume(
            s,
            resume_token=ctx.token,
            last_received_server_event_seq=0,
            send=ctx.wire2.send_blocking,
            close=ctx.wire2.close_blocking,
        )
        assert result.attachment_generation == 2
        assert [e.sequence for e in result.replay_entries] == list(range(1, QUEUED + 5))
    elif failpoint == "activation_outcome.enter":
        assert ctx.new_token is not None
        with pytest.raises(InvalidResumeTokenError):
            reg.authenticate_resume(s, resume_token=ctx.token, last_received_server_event_seq=0)
        reg.authenticate_resume(s, resume_token=ctx.new_token, last_received_server_event_seq=0)
        assert reg.is_current_attachment(s, 2) is True
    elif failpoint == "activation_outcome.rolled_back" or failpoint.startswith("abort_resume."):
        # The retried outcome (or abort) rolled the resume back: detached, the
        # presented token works again (once), the replay is dense.
        assert reg.has_attachment(s) is False
        result = reg.resume(
            s,
            resume_token=ctx.token,
            last_received_server_event_seq=2,
            send=ctx.wire2.send_blocking,
            close=ctx.wire2.close_blocking,
        )
        assert [e.sequence for e in result.replay_entries] == list(range(3, QUEUED + 5))
    elif failpoint.startswith("tick."):
        # The retried tick pruned the expired events 1 and 2.
        with pytest.raises(JournalGapError) as info:
            reg.authenticate_resume(s, resume_token=ctx.token, last_received_server_event_seq=0)
        assert info.value.reason == "ttl"
        reg.authenticate_resume(s, resume_token=ctx.token, last_received_server_event_seq=2)
    elif failpoint.startswith("close."):
        assert reg.has_attachment(s) is True
        assert reg.session_ids() == ["s"]
        entry = reg.send_event(s, {"n": "after"})
        assert entry is not None
        assert entry.sequence == 3
        closed = reg.close(s)
        assert closed is not None
        assert closed.generation == 1
        assert reg.session_ids() == []


def _live_wire(ctx: Ctx, failpoint: str) -> Wire | None:
    """Where events sent after the crash land (``None``: detached)."""
    if failpoint == "activation_outcome.enter":
        return ctx.wire2
    if failpoint == "activation_outcome.rolled_back" or failpoint.startswith("abort_resume."):
        return None
    return ctx.wire


def _check_crashed_call(failpoint: str, call: Background) -> None:
    """What the caller of the crashed command heard."""
    error = call.error()
    if failpoint.startswith("tick."):
        assert error is None  # a sweep answers whatever each tick did
    elif failpoint.startswith("abort_resume."):
        # Retried after the crash: its waiter gets the retry's answer.
        assert error is None
        assert call.result() is True
    else:
        assert isinstance(error, SessionCrashedError), repr(error)
        assert isinstance(error.__cause__, InjectedFaultError)


@pytest.mark.parametrize("failpoint", FAILPOINTS)
def test_crash_once_at_every_failpoint(failpoint: str) -> None:
    plan = GatedPlan()
    clock = FakeClock()
    events = Events()
    with registry(clock=clock, faults=plan, observer=events) as reg:
        wire = Wire()
        created = reg.create("s", send=wire.send_blocking, close=wire.close_blocking)
        ctx = Ctx(reg=reg, plan=plan, clock=clock, wire=wire, token=created.resume_token.plaintext)
        reg.send_events("s", [{"n": 1}, {"n": 2}])
        assert wire.sequences() == [1, 2]

        plan.crash(failpoint, session_id="s")
        plan.gate(failpoint, "s")
        closing = failpoint.startswith("close.")
        call = _start(ctx, failpoint)
        assert plan.reached.wait(WAIT), f"{failpoint} never reached"
        # Queue messages behind the one that is about to crash.
        if not closing:
            for i in range(QUEUED):
                reg.send_event_nowait("s", {"n": f"q{i}"})
        plan.release.set()

        if ctx.resuming is not None:
            if failpoint.endswith(".enter"):
                ctx.new_token = ctx.resuming.result().resume_token.plaintext
            else:
                assert isinstance(ctx.resuming.error(), ConnectionError)
        if call is not None:
            _check_crashed_call(failpoint, call)

        if not closing:
            final = reg.send_event("s", {"n": "final"})
            assert final is not None
            assert final.sequence == QUEUED + 3
            live = _live_wire(ctx, failpoint)
            if live is not None:
                seqs = live.sequences()
                assert seqs[-(QUEUED + 1) :] == list(range(3, QUEUED + 4))
                assert seqs == sorted(set(seqs))
            # The dispatcher is FIFO: once this on_accepted ran, a crashed
            # one would have run before it.
            flushed = threading.Event()
            reg.send_event("s", {"n": "flush"}, on_accepted=flushed.set)
            assert flushed.wait(WAIT)
        # A round trip: the crashed call's caller is answered before the
        # session counts the restart.
        assert reg.is_current_attachment("s", 0) is False
        assert plan.fired[failpoint] == 1
        assert ctx.accepted == []
        for w in (ctx.wire, ctx.wire2):
            assert all(f.get("n") != "crash" for f in list(w.frames))

        stats = reg.stats()
        assert stats.crashes == 1
        assert stats.restarts == 1
        assert stats.sessions_failed == 0
        _check_state(ctx, failpoint)
        assert wire.closes == []
        events.wait_for("restarted", "s")
        assert "failed" not in events.kinds("s")


INTERNAL_FAILPOINTS = [f for f in FAILPOINTS if f.startswith(INTERNAL)]


@pytest.mark.parametrize("failpoint", INTERNAL_FAILPOINTS)
def test_internal_command_crashing_twice_fails_the_session(failpoint: str) -> None:
    plan = GatedPlan()
    clock = FakeClock()
    events = Events()
    with registry(clock=clock, faults=plan, observer=events) as reg:
        wire = Wire()
        created = reg.create("s", send=wire.send_blocking, close=wire.close_blocking)
        ctx = Ctx(reg=reg, plan=plan, clock=clock, wire=wire, token=created.resume_token.plaintext)
        reg.send_events("s", [{"n": 1}, {"n": 2}])
        plan.crash(failpoint, session_id="s", times=2)
        call = _start(ctx, failpoint)
        if call is not None and failpoint.startswith("abort_resume."):
            # Its waiter heard of the first crash; the retry's answer is dropped.
            assert isinstance(call.error(), SessionCrashedError)
        elif call is not None:
            call.result()
        events.wait_for("failed", "s")
        # The transport the session held when it failed is closed with the reason.
        if failpoint == "activation_outcome.rolled_back":
            # The attachment it held is the one whose activation failed: its
            # resume caller got the send error (and owns that connection).
            assert wire.closes == []
        else:
            holder = wire if failpoint.startswith("tick.") else ctx.wire2
            assert holder.closed.wait_blocking(WAIT)
            assert holder.closes == ["session_failed"]
        assert plan.fired[failpoint] == 2
        settle(reg, "s")
        with pytest.raises(KeyError):
            reg.send_event("s", {"n": "late"})
        assert reg.has_attachment("s") is False
        assert reg.session_ids() == []
        stats = reg.stats()
        assert stats.sessions_failed == 1
        assert stats.crashes == 2


def _crash_send(reg: ThreadSessionRegistry, plan: FaultPlan) -> None:
    plan.crash("send_event.recorded", session_id="s")
    with pytest.raises(SessionCrashedError):
        reg.send_event("s", {"n": "boom"})


def test_restart_budget_spent_within_window_fails_the_session() -> None:
    plan = FaultPlan()
    clock = FakeClock()
    events = Events()
    policy = RestartPolicy(max_restarts=2, within_s=60)
    with registry(clock=clock, faults=plan, observer=events, restart_policy=policy) as reg:
        wire = Wire()
        reg.create("s", send=wire.send_blocking, close=wire.close_blocking)
        _crash_send(reg, plan)
        clock.now += 10
        _crash_send(reg, plan)
        assert reg.send_event("s", {"n": "ok"}) is not None  # still alive after two
        clock.now += 10
        _crash_send(reg, plan)
        events.wait_for("failed", "s")
        settle(reg, "s")
        assert wire.closed.wait_blocking(WAIT)
        assert wire.closes == ["session_failed"]
        with pytest.raises(KeyError):
            reg.send_event("s", {"n": "late"})
        assert reg.stats().sessions_failed == 1
        assert reg.stats().restarts == 2


def test_crashes_spread_beyond_the_window_keep_the_session() -> None:
    plan = FaultPlan()
    clock = FakeClock()
    events = Events()
    policy = RestartPolicy(max_restarts=2, within_s=60)
    with registry(clock=clock, faults=plan, observer=events, restart_policy=policy) as reg:
        wire = Wire()
        reg.create("s", send=wire.send_blocking, close=wire.close_blocking)
        for _ in range(5):
            _crash_send(reg, plan)
            clock.now += 61
        entry = reg.send_event("s", {"n": "ok"})
        assert entry is not None
        assert entry.sequence == 1
        stats = reg.stats()
        assert stats.restarts == 5
        assert stats.sessions_failed == 0
        assert wire.closes == []
        assert "failed" not in events.kinds("s")
