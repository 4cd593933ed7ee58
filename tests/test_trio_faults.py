"""Slow, hung and failing transports through the trio door, and FaultPlan's transport faults."""

from __future__ import annotations

import logging

import pytest
import trio
import trio.testing

from supervisor import SendTimeoutError
from supervisor._faults import FaultPlan
from tests.trio_support import LIMIT, Events, Outcome, Wire, activation, registry, settled


async def test_a_hung_send_delays_neither_another_session_nor_its_own_control() -> None:
    with trio.fail_after(LIMIT):
        async with registry() as reg:
            old, other = Wire(), Wire()
            created = await reg.create("a", send=old.send, close=old.close)
            await reg.create("b", send=other.send, close=other.close)
            old_gate = old.hold(1)
            hung = Outcome()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(hung.run, lambda: reg.send_event("a", {"n": 1}))
                await old_gate.entered.wait()
                for n in range(3):
                    await reg.send_event("b", {"n": n})
                assert other.seqs() == [1, 2, 3]
                assert await reg.acknowledge("a", 0) == 0
                # A new connection takes over while the old send hangs.
                new = Wire()
                result = await reg.resume(
                    "a",
                    resume_token=created.resume_token.plaintext,
                    last_received_server_event_seq=0,
                    send=new.send,
                    close=new.close,
                    activation_payload_factory=activation,
                )
                assert result.attachment_generation == 2
                assert new.seqs() == [None, 1]
                # The hung caller is answered as if its attachment went away.
                await hung.done.wait()
                assert hung.error is None
                assert hung.value.sequence == 1
                # The new connection hangs too; its owner still detaches it.
                new_gate = new.hold(3)
                nursery.start_soon(reg.send_event, "a", {"n": 2})
                await new_gate.entered.wait()
                assert await reg.detach("a", attachment_generation=2) is True
                await reg.send_event("b", {"n": 3})
                assert other.seqs() == [1, 2, 3, 4]
                old_gate.release()
                new_gate.release()
            await settled(reg, "a")
            assert old.seqs() in ([], [1])  # the hung frame, if it got out; nothing after
            assert new.seqs() in ([None, 1], [None, 1, 2])
            assert old.closes == new.closes == other.closes == []


async def test_a_send_timeout_closes_the_transport_and_the_owner_still_detaches() -> None:
    events = Events()
    with trio.fail_after(LIMIT):
        async with registry(send_timeout_s=0.2, observer=events) as reg:
            wire = Wire()
            created = await reg.create("s", send=wire.send, close=wire.close)
            await reg.send_event("s", {"n": 1})
            wire.hold(2)  # never released
            with pytest.raises(SendTimeoutError) as caught:
                await reg.send_event("s", {"n": 2})
            assert isinstance(caught.value, TimeoutError)
            await wire.closed.wait()
            assert wire.closes == ["send_timeout"]
            event = await events.wait_for("send_timeout", "s")
            assert (event.reason, event.attachment_generation) == ("send_timeout", 1)
            # The library gave up on the wire, not on the attachment: the
            # owner detaches. Events meanwhile are journaled, not sent.
            later = await reg.send_event("s", {"n": 3})
            assert later is not None
            assert later.sequence == 3
            assert await reg.has_attachment("s") is True
            assert await reg.detach("s") is True
            assert wire.seqs() == [1]
            assert wire.closes == ["send_timeout"]
            result = await reg.resume(
                "s",
                resume_token=created.resume_token.plaintext,
                last_received_server_event_seq=1,
                send=Wire().send,
                close=Wire().close,
            )
            assert [e.sequence for e in result.replay_entries] == [2, 3]


async def test_a_failed_nowait_send_closes_the_transport_with_send_failed() -> None:
    events = Events()
    with trio.fail_after(LIMIT):
        async with registry(observer=events) as reg:
            wire = Wire()
            created = await reg.create("s", send=wire.send, close=wire.close)
            wire.fail(1, ConnectionResetError("gone"))
            reg.send_event_nowait("s", {"n": 1})
            await wire.closed.wait()
            assert wire.closes == ["send_failed"]
            event = await events.wait_for("send_failed", "s")
            assert event.attachment_generation == 1
            assert await reg.detach("s") is True
            result = await reg.resume(
                "s",
                resume_token=created.resume_token.plaintext,
                last_received_server_event_seq=0,
                send=Wire().send,
                close=Wire().close,
            )
            assert [e.sequence for e in result.replay_entries] == [1]


