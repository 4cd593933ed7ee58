"""The asyncio door's edges: leaving the context, cancelled callers, closing sessions."""

from __future__ import annotations

import asyncio

import pytest

from actors._ports import NO_WAITER
from supervisor import InvalidResumeTokenError, SessionError
from supervisor._faults import FaultPlan
from supervisor.doors._asyncio import AsyncioSessionRegistry
from tests.asyncio_support import Events, TokenCatcher, Wire, door, duplex_threads, run, spin


def test_leaving_the_context_drains_nowait_frames_still_on_their_way() -> None:
    async def scenario() -> None:
        wire = Wire()
        async with door() as reg:
            await reg.create("s1", send=wire.send, close=wire.close)
            for n in range(100):
                reg.send_event_nowait("s1", {"n": n})
        assert wire.seqs() == list(range(1, 101))

    run(scenario)


def test_a_repeatedly_cancelled_exit_still_stops_every_actor() -> None:
    async def scenario() -> None:
        before = set(duplex_threads())
        entered = asyncio.Event()
        box: list[AsyncioSessionRegistry] = []

        async def serve() -> None:
            async with door() as reg:
                box.append(reg)
                wire = Wire()
                await reg.create("s1", send=wire.send, close=wire.close)
                entered.set()
                await asyncio.Event().wait()

        task = asyncio.create_task(serve())
        await entered.wait()
        ours = [t for t in duplex_threads() if t not in before]
        task.cancel()
        await spin(2)  # now leaving the context: cancel it again, as anyio would
        task.cancel()
        try:
            with pytest.raises(asyncio.CancelledError):
                await task
            assert [t.name for t in ours if t.is_alive()] == []
        finally:
            # Should the door have left them running, do not hang the test run.
            box[0].system.shutdown(NO_WAITER)
            box[0].system.join()

    run(scenario)


def test_a_cancelled_create_leaves_no_session_behind() -> None:
    async def scenario() -> None:
        async with door() as reg:
            wire = Wire()
            task = asyncio.create_task(reg.create("s1", send=wire.send, close=wire.close))
            await asyncio.sleep(0)  # the create is posted
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert reg.session_ids() == []
            assert not await reg.has_attachment("s1")
            created = await reg.create("s1", send=wire.send, close=wire.close)
            assert created.attachment_generation == 1

    run(scenario)


def test_a_cancelled_send_stays_journaled_in_wire_order() -> None:
    async def scenario() -> None:
        async with door() as reg:
            wire = Wire()
            gate = wire.hold(1)
            await reg.create("s1", send=wire.send, close=wire.close)
            first = asyncio.create_task(reg.send_event("s1", {"n": 1}))
            await gate.entered.wait()
            accepted: list[int] = []
            second = asyncio.create_task(
                reg.send_event("s1", {"n": 2}, on_accepted=lambda: accepted.append(2))
            )
            await spin()
            await reg.has_attachment("s1")  # the second event reached the session
            second.cancel()
            with pytest.raises(asyncio.CancelledError):
                await second
            gate.release()
            await first
            third = await reg.send_event("s1", {"n": 3})
            assert third is not None and third.sequence == 3
            assert wire.seqs() == [1, 2, 3]
            assert accepted == [2]

    run(scenario)


def test_closing_a_session_releases_callers_waiting_on_its_wire() -> None:
    async def scenario() -> None:
        events = Events()
        async with door(observer=events, drain_timeout_s=0.1) as reg:
            wire = Wire()
            wire.hold(1)
            await reg.create("s1", send=wire.send, close=wire.close)
            stuck = asyncio.create_task(reg.send_event("s1", {"n": 1}))
            queued = asyncio.create_task(reg.send_event("s1", {"n": 2}))
            await spin()
            attachment = await reg.close("s1")
            assert attachment is not None and attachment.generation == 1
            entries = [await stuck, await queued]
            assert [e.sequence for e in entries if e is not None] == [1, 2]
            assert wire.closes == []  # the seed's caller closes what close() returned
            await events.wait_for("closed", "s1")
            with pytest.raises(KeyError):
                await reg.send_event("s1", {"n": 3})

    run(scenario)


def test_a_failed_nowait_send_frees_its_slot() -> None:
    async def scenario() -> None:
        plan = FaultPlan()
        plan.fail_send("s1", nth=1)
        events = Events()
        async with door(faults=plan, observer=events, max_pending_per_session=1) as reg:
            wire = Wire()
            await reg.create("s1", send=wire.send, close=wire.close)
            reg.send_event_nowait("s1", {"n": 1})
            await events.wait_for("send_failed", "s1")
            # Nobody waited for that frame; its slot must still come back.
            entry = await reg.send_event("s1", {"n": 2})
            assert entry is not None and entry.sequence == 2
            reg.send_event_nowait("s1", {"n": 3})
            assert await reg.detach("s1") is True

    run(scenario)


def test_calls_after_leaving_the_context_are_refused() -> None:
    async def scenario() -> None:
        async with door() as reg:
            wire = Wire()
            await reg.create("s1", send=wire.send, close=wire.close)
        with pytest.raises(SessionError):
            await reg.send_event("s1", {"n": 1})
        with pytest.raises(SessionError):
            reg.send_event_nowait("s1", {"n": 1})
        await reg.aclose()  # a second close is a no-op

    run(scenario)


def test_no_token_in_any_repr_observer_event_or_error() -> None:
    async def scenario() -> None:
        events = Events()
        async with door(observer=events) as reg:
            wire_a, wire_b, later = Wire(), Wire(), Wire()
            a = await reg.create("a", send=wire_a.send, close=wire_a.close)
            b = await reg.create("b", send=wire_b.send, close=wire_b.close)
            await reg.send_event("a", {"n": 1})
            catcher = TokenCatcher()
            result = await reg.resume(
                "a",
                resume_token=a.resume_token.plaintext,
                last_received_server_event_seq=0,
                send=later.send,
                close=later.close,
                activation_payload_factory=catcher,
            )
            secrets = {a.resume_token.plaintext, b.resume_token.plaintext}
            secrets |= {token.plaintext for token in catcher.tokens}
            errors: list[BaseException] = []
            await reg.create("c", send=wire_b.send, close=wire_b.close)
            for secret in sorted(secrets):  # every real token, at the wrong session
                try:
                    await reg.authenticate_resume(
                        "c", resume_token=secret, last_received_server_event_seq=0
                    )
                except InvalidResumeTokenError as exc:
                    errors.append(exc)
            assert len(errors) == 3
            await events.wait_for("invalid_token", "c")
            texts = [repr(x) + str(x) for x in (a, b, result, result.resume_token, reg)]
            texts += [repr(reg.stats()), repr(later.frames)]
            texts += [f"{e!r} {e} {e.__cause__!r} {e.__context__!r}" for e in errors]
            texts += [repr(event) for event in events.events]
            leaks = [t for t in texts for secret in secrets if secret in t]
            assert leaks == []

    run(scenario)
