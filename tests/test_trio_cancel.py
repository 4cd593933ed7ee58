"""Cancellation through the trio door: resume rollback, events that stay journaled."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from supervisor import InvalidResumeTokenError
from supervisor.doors._trio import TrioSessionRegistry
from tests.trio_support import LIMIT, Outcome, Wire, activation, registry, settled


async def _works_exactly_once(reg: TrioSessionRegistry, token: str, generation: int) -> None:
    """``token`` resumes the (detached) session once more, then never again."""
    assert await reg.has_attachment("s") is False
    wire = Wire()
    result = await reg.resume(
        "s",
        resume_token=token,
        last_received_server_event_seq=0,
        send=wire.send,
        close=wire.close,
        activation_payload_factory=activation,
    )
    assert result.attachment_generation == generation
    assert wire.seqs() == [None, 1]
    assert await reg.detach("s") is True
    with pytest.raises(InvalidResumeTokenError):
        await reg.authenticate_resume("s", resume_token=token, last_received_server_event_seq=0)


async def _detached_session(reg: TrioSessionRegistry) -> str:
    created = await reg.create("s", send=Wire().send, close=Wire().close)
    await reg.send_event("s", {"n": 1})
    assert await reg.detach("s") is True
    return created.resume_token.plaintext


async def test_a_resume_cancelled_before_its_activation_was_delivered_rolls_back() -> None:
    with trio.fail_after(LIMIT):
        async with registry() as reg:
            token = await _detached_session(reg)
            wire = Wire()
            gate = wire.hold(1)
            scope = trio.CancelScope()

            async def resume() -> None:
                with scope:
                    await reg.resume(
                        "s",
                        resume_token=token,
                        last_received_server_event_seq=0,
                        send=wire.send,
                        close=wire.close,
                        activation_payload_factory=activation,
                    )

            async with trio.open_nursery() as nursery:
                nursery.start_soon(resume)
                await gate.entered.wait()
                scope.cancel()
            # The caller's cancellation reached it (it did not return a result),
            # and its activation send was abandoned, never completed.
            assert scope.cancelled_caught
            assert wire.frames == []
            assert wire.closes == []
            assert await reg.has_attachment("s") is False
            assert reg.stats().rollbacks == 1  # read after a round trip to the session
            await _works_exactly_once(reg, token, generation=3)


async def test_a_resume_without_activation_cancelled_while_waiting_rolls_back() -> None:
    with trio.fail_after(LIMIT):
        async with registry() as reg:
            token = await _detached_session(reg)
            with trio.CancelScope() as scope:
                scope.cancel()  # the call leaves, then its wait is cancelled
                await reg.resume(
                    "s",
                    resume_token=token,
                    last_received_server_event_seq=0,
                    send=Wire().send,
                    close=Wire().close,
                )
            assert scope.cancelled_caught
            await _works_exactly_once(reg, token, generation=3)


@pytest.mark.parametrize("first_fails", [True, False], ids=["first-fails", "first-wins"])
async def test_a_resume_cancelled_while_queued_behind_an_activation(first_fails: bool) -> None:
    with trio.fail_after(LIMIT):
        async with registry() as reg:
            token = await _detached_session(reg)
            first_wire = Wire()
            gate = first_wire.hold(1)
            if first_fails:
                first_wire.fail(1, ConnectionResetError("activation lost"))
            first = Outcome()
            scope = trio.CancelScope()

            async def queued() -> None:
                with scope:
                    await reg.resume(
                        "s",
                        resume_token=token,
                        last_received_server_event_seq=0,
                        send=Wire().send,
                        close=Wire().close,
                    )

            async with trio.open_nursery() as nursery:
                nursery.start_soon(
                    first.run,
                    lambda: reg.resume(
                        "s",
                        resume_token=token,
                        last_received_server_event_seq=0,
                        send=first_wire.send,
                        close=first_wire.close,
                        activation_payload_factory=activation,
                    ),
                )
                await gate.entered.wait()
                nursery.start_soon(queued)
                await settled(reg, "s")
                scope.cancel()
                await trio.testing.wait_all_tasks_blocked()
                gate.release()
            assert scope.cancelled_caught
            if first_fails:
                # The queued resume won through the recovered token, but its
                # caller had gone: rolled back too, so the token works once more.
                assert isinstance(first.error, ConnectionResetError)
                await _works_exactly_once(reg, token, generation=4)
            else:
                assert first.error is None
                assert first.value.attachment_generation == 2
                assert await reg.is_current_attachment("s", 2) is True
                with pytest.raises(InvalidResumeTokenError):
                    await reg.authenticate_resume(
                        "s", resume_token=token, last_received_server_event_seq=0
                    )


async def test_send_event_callers_cancelled_after_the_call_left_keep_events_and_order() -> None:
    with trio.fail_after(LIMIT):
        async with registry() as reg:
            wire = Wire()
            created = await reg.create("s", send=wire.send, close=wire.close)
            gate = wire.hold(1)
            first, last = Outcome(), Outcome()
            queued_scope = trio.CancelScope()
            accepted: list[str] = []

            async def queued() -> None:
                with queued_scope:
                    await reg.send_event("s", {"n": 2})

            async with trio.open_nursery() as nursery:
                nursery.start_soon(first.run, lambda: reg.send_event("s", {"n": 1}))
                await gate.entered.wait()
                nursery.start_soon(queued)
                await settled(reg, "s")
                queued_scope.cancel()
                with trio.CancelScope() as at_once:
                    at_once.cancel()
                    await reg.send_event("s", {"n": 3}, on_accepted=lambda: accepted.append("n3"))
                assert at_once.cancelled_caught
                nursery.start_soon(last.run, lambda: reg.send_event("s", {"n": 4}))
                await settled(reg, "s")
                gate.release()
            assert queued_scope.cancelled_caught
            assert first.value.sequence == 1
            assert last.value.sequence == 4
            # on_accepted ran although its caller no longer waited.
            assert accepted == ["n3"]
            assert wire.frames == [{"n": n, "server_event_seq": n} for n in range(1, 5)]
            result = await reg.resume(
                "s",
                resume_token=created.resume_token.plaintext,
                last_received_server_event_seq=0,
                send=Wire().send,
                close=Wire().close,
            )
            assert [e.sequence for e in result.replay_entries] == [1, 2, 3, 4]


async def test_a_send_cancelled_while_waiting_for_room_never_happened() -> None:
    with trio.fail_after(LIMIT):
        async with registry(max_pending_per_session=1) as reg:
            wire = Wire()
            await reg.create("s", send=wire.send, close=wire.close)
            gate = wire.hold(1)
            reg.send_event_nowait("s", {"n": 1})
            await gate.entered.wait()
            with trio.move_on_after(0) as scope:
                await reg.send_event("s", {"n": "never"})
            assert scope.cancelled_caught
            gate.release()
            entry = await reg.send_event("s", {"n": 2})
            assert entry is not None
            assert entry.sequence == 2
            assert wire.frames == [{"n": 1, "server_event_seq": 1}, {"n": 2, "server_event_seq": 2}]


async def test_closing_a_session_answers_callers_waiting_on_its_frames() -> None:
    with trio.fail_after(LIMIT):
        async with registry() as reg:
            wire = Wire()
            await reg.create("s", send=wire.send, close=wire.close)
            gate = wire.hold(1)
            sending = [Outcome(), Outcome()]
            async with trio.open_nursery() as nursery:
                nursery.start_soon(sending[0].run, lambda: reg.send_event("s", {"n": 1}))
                await gate.entered.wait()
                nursery.start_soon(sending[1].run, lambda: reg.send_event("s", {"n": 2}))
                await settled(reg, "s")
                closed = await reg.close("s")
                assert closed is not None
                assert closed.generation == 1
            # As if the attachment had gone away: journaled, no error.
            assert [o.error for o in sending] == [None, None]
            assert [o.value.sequence for o in sending] == [1, 2]
            gate.release()
            await trio.testing.wait_all_tasks_blocked()
            assert wire.seqs() == [1]
            assert wire.closes == []
            assert reg.session_ids() == []


async def test_a_create_cancelled_before_its_caller_saw_the_token_leaves_no_session() -> None:
    with trio.fail_after(LIMIT):
        async with registry() as reg:
            lost = Wire()
            with trio.CancelScope() as scope:
                scope.cancel()  # the call leaves, then its wait is cancelled
                await reg.create("s", send=lost.send, close=lost.close)
            assert scope.cancelled_caught
            # Nobody holds its token: it must not linger attached to a dead
            # outbox, swallowing events and blocking the id.
            assert reg.session_ids() == []
            assert await reg.has_attachment("s") is False
            wire = Wire()
            created = await reg.create("s", send=wire.send, close=wire.close)
            assert created.attachment_generation == 1
            await reg.send_event("s", {"n": 1})
            assert wire.seqs() == [1]
            assert lost.frames == []
            assert lost.closes == []
