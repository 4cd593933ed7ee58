"""The seed drop-in's attachments and leases, end to end through `supervisor.compat`.

Detach and release fenced by generation, ``has_attachment`` and
``is_current_attachment``, and the lease generation rules of
``settle_lease_generation`` / ``begin_resume`` / ``end_resume`` as the seed has them.
"""

from __future__ import annotations

import asyncio

import pytest

from supervisor.compat import DuplexDetachedAttachment
from tests.asyncio_support import Wire, activation, run, seed_registry


def test_detach_and_release_are_fenced_by_generation() -> None:
    async def scenario() -> None:
        async with seed_registry() as reg:
            wire, newer = Wire(), Wire()
            created = await reg.create("s1", send=wire.send, close=wire.close, lease_generation=7)
            assert await reg.release_attachment("s1", attachment_generation=2) is None
            assert await reg.detach("s1", attachment_generation=2) is False
            assert await reg.has_attachment("s1")
            released = await reg.release_attachment("s1", attachment_generation=1)
            assert isinstance(released, DuplexDetachedAttachment)
            assert released == DuplexDetachedAttachment(
                session_id="s1", attachment_generation=1, lease_generation=7
            )
            assert await reg.detach("s1") is False
            assert await reg.release_attachment("s1") is None
            # A socket that lost a takeover cannot detach the winner.
            await reg.resume(
                "s1",
                resume_token=created.resume_token.plaintext,
                last_received_server_event_seq=0,
                send=newer.send,
                close=newer.close,
            )
            assert await reg.detach("s1", attachment_generation=1) is False
            assert await reg.is_current_attachment("s1", 2)
            assert await reg.detach("s1", attachment_generation=2) is True
            assert await reg.detach("s1", attachment_generation=2) is False

    run(scenario)


def test_has_and_is_current_attachment() -> None:
    async def scenario() -> None:
        async with seed_registry() as reg:
            wire = Wire()
            await reg.create("s1", send=wire.send, close=wire.close)
            assert await reg.has_attachment("s1") is True
            assert await reg.is_current_attachment("s1", 1) is True
            assert await reg.is_current_attachment("s1", 2) is False
            assert await reg.detach("s1")
            assert await reg.has_attachment("s1") is False
            assert await reg.is_current_attachment("s1", 1) is False

    run(scenario)


def test_lease_generations_through_settle_begin_and_end_resume() -> None:
    async def scenario() -> None:
        async with seed_registry() as reg:
            wire, later = Wire(), Wire()
            created = await reg.create("s1", send=wire.send, close=wire.close, lease_generation=1)
            # No claim, attached: the attached connection takes the orphan over.
            assert await reg.settle_lease_generation("s1", 3) is None
            released = await reg.release_attachment("s1")
            assert released is not None and released.lease_generation == 3
            # No claim, detached: nobody owns it, the caller gets it back.
            assert await reg.settle_lease_generation("s1", 4) == 4
            # A claim parks it; generations only move forward.
            await reg.begin_resume("s1")
            assert await reg.settle_lease_generation("s1", 6) is None
            assert await reg.settle_lease_generation("s1", 5) is None
            assert await reg.end_resume("s1") == 6
            # An end without a claim owes nothing and leaves no negative claim count.
            assert await reg.end_resume("s1") is None
            await reg.begin_resume("s1")
            assert await reg.settle_lease_generation("s1", 9) is None
            # The activation absorbs the parked generation.
            result = await reg.resume(
                "s1",
                resume_token=created.resume_token.plaintext,
                last_received_server_event_seq=0,
                send=later.send,
                close=later.close,
                lease_generation=8,
            )
            assert await reg.end_resume("s1") is None
            released = await reg.release_attachment("s1", attachment_generation=2)
            assert released is not None
            assert (released.attachment_generation, released.lease_generation) == (2, 9)
            assert result.attachment_generation == 2
            # A claim ended while attached: the attached connection absorbs it.
            await reg.create("s2", send=wire.send, close=wire.close)
            await reg.begin_resume("s2")
            assert await reg.settle_lease_generation("s2", 2) is None
            assert await reg.end_resume("s2") is None
            released = await reg.release_attachment("s2")
            assert released is not None and released.lease_generation == 2

    run(scenario)


def test_a_rolled_back_activation_parks_the_newest_lease_for_end_resume() -> None:
    async def scenario() -> None:
        async with seed_registry() as reg:
            wire, new = Wire(), Wire()
            created = await reg.create("s1", send=wire.send, close=wire.close, lease_generation=1)
            assert await reg.detach("s1")
            await reg.begin_resume("s1")
            gate = new.hold(1)
            error = ConnectionResetError("activation lost")
            new.fail(1, error)
            resuming = asyncio.create_task(
                reg.resume(
                    "s1",
                    resume_token=created.resume_token.plaintext,
                    last_received_server_event_seq=0,
                    send=new.send,
                    close=new.close,
                    activation_payload_factory=activation,
                    lease_generation=2,
                )
            )
            await gate.entered.wait()
            # A resume abandoned meanwhile hands over a newer lease: parked.
            assert await reg.settle_lease_generation("s1", 3) is None
            gate.release()
            with pytest.raises(ConnectionResetError) as info:
                await resuming
            assert info.value is error
            # The rollback left nobody attached: end_resume owes the newest lease.
            assert await reg.end_resume("s1") == 3
            assert await reg.end_resume("s1") is None
            # Without a claim, the rolled-back lease is owed to whoever settles next,
            # even a caller that only knows an older generation.
            new.fail(2, error)
            with pytest.raises(ConnectionResetError):
                await reg.resume(
                    "s1",
                    resume_token=created.resume_token.plaintext,
                    last_received_server_event_seq=0,
                    send=new.send,
                    close=new.close,
                    activation_payload_factory=activation,
                    lease_generation=4,
                )
            assert await reg.settle_lease_generation("s1", 1) == 4
            assert await reg.settle_lease_generation("s1", 1) == 1

    run(scenario)
