"""The asyncio front door (``supervisor.doors._asyncio.open_session_registry``).

Strict input, send timeouts, hung transports that stall nobody else,
cancellation rollback, ``send_event_nowait`` order, backpressure, transport
faults from a `FaultPlan`, and a clean exit. Real actors throughout.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest

from actors._commands import ResumeResult
from supervisor import (
    InvalidInputError,
    InvalidPayloadError,
    InvalidResumeTokenError,
    InvalidSequenceError,
    InvalidSessionIdError,
    RegistryClosedError,
    SendTimeoutError,
)
from supervisor._faults import FaultPlan
from supervisor.doors._asyncio import AsyncioSessionRegistry
from tests.asyncio_support import (
    Events,
    TokenCatcher,
    Wire,
    door,
    duplex_threads,
    run,
    spin,
)


async def _resume(
    reg: AsyncioSessionRegistry,
    session_id: str,
    token: str,
    wire: Wire,
    *,
    seq: int = 0,
    factory: TokenCatcher | None = None,
) -> ResumeResult:
    return await reg.resume(
        session_id,
        resume_token=token,
        last_received_server_event_seq=seq,
        send=wire.send,
        close=wire.close,
        activation_payload_factory=factory,
    )


BAD_PAYLOADS: dict[str, Any] = {
    "nan": {"score": math.nan},
    "infinity": {"score": math.inf},
    "int_key": {1: "one"},
    "pairs": [("type", "delta")],
    "bytes": {"chunk": b"\x00"},
}


def test_strict_input_is_rejected_and_consumes_nothing() -> None:
    async def scenario() -> None:
        async with door() as reg:
            wire = Wire()
            created = await reg.create("s1", send=wire.send, close=wire.close)
            token = created.resume_token.plaintext
            for name, payload in BAD_PAYLOADS.items():
                with pytest.raises(InvalidPayloadError) as info:
                    await reg.send_event("s1", payload)
                assert isinstance(info.value, TypeError), name
                assert isinstance(info.value, ValueError), name
            with pytest.raises(InvalidPayloadError):
                await reg.send_event("s1", [("a", 1)], journal=False)  # type: ignore[arg-type]
            bad_seqs: tuple[Any, ...] = (True, False, "1", 1.0)
            for bad_seq in bad_seqs:
                with pytest.raises(InvalidSequenceError):
                    await reg.acknowledge("s1", bad_seq)
                with pytest.raises(InvalidInputError):
                    await reg.authenticate_resume(
                        "s1", resume_token=token, last_received_server_event_seq=bad_seq
                    )
                with pytest.raises(InvalidInputError):
                    await _resume(reg, "s1", token, Wire(), seq=bad_seq)
            for bad_id in ("", 5):
                with pytest.raises(InvalidSessionIdError):
                    await reg.create(bad_id, send=wire.send, close=wire.close)  # type: ignore[arg-type]
            # Nothing was consumed: the first good event is sequence 1, the token unchanged.
            assert await reg.send_event("s1", {"chunk": b"\x00"}, journal=False) is None
            entry = await reg.send_event("s1", {"ok": True})
            assert entry is not None and entry.sequence == 1
            assert wire.frames == [{"chunk": b"\x00"}, {"ok": True, "server_event_seq": 1}]
            assert reg.session_ids() == ["s1"]
            await reg.authenticate_resume(
                "s1", resume_token=token, last_received_server_event_seq=1
            )

    run(scenario)


def test_send_timeout_closes_the_transport_and_the_owner_still_detaches() -> None:
    async def scenario() -> None:
        events = Events()
        async with door(send_timeout_s=0.2, observer=events) as reg:
            wire, later = Wire(), Wire()
            gate = wire.hold(1)
            created = await reg.create("s1", send=wire.send, close=wire.close)
            with pytest.raises(SendTimeoutError) as info:
                await reg.send_event("s1", {"n": 1})
            assert isinstance(info.value, TimeoutError)
            event = await events.wait_for("send_timeout", "s1")
            assert (event.reason, event.attachment_generation) == ("send_timeout", 1)
            await wire.closed.wait()
            assert wire.closes == ["send_timeout"]
            assert gate.cancelled  # the hung send itself was given up on
            # Still attached until its owner says so; later frames go nowhere.
            assert await reg.has_attachment("s1")
            entry = await reg.send_event("s1", {"n": 2})
            assert entry is not None and entry.sequence == 2
            assert await reg.detach("s1") is True
            assert await reg.detach("s1") is False
            result = await _resume(
                reg, "s1", created.resume_token.plaintext, later, factory=TokenCatcher()
            )
            assert later.seqs() == [None, 1, 2] and result.attachment_generation == 2
            assert wire.frames == [] and wire.closes == ["send_timeout"]

    run(scenario)


@pytest.mark.parametrize("ending", ["detach", "takeover"])
def test_a_hung_send_stalls_neither_other_sessions_nor_its_own_control(ending: str) -> None:
    async def scenario() -> None:
        async with door(send_timeout_s=None, drain_timeout_s=0.1) as reg:
            hung, other, new = Wire(), Wire(), Wire()
            gate = hung.hold(1)
            created = await reg.create("a", send=hung.send, close=hung.close)
            await reg.create("b", send=other.send, close=other.close)
            stuck = asyncio.create_task(reg.send_event("a", {"n": 1}))
            await gate.entered.wait()
            queued = asyncio.create_task(reg.send_event("a", {"n": 2}))
            await spin()
            for n in range(3):
                await reg.send_event("b", {"n": n})
            assert other.seqs() == [1, 2, 3]
            assert await reg.acknowledge("a", 1) == 1
            assert await reg.is_current_attachment("a", 1)
            if ending == "detach":
                assert await reg.detach("a") is True
            else:
                result = await _resume(
                    reg, "a", created.resume_token.plaintext, new, seq=1, factory=TokenCatcher()
                )
                assert result.replaced_attachment is not None
                assert result.replaced_attachment.generation == 1
                assert new.seqs() == [None, 2]
            # The stalled callers return as if their attachment had gone away.
            first, second = await stuck, await queued
            assert first is not None and second is not None
            assert (first.sequence, second.sequence) == (1, 2)
            assert not gate.cancelled and hung.frames == [] and hung.closes == []

    run(scenario)


def test_a_resume_cancelled_during_its_activation_rolls_back() -> None:
    async def scenario() -> None:
        async with door() as reg:
            old, new, third = Wire(), Wire(), Wire()
            created = await reg.create("s1", send=old.send, close=old.close)
            token = created.resume_token.plaintext
            await reg.send_event("s1", {"n": 1})
            gate = new.hold(1)
            task = asyncio.create_task(_resume(reg, "s1", token, new, factory=TokenCatcher()))
            await gate.entered.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert gate.cancelled and new.frames == []
            assert not await reg.has_attachment("s1")
            result = await _resume(reg, "s1", token, third, factory=TokenCatcher())
            assert (result.attachment_generation, third.seqs()) == (3, [None, 1])
            assert await reg.detach("s1")
            with pytest.raises(InvalidResumeTokenError):
                await _resume(reg, "s1", token, Wire())

    run(scenario)


def test_a_resume_cancelled_before_the_session_saw_it_rolls_back() -> None:
    async def scenario() -> None:
        async with door() as reg:
            old, new = Wire(), Wire()
            created = await reg.create("s1", send=old.send, close=old.close)
            token = created.resume_token.plaintext
            task = asyncio.create_task(_resume(reg, "s1", token, new, factory=TokenCatcher()))
            await asyncio.sleep(0)  # the resume is posted; nothing came back yet
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert new.frames == []
            assert not await reg.has_attachment("s1")
            await _resume(reg, "s1", token, Wire())
            assert await reg.detach("s1")
            with pytest.raises(InvalidResumeTokenError):
                await _resume(reg, "s1", token, Wire())

    run(scenario)


def test_a_resume_without_factory_cancelled_while_waiting_rolls_back() -> None:
    async def scenario() -> None:
        async with door() as reg:
            old, first, second = Wire(), Wire(), Wire()
            created = await reg.create("s1", send=old.send, close=old.close)
            catcher = TokenCatcher()
            gate = first.hold(1)
            activating = asyncio.create_task(
                _resume(reg, "s1", created.resume_token.plaintext, first, factory=catcher)
            )
            await gate.entered.wait()
            presented = catcher.tokens[0].plaintext
            # Held back behind the activation on the wire, as the seed's lock did.
            waiting = asyncio.create_task(_resume(reg, "s1", presented, second))
            await spin()
            assert not waiting.done()
            waiting.cancel()
            await spin()
            gate.release()
            assert (await activating).attachment_generation == 2
            with pytest.raises(asyncio.CancelledError):
                await waiting
            # The resume landed after its caller left: rolled back, token usable once.
            assert not await reg.has_attachment("s1")
            assert second.frames == []
            result = await _resume(reg, "s1", presented, Wire())
            assert result.attachment_generation == 4
            assert await reg.detach("s1")
            with pytest.raises(InvalidResumeTokenError):
                await _resume(reg, "s1", presented, Wire())

    run(scenario)


def test_send_event_nowait_from_several_tasks_keeps_each_tasks_order() -> None:
    async def scenario() -> None:
        async with door() as reg:
            wire = Wire()
            await reg.create("s1", send=wire.send, close=wire.close)
            with pytest.raises(KeyError):
                reg.send_event_nowait("nope", {"n": 1})

            async def producer(task: int) -> None:
                for i in range(40):
                    reg.send_event_nowait("s1", {"task": task, "i": i})
                    if i % (task + 2) == 0:
                        await asyncio.sleep(0)

            await asyncio.gather(*(producer(task) for task in range(8)))
            last = await reg.send_event("s1", {"task": "last"})
            assert last is not None and last.sequence == 321
            assert wire.seqs() == list(range(1, 322))
            for task in range(8):
                mine = [f["i"] for f in wire.frames if f["task"] == task]
                assert mine == list(range(40)), task

    run(scenario)


def test_backpressure_at_the_cap() -> None:
    async def scenario() -> None:
        async with door(max_pending_per_session=4) as reg:
            wire = Wire()
            gate = wire.hold(1)
            await reg.create("s1", send=wire.send, close=wire.close)
            for n in range(1, 5):
                reg.send_event_nowait("s1", {"n": n})
            await gate.entered.wait()
            with pytest.raises(asyncio.QueueFull):
                reg.send_event_nowait("s1", {"n": "refused"})
            # An awaited send waits for room without reaching the session:
            # cancelled while waiting, it leaves no trace in the journal.
            gave_up = asyncio.create_task(reg.send_event("s1", {"n": "cancelled"}))
            await spin()
            gave_up.cancel()
            waiting = asyncio.create_task(reg.send_event("s1", {"n": 5}))
            await spin()
            assert not waiting.done()
            gate.release()
            entry = await waiting
            assert entry is not None and entry.sequence == 5
            assert [f["n"] for f in wire.frames] == [1, 2, 3, 4, 5]
            assert gave_up.cancelled()
            reg.send_event_nowait("s1", {"n": 6})  # room again

    run(scenario)


def test_fault_plan_fails_the_kth_send_of_one_attachment() -> None:
    async def scenario() -> None:
        plan = FaultPlan()
        error = ConnectionResetError("injected")
        plan.fail_send("s1", nth=2, generation=1, error=error)
        plan.fail_send("s1", nth=1, generation=2)
        async with door(faults=plan) as reg:
            wire, second, third = Wire(), Wire(), Wire()
            created = await reg.create("s1", send=wire.send, close=wire.close)
            token = created.resume_token.plaintext
            await reg.send_event("s1", {"n": 1})
            with pytest.raises(ConnectionResetError) as info:
                await reg.send_event("s1", {"n": 2})
            assert info.value is error
            await reg.send_event("s1", {"n": 3})
            assert wire.seqs() == [1, 3]
            assert await reg.detach("s1") is True
            # Generation 2's first send is its activation: it fails and rolls back.
            with pytest.raises(ConnectionResetError):
                await _resume(reg, "s1", token, second, factory=TokenCatcher())
            assert second.frames == []
            result = await _resume(reg, "s1", token, third, factory=TokenCatcher())
            assert third.seqs() == [None, 1, 2, 3]
            assert result.attachment_generation == 3
            assert plan.fired["send.fail"] == 2

    run(scenario)


def test_fault_plan_delays_a_send_without_reordering() -> None:
    async def scenario() -> None:
        plan = FaultPlan()
        plan.delay_send("s1", seconds=0.05, nth=2)
        async with door(faults=plan) as reg:
            wire = Wire()
            await reg.create("s1", send=wire.send, close=wire.close)
            for n in range(3):
                reg.send_event_nowait("s1", {"n": n})
            entry = await reg.send_event("s1", {"n": 3})
            assert entry is not None and entry.sequence == 4
            assert wire.seqs() == [1, 2, 3, 4]
            assert plan.fired["send.delay"] == 1

    run(scenario)


@pytest.mark.parametrize("close_fails", [True, False])
def test_fault_plan_fails_the_close_of_a_given_up_transport(close_fails: bool) -> None:
    async def scenario() -> None:
        plan = FaultPlan()
        plan.fail_send("s1", nth=1)
        if close_fails:
            plan.fail_close("s1")
        events = Events()
        async with door(faults=plan, observer=events) as reg:
            wire, later = Wire(), Wire()
            created = await reg.create("s1", send=wire.send, close=wire.close)
            reg.send_event_nowait("s1", {"n": 1})  # nobody waits: the library gives up
            event = await events.wait_for("send_failed", "s1")
            assert event.attachment_generation == 1
            await spin()
            await reg.has_attachment("s1")
            assert wire.closes == ([] if close_fails else ["send_failed"])
            assert plan.fired["close.fail"] == int(close_fails)
            assert await reg.detach("s1") is True
            await _resume(reg, "s1", created.resume_token.plaintext, later, factory=TokenCatcher())
            assert later.seqs() == [None, 1]

    run(scenario)


def test_the_asyncio_door_starts_no_thread_and_refuses_calls_after_exit() -> None:
    async def scenario() -> None:
        before = set(duplex_threads())
        async with door(drain_timeout_s=0.1) as reg:
            wires = {sid: Wire() for sid in ("a", "b", "c")}
            for sid, wire in wires.items():
                await reg.create(sid, send=wire.send, close=wire.close)
                await reg.send_event(sid, {"n": 1})
            wires["c"].hold(2)
            stuck = asyncio.create_task(reg.send_event("c", {"n": 2}))
            await spin()
            # The sessions and their supervisor run on this loop: no thread.
            assert [t for t in duplex_threads() if t not in before] == []
        assert [t for t in duplex_threads() if t not in before] == []
        await asyncio.wait({stuck}, timeout=5)
        assert stuck.done()
        with pytest.raises(RegistryClosedError):
            await reg.send_event("a", {"n": 3})

    run(scenario)