async def test_a_rejected_nowait_payload_is_logged_and_consumes_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="duplex_supervisor")
    with trio.fail_after(LIMIT):
        async with registry() as reg:
            wire = Wire()
            await reg.create("s", send=wire.send, close=wire.close)
            reg.send_event_nowait("s", {"x": float("nan")})
            entry = await reg.send_event("s", {"n": 1})
            assert entry is not None
            assert entry.sequence == 1
            assert wire.seqs() == [1]
            assert wire.closes == []
    assert any("was refused: InvalidPayloadError" in r.getMessage() for r in caplog.records)


async def test_fault_plan_fail_send_hits_the_nth_send_of_an_attachment() -> None:
    plan = FaultPlan()
    with trio.fail_after(LIMIT):
        async with registry(faults=plan) as reg:
            wire = Wire()
            created = await reg.create("s", send=wire.send, close=wire.close)
            error = ConnectionAbortedError("injected")
            plan.fail_send("s", nth=2, error=error)
            plan.fail_send("s", nth=1, generation=2)
            await reg.send_event("s", {"n": 1})
            with pytest.raises(ConnectionAbortedError) as caught:
                await reg.send_event("s", {"n": 2})
            assert caught.value is error
            await reg.send_event("s", {"n": 3})
            assert wire.seqs() == [1, 3]
            # Generation 2's first send is its activation: rolled back.
            with pytest.raises(ConnectionResetError):
                await reg.resume(
                    "s",
                    resume_token=created.resume_token.plaintext,
                    last_received_server_event_seq=3,
                    send=Wire().send,
                    close=Wire().close,
                    activation_payload_factory=activation,
                )
            assert await reg.has_attachment("s") is False
            retry = Wire()
            await reg.resume(
                "s",
                resume_token=created.resume_token.plaintext,
                last_received_server_event_seq=3,
                send=retry.send,
                close=retry.close,
                activation_payload_factory=activation,
            )
            assert retry.frames == [{"type": "session.resumed", "attachment_generation": 3}]
            assert plan.fired["send.fail"] == 2


async def test_fault_plan_delay_send_keeps_the_wire_in_order() -> None:
    plan = FaultPlan()
    with trio.fail_after(LIMIT):
        async with registry(faults=plan) as reg:
            wire = Wire()
            await reg.create("s", send=wire.send, close=wire.close)
            plan.delay_send("s", nth=2, seconds=0.05)
            for n in range(1, 5):
                reg.send_event_nowait("s", {"n": n})
            last = await reg.send_event("s", {"n": 5})
            assert last is not None
            assert wire.seqs() == [1, 2, 3, 4, 5]
            assert plan.fired["send.delay"] == 1
            assert wire.closes == []


async def test_fault_plan_hang_send_runs_into_the_send_timeout() -> None:
    plan = FaultPlan()
    events = Events()
    with trio.fail_after(LIMIT):
        async with registry(faults=plan, send_timeout_s=0.2, observer=events) as reg:
            wire, other = Wire(), Wire()
            await reg.create("s", send=wire.send, close=wire.close)
            await reg.create("t", send=other.send, close=other.close)
            plan.hang_send("s", nth=1)
            with pytest.raises(SendTimeoutError):
                await reg.send_event("s", {"n": 1})
            await wire.closed.wait()
            assert wire.closes == ["send_timeout"]
            assert wire.frames == []
            await events.wait_for("send_timeout", "s")
            assert "send_timeout" not in events.kinds("t")
            assert await reg.send_event("t", {"n": 1}) is not None
            assert other.seqs() == [1]
            assert await reg.detach("s") is True


async def test_fault_plan_fail_close_is_logged_and_breaks_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="duplex_supervisor")
    plan = FaultPlan()
    events = Events()
    with trio.fail_after(LIMIT):
        async with registry(faults=plan, observer=events) as reg:
            wire = Wire()
            created = await reg.create("s", send=wire.send, close=wire.close)
            plan.fail_close("s")
            plan.fail_send("s", nth=1)
            reg.send_event_nowait("s", {"n": 1})  # nobody waits: the library closes
            await events.wait_for("send_failed", "s")
            await settled(reg, "s")
            await trio.testing.wait_all_tasks_blocked()
            assert plan.fired["close.fail"] == 1
            assert wire.closes == []  # the injected failure came before close
            assert await reg.detach("s") is True
            new = Wire()
            await reg.resume(
                "s",
                resume_token=created.resume_token.plaintext,
                last_received_server_event_seq=0,
                send=new.send,
                close=new.close,
                activation_payload_factory=activation,
            )
            assert await reg.send_event("s", {"n": 2}) is not None
            assert new.seqs() == [None, 1, 2]
    failures = [r for r in caplog.records if "closing a transport" in r.getMessage()]
    assert len(failures) == 1
    assert failures[0].levelno == logging.WARNING
