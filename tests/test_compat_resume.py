"""The seed drop-in's resumes, end to end through `supervisor.compat`.

Token before sequence, rotation, replay, the replaced attachment, wire order
under a slow activation, the one-shot recovery after a failed activation,
racing resumes, sticky overflow and gaps, all with the seed's errors.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

import pytest

from supervisor.compat import (
    DuplexJournalGapError,
    DuplexJournalOverflowError,
    DuplexSessionAttachmentRegistry,
    DuplexSessionResumeResult,
    InvalidResumeTokenError,
    ResumeToken,
)
from tests.asyncio_support import (
    FakeClock,
    TokenCatcher,
    Wire,
    activation,
    run,
    seed_registry,
    spin,
)


async def _resume(
    reg: DuplexSessionAttachmentRegistry,
    token: str,
    wire: Wire,
    *,
    seq: int = 0,
    factory: TokenCatcher | None = None,
) -> DuplexSessionResumeResult:
    return await reg.resume(
        "s1",
        resume_token=token,
        last_received_server_event_seq=seq,
        send=wire.send,
        close=wire.close,
        activation_payload_factory=factory,
    )


def test_authenticate_resume_checks_the_token_before_the_sequence() -> None:
    async def scenario() -> None:
        async with seed_registry() as reg:
            wire = Wire()
            created = await reg.create("s1", send=wire.send, close=wire.close)
            token = created.resume_token.plaintext
            for n in range(3):
                await reg.send_event("s1", {"n": n})
            for seq in (99, -1, 0):
                with pytest.raises(InvalidResumeTokenError) as info:
                    await reg.authenticate_resume(
                        "s1", resume_token="x" * 43, last_received_server_event_seq=seq
                    )
                assert str(info.value) == "invalid resume token for duplex session s1"
            with pytest.raises(ValueError) as newer:
                await reg.authenticate_resume(
                    "s1", resume_token=token, last_received_server_event_seq=5
                )
            assert str(newer.value) == "requested sequence 5 is newer than journal head 3"
            assert await reg.acknowledge("s1", 2) == 2
            with pytest.raises(DuplexJournalGapError) as gap:
                await reg.authenticate_resume(
                    "s1", resume_token=token, last_received_server_event_seq=1
                )
            assert (
                str(gap.value) == "requested sequence 1 is older than retained journal boundary 2"
            )
            assert isinstance(gap.value, RuntimeError)
            # A good check changes nothing: no rotation, no detach.
            for _ in range(2):
                await reg.authenticate_resume(
                    "s1", resume_token=token, last_received_server_event_seq=2
                )
            assert await reg.is_current_attachment("s1", 1)
            result = await _resume(reg, token, Wire(), seq=2)
            assert [e.sequence for e in result.replay_entries] == [3]

    run(scenario)


def test_resume_rotates_replays_after_the_sequence_and_returns_the_replaced() -> None:
    async def scenario() -> None:
        async with seed_registry() as reg:
            old, new = Wire(), Wire()
            created = await reg.create("s1", send=old.send, close=old.close)
            token = created.resume_token.plaintext
            for n in range(3):
                await reg.send_event("s1", {"n": n})
            result = await _resume(reg, token, new, seq=1)
            assert isinstance(result, DuplexSessionResumeResult)
            assert (result.session_id, result.attachment_generation) == ("s1", 2)
            assert [e.sequence for e in result.replay_entries] == [2, 3]
            assert [dict(e.payload) for e in result.replay_entries] == old.frames[1:]
            assert isinstance(result.resume_token, ResumeToken)
            assert result.resume_token.plaintext != token
            assert result.resume_token.plaintext not in repr(result) + str(result)
            replaced = result.replaced_attachment
            assert replaced is not None and replaced.generation == 1
            assert (replaced.send, replaced.close) == (old.send, old.close)
            # Without a factory the caller sends the replay; the caller closes the old one.
            assert (new.frames, old.closes, new.closes) == ([], [], [])
            with pytest.raises(InvalidResumeTokenError):
                await _resume(reg, token, Wire(), seq=3)
            await reg.send_event("s1", {"n": 3})
            assert (old.seqs(), new.seqs()) == ([1, 2, 3], [4])
            again = await _resume(reg, result.resume_token.plaintext, Wire(), seq=4)
            assert again.attachment_generation == 3
            assert again.replaced_attachment is not None
            assert again.replaced_attachment.generation == 2

    run(scenario)


def test_activation_then_replay_then_live_events_while_the_activation_is_slow() -> None:
    async def scenario() -> None:
        async with seed_registry() as reg:
            old, new = Wire(), Wire()
            created = await reg.create("s1", send=old.send, close=old.close)
            for n in range(3):
                await reg.send_event("s1", {"n": n})
            gate = new.hold(1)
            resuming = asyncio.create_task(
                _resume(reg, created.resume_token.plaintext, new, seq=1, factory=TokenCatcher())
            )
            await gate.entered.wait()
            live = asyncio.create_task(reg.send_event("s1", {"n": "live"}))
            await spin()
            # Neither returns before its frames are on the new wire.
            assert not resuming.done() and not live.done()
            gate.release()
            result = await resuming
            entry = await live
            assert entry is not None and entry.sequence == 4
            after = await reg.send_event("s1", {"n": "after"})
            assert after is not None
            assert new.frames[0] == activation(result.resume_token, 2)
            assert new.seqs() == [None, 2, 3, 4, 5]
            assert old.seqs() == [1, 2, 3]
            assert [e.sequence for e in result.replay_entries] == [2, 3]

    run(scenario)


class _FactoryError(RuntimeError):
    pass


Factory = Callable[[ResumeToken, int], Mapping[str, object]]


def _raising(error: Exception) -> Factory:
    def factory(token: ResumeToken, generation: int) -> Mapping[str, object]:
        raise error

    return factory


@pytest.mark.parametrize("failure", ["send", "factory"])
def test_failed_activation_leaves_the_presented_token_usable_exactly_once(failure: str) -> None:
    async def scenario() -> None:
        async with seed_registry() as reg:
            old, new, third = Wire(), Wire(), Wire()
            created = await reg.create("s1", send=old.send, close=old.close)
            token = created.resume_token.plaintext
            await reg.send_event("s1", {"n": 1})
            error: Exception = ConnectionResetError("activation lost")
            factory: Factory = TokenCatcher()
            if failure == "send":
                new.fail(1, error)
            else:
                error = _FactoryError("factory broke")
                factory = _raising(error)
            with pytest.raises(type(error)) as info:
                await reg.resume(
                    "s1",
                    resume_token=token,
                    last_received_server_event_seq=0,
                    send=new.send,
                    close=new.close,
                    activation_payload_factory=factory,
                )
            assert info.value is error
            assert new.frames == []  # no replay after a failed activation
            assert not await reg.has_attachment("s1")
            assert not await reg.is_current_attachment("s1", 2)
            await reg.send_event("s1", {"n": 2})
            assert old.seqs() == [1]  # the replaced attachment stays replaced
            result = await _resume(reg, token, third, factory=TokenCatcher())
            assert result.attachment_generation == 3
            assert third.seqs() == [None, 1, 2]
            assert await reg.detach("s1")
            with pytest.raises(InvalidResumeTokenError):
                await _resume(reg, token, Wire())
            await _resume(reg, result.resume_token.plaintext, Wire())

    run(scenario)


@pytest.mark.parametrize("with_factory", [True, False])
def test_two_concurrent_resumes_with_one_token_exactly_one_wins(with_factory: bool) -> None:
    async def scenario() -> None:
        async with seed_registry() as reg:
            wires = [Wire(), Wire(), Wire()]
            created = await reg.create("s1", send=wires[0].send, close=wires[0].close)
            token = created.resume_token.plaintext
            await reg.send_event("s1", {"n": 1})
            outcomes = await asyncio.gather(
                *(
                    _resume(reg, token, wire, factory=TokenCatcher() if with_factory else None)
                    for wire in wires[1:]
                ),
                return_exceptions=True,
            )
            won = [o for o in outcomes if isinstance(o, DuplexSessionResumeResult)]
            lost = [o for o in outcomes if isinstance(o, BaseException)]
            assert len(won) == 1 and len(lost) == 1
            assert isinstance(lost[0], InvalidResumeTokenError)
            assert won[0].attachment_generation == 2
            assert await reg.is_current_attachment("s1", 2)
            winner = wires[1 + outcomes.index(won[0])]
            loser = wires[2 - outcomes.index(won[0])]
            assert winner.seqs() == ([None, 1] if with_factory else [])
            assert loser.frames == []

    run(scenario)


def test_a_resume_queued_behind_a_failing_activation_sees_the_recovery() -> None:
    async def scenario() -> None:
        async with seed_registry() as reg:
            old, first, second = Wire(), Wire(), Wire()
            created = await reg.create("s1", send=old.send, close=old.close)
            token = created.resume_token.plaintext
            error = ConnectionResetError("activation lost")
            gate = first.hold(1)
            first.fail(1, error)
            failing = asyncio.create_task(_resume(reg, token, first, factory=TokenCatcher()))
            await gate.entered.wait()
            queued = asyncio.create_task(_resume(reg, token, second, factory=TokenCatcher()))
            await spin()
            assert not queued.done()  # it waits for the activation's outcome
            gate.release()
            with pytest.raises(ConnectionResetError) as info:
                await failing
            assert info.value is error
            result = await queued
            assert result.attachment_generation == 3
            assert second.seqs() == [None]
            assert await reg.detach("s1")
            with pytest.raises(InvalidResumeTokenError):
                await _resume(reg, token, Wire())

    run(scenario)


def test_a_cancelled_resume_rolls_back_like_a_failed_activation() -> None:
    async def scenario() -> None:
        async with seed_registry() as reg:
            old, new = Wire(), Wire()
            created = await reg.create("s1", send=old.send, close=old.close)
            token = created.resume_token.plaintext
            gate = new.hold(1)
            task = asyncio.create_task(_resume(reg, token, new, factory=TokenCatcher()))
            await gate.entered.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert not await reg.has_attachment("s1")
            result = await _resume(reg, token, Wire())
            assert result.attachment_generation == 3
            assert await reg.detach("s1")
            with pytest.raises(InvalidResumeTokenError):
                await _resume(reg, token, Wire())

    run(scenario)


def test_journal_overflow_is_sticky() -> None:
    async def scenario() -> None:
        async with seed_registry(replay_max_bytes_per_session=100) as reg:
            wire = Wire()
            created = await reg.create("s1", send=wire.send, close=wire.close)
            first = await reg.send_event("s1", {"n": 1})
            assert first is not None
            big = {"blob": "x" * 100}
            with pytest.raises(DuplexJournalOverflowError) as info:
                await reg.send_event("s1", big)
            size = first.encoded_bytes + len('{"blob":"","server_event_seq":2}') + 100
            assert str(info.value) == f"duplex event journal byte limit exceeded: {size} > 100"
            assert isinstance(info.value, RuntimeError)
            assert wire.seqs() == [1]  # the overflowing event never reached the wire
            assert await reg.acknowledge("s1", 1) == 1  # acking does not unstick it
            with pytest.raises(DuplexJournalOverflowError) as again:
                await reg.send_event("s1", {"n": 2})
            assert str(again.value) == "duplex event journal already exceeded its byte limit"
            assert await reg.send_event("s1", {"audio": b"\x00"}, journal=False) is None
            assert wire.frames[-1] == {"audio": b"\x00"}
            with pytest.raises(DuplexJournalGapError) as gap:
                await _resume(reg, created.resume_token.plaintext, Wire(), seq=1)
            assert str(gap.value) == "duplex event journal overflowed; replay is incomplete"
            assert await reg.is_current_attachment("s1", 1)

    run(scenario)


def test_gaps_by_acknowledgement_and_by_ttl_leave_the_token_alone() -> None:
    async def scenario() -> None:
        clock = FakeClock()
        async with seed_registry(clock=clock, replay_ttl_s=60.0) as reg:
            wire = Wire()
            created = await reg.create("s1", send=wire.send, close=wire.close)
            token = created.resume_token.plaintext
            for n in range(3):
                await reg.send_event("s1", {"n": n})
            await reg.acknowledge("s1", 2)
            with pytest.raises(DuplexJournalGapError) as acked:
                await _resume(reg, token, Wire(), seq=1)
            assert str(acked.value) == (
                "requested sequence 1 is older than retained journal boundary 2"
            )
            assert await reg.is_current_attachment("s1", 1)
            clock.now += 60.0
            with pytest.raises(DuplexJournalGapError) as expired:
                await _resume(reg, token, Wire(), seq=2)
            assert str(expired.value) == (
                "requested sequence 2 is older than retained journal boundary 3"
            )
            result = await _resume(reg, token, Wire(), seq=3)
            assert result.replay_entries == ()
            assert result.attachment_generation == 2

    run(scenario)
