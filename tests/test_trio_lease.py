"""Lease generations and unknown sessions through the trio door, as the seed answers."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from actors._commands import DetachedAttachment
from supervisor import UnknownSessionError
from supervisor.doors._trio import TrioSessionRegistry
from tests.trio_support import LIMIT, Gate, TokenCatcher, Wire, registry, settled
from tests.unknown_calls import ANSWERING, NOWHERE, RAISING, outcome


class Tokens:
    """The session's current token, kept up to date across resumes."""

    def __init__(self, token: str) -> None:
        self.current = token

    async def resume(
        self, reg: TrioSessionRegistry, wire: Wire, *, lease: int | None = None, **kw: Any
    ) -> int:
        result = await reg.resume(
            "s",
            resume_token=self.current,
            last_received_server_event_seq=0,
            send=wire.send,
            close=wire.close,
            lease_generation=lease,
            **kw,
        )
        self.current = result.resume_token.plaintext
        return result.attachment_generation


async def test_release_and_settle_without_a_pending_resume() -> None:
    with trio.fail_after(LIMIT):
        async with registry() as reg:
            created = await reg.create(
                "s", send=Wire().send, close=Wire().close, lease_generation=5
            )
            tokens = Tokens(created.resume_token.plaintext)
            # Attached: the connection absorbs a newer orphan; an older one changes nothing.
            assert await reg.settle_lease_generation("s", 6) is None
            assert await reg.settle_lease_generation("s", 3) is None
            released = await reg.release_attachment("s")
            assert released == DetachedAttachment(
                session_id="s", attachment_generation=1, lease_generation=6
            )
            assert await reg.release_attachment("s") is None
            # Detached, nobody claims it: the caller gets the generation back.
            assert await reg.settle_lease_generation("s", 7) == 7
            assert await reg.settle_lease_generation("s", 7) == 7
            generation = await tokens.resume(reg, Wire(), lease=8)
            assert generation == 2
            released = await reg.release_attachment("s", attachment_generation=1)
            assert released is None
            released = await reg.release_attachment("s", attachment_generation=2)
            assert released == DetachedAttachment(
                session_id="s", attachment_generation=2, lease_generation=8
            )


async def test_a_claimed_resume_parks_orphans_until_it_activates_or_ends() -> None:
    with trio.fail_after(LIMIT):
        async with registry() as reg:
            created = await reg.create(
                "s", send=Wire().send, close=Wire().close, lease_generation=1
            )
            tokens = Tokens(created.resume_token.plaintext)
            assert await reg.detach("s") is True
            # begin, settle, end: parked, then owed to the caller of end_resume.
            await reg.begin_resume("s")
            assert await reg.settle_lease_generation("s", 2) is None
            assert await reg.end_resume("s") == 2
            assert await reg.end_resume("s") is None
            # begin, settle, resume: the activation absorbs the newer orphan.
            await reg.begin_resume("s")
            assert await reg.settle_lease_generation("s", 4) is None
            await tokens.resume(reg, Wire(), lease=3)
            assert await reg.end_resume("s") is None
            released = await reg.release_attachment("s")
            assert released is not None
            assert released.lease_generation == 4
            # A claim while attached parks the orphan for the resume, not the socket.
            await tokens.resume(reg, Wire(), lease=5)
            await reg.begin_resume("s")
            assert await reg.settle_lease_generation("s", 6) is None
            assert await reg.end_resume("s") is None  # attached: it takes the lease
            released = await reg.release_attachment("s")
            assert released is not None
            assert released.lease_generation == 6


async def test_a_rolled_back_activation_hands_back_the_newest_lease() -> None:
    with trio.fail_after(LIMIT):
        async with registry() as reg:
            created = await reg.create(
                "s", send=Wire().send, close=Wire().close, lease_generation=1
            )
            token = created.resume_token.plaintext
            assert await reg.detach("s") is True
            await reg.begin_resume("s")  # this resume
            await reg.begin_resume("s")  # another one, abandoned below
            failing = Wire()
            gate: Gate = failing.hold(1)
            failing.fail(1, ConnectionResetError("activation lost"))
            outcome: list[BaseException] = []

            async def resume() -> None:
                try:
                    await reg.resume(
                        "s",
                        resume_token=token,
                        last_received_server_event_seq=0,
                        send=failing.send,
                        close=failing.close,
                        activation_payload_factory=TokenCatcher(),
                        lease_generation=12,
                    )
                except ConnectionResetError as exc:
                    outcome.append(exc)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(resume)
                await gate.entered.wait()
                # The other resume gives up while this one is on the wire.
                assert await reg.settle_lease_generation("s", 13) is None
                assert await reg.end_resume("s") is None
                gate.release()
            assert len(outcome) == 1
            assert await reg.has_attachment("s") is False
            # Its own settlement knows only 12; the newest lease (13) is owed.
            assert await reg.settle_lease_generation("s", 12) is None
            assert await reg.end_resume("s") == 13
            assert await reg.end_resume("s") is None


async def test_a_failed_activation_parks_its_own_lease() -> None:
    with trio.fail_after(LIMIT):
        async with registry() as reg:
            created = await reg.create(
                "s", send=Wire().send, close=Wire().close, lease_generation=1
            )
            tokens = Tokens(created.resume_token.plaintext)
            assert await reg.detach("s") is True
            await reg.begin_resume("s")
            failing = Wire()
            failing.fail(1, ConnectionResetError("gone"))
            with pytest.raises(ConnectionResetError):
                await tokens.resume(
                    reg, failing, lease=11, activation_payload_factory=TokenCatcher()
                )
            assert await reg.end_resume("s") == 11
            # The presented token recovers; a rollback never moves the lease back.
            await tokens.resume(reg, Wire(), lease=None)
            released = await reg.release_attachment("s")
            assert released is not None
            assert (released.attachment_generation, released.lease_generation) == (3, 11)


@pytest.mark.parametrize("gone", [False, True], ids=["never-created", "closed"])
async def test_unknown_sessions_are_answered_per_method_as_the_seed_does(gone: bool) -> None:
    with trio.fail_after(LIMIT):
        async with registry() as reg:
            other = Wire()
            await reg.create("other", send=other.send, close=other.close)
            if gone:
                await reg.create("nope", send=Wire().send, close=Wire().close)
                await reg.close("nope")
            for name, call in RAISING.items():
                with pytest.raises(KeyError) as caught:
                    await outcome(reg, call)
                assert isinstance(caught.value, UnknownSessionError), name
                assert "nope" in str(caught.value), name
            for name, (call, expected) in ANSWERING.items():
                answer = await outcome(reg, call)
                assert answer is expected, name
                assert type(answer) is type(expected), name
            await settled(reg, "other")
            assert NOWHERE.frames == []
            assert NOWHERE.closes == []
            assert reg.session_ids() == ["other"]
            assert await reg.send_event("other", {"n": 1}) is not None
            assert other.seqs() == [1]
