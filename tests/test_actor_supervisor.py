"""Supervisor takeover, registries kept apart, and the observer."""

from __future__ import annotations

import logging

import pytest

from actors._commands import LifecycleEvent
from actors._errors import SessionCrashedError
from supervisor._faults import FaultPlan, InjectedFaultError
from tests.actor_support import Events, Wire, activation, registry


def test_supervisor_crash_is_taken_over_and_sessions_keep_their_state() -> None:
    plan = FaultPlan()
    with registry(faults=plan) as reg:
        wire = Wire()
        reg.create("a", send=wire.send_blocking, close=wire.close_blocking)
        reg.send_events("a", [{"n": 1}, {"n": 2}])
        plan.crash_supervisor()
        with pytest.raises(SessionCrashedError) as info:
            reg.create("b", send=Wire().send_blocking, close=lambda r: None)
        assert isinstance(info.value.__cause__, InjectedFaultError)
        # The session runs on; its state survived the supervisor.
        entry = reg.send_event("a", {"n": 3})
        assert entry is not None
        assert entry.sequence == 3
        assert wire.sequences() == [1, 2, 3]
        created = reg.create("b", send=Wire().send_blocking, close=lambda r: None)
        assert created.session_id == "b"
        assert reg.stats().supervisor_takeovers == 1
        assert sorted(reg.session_ids()) == ["a", "b"]
        assert reg.close("a") is not None
        assert reg.session_ids() == ["b"]


def test_two_registries_in_one_process_stay_apart() -> None:
    with registry() as one, registry() as two:
        w1, w2 = Wire(), Wire()
        one.create("s", send=w1.send_blocking, close=w1.close_blocking)
        two.create("s", send=w2.send_blocking, close=w2.close_blocking)
        one.send_events("s", [{"r": 1}, {"r": 1}])
        entry = two.send_event("s", {"r": 2})
        assert entry is not None
        assert entry.sequence == 1
        assert one.close("s") is not None
        assert one.has_attachment("s") is False
        assert two.has_attachment("s") is True
        assert w2.sequences() == [1]
        assert w1.sequences() == [1, 2]
        assert two.stats().sessions == 1


def test_observer_sees_lifecycle_and_never_a_token() -> None:
    events = Events()
    with registry(observer=events) as reg:
        created = reg.create("s", send=Wire().send_blocking, close=lambda r: None)
        tokens = [created.resume_token.plaintext]
        reg.detach("s")
        result = reg.resume(
            "s",
            resume_token=tokens[0],
            last_received_server_event_seq=0,
            send=Wire().send_blocking,
            close=lambda r: None,
            activation_payload_factory=activation,
        )
        tokens.append(result.resume_token.plaintext)
        reg.close("s")
        events.wait_for("closed", "s")
        kinds = events.kinds("s")
        assert kinds[:4] == ["created", "detached", "resumed", "closed"]
        for event in events.events:
            for token in tokens:
                assert token not in str(event)
                assert token not in repr(event)


def test_an_observer_that_raises_breaks_nothing(caplog: pytest.LogCaptureFixture) -> None:
    seen = Events()

    def observer(event: LifecycleEvent) -> None:
        seen(event)
        raise RuntimeError("observer bug")

    with caplog.at_level(logging.ERROR), registry(observer=observer) as reg:
        wire = Wire()
        reg.create("s", send=wire.send_blocking, close=wire.close_blocking)
        assert reg.detach("s") is True
        reg.send_event("s", {"n": 1})
        assert reg.close("s") is None  # detached: no attachment to hand back
        seen.wait_for("closed", "s")
        reg.create("s", send=wire.send_blocking, close=wire.close_blocking)
        assert reg.has_attachment("s") is True
    assert any("observer raised" in r.getMessage() for r in caplog.records)


def test_a_failed_nowait_send_on_a_resumed_attachment_reports_its_generation() -> None:
    events = Events()
    with registry(observer=events) as reg:
        created = reg.create("s", send=Wire().send_blocking, close=lambda r: None)
        reg.detach("s")

        def broken(frame: dict[str, object]) -> None:
            raise ConnectionResetError("peer went away")

        closed = Wire()
        resumed = reg.resume(
            "s",
            resume_token=created.resume_token.plaintext,
            last_received_server_event_seq=0,
            send=broken,
            close=closed.close_blocking,
        )
        assert resumed.attachment_generation == 2
        reg.send_event_nowait("s", {"n": 1})
        failed = events.wait_for("send_failed", "s")
        assert failed.attachment_generation == 2
        assert closed.closed.wait_blocking(5)
        assert closed.closes == ["send_failed"]
