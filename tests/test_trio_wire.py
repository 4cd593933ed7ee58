"""Wire order and send failures through the trio door."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from actors._commands import ResumeResult
from actors._credential import ResumeToken
from supervisor import InvalidResumeTokenError
from tests.trio_support import LIMIT, Outcome, Wire, activation, registry, settled


async def test_activation_replay_then_live_events_in_order_while_the_activation_is_slow() -> None:
    with trio.fail_after(LIMIT):
        async with registry() as reg:
            old = Wire()
            created = await reg.create("s", send=old.send, close=old.close)
            for n in range(1, 4):
                await reg.send_event("s", {"n": n})
            new = Wire()
            gate = new.hold(1)
            resumed, live = Outcome(), Outcome()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(
                    resumed.run,
                    lambda: reg.resume(
                        "s",
                        resume_token=created.resume_token.plaintext,
                        last_received_server_event_seq=1,
                        send=new.send,
                        close=new.close,
                        activation_payload_factory=activation,
                    ),
                )
                await gate.entered.wait()
                nursery.start_soon(live.run, lambda: reg.send_event("s", {"live": 1}))
                await settled(reg, "s")
                reg.send_event_nowait("s", {"live": 2})
                await settled(reg, "s")
                # Everything waits behind the activation on the new wire.
                assert not resumed.done.is_set()
                assert not live.done.is_set()
                assert new.frames == []
                gate.release()
            assert resumed.error is None
            assert live.error is None
            result: ResumeResult = resumed.value
            assert [e.sequence for e in result.replay_entries] == [2, 3]
            assert live.value.sequence == 4
            await settled(reg, "s")
            assert new.frames == [
                {"type": "session.resumed", "attachment_generation": 2},
                {"n": 2, "server_event_seq": 2},
                {"n": 3, "server_event_seq": 3},
                {"live": 1, "server_event_seq": 4},
                {"live": 2, "server_event_seq": 5},
            ]
            assert old.seqs() == [1, 2, 3]
            assert old.closes == []


def _raising_factory(error: BaseException) -> Any:
    def factory(token: ResumeToken, generation: int) -> dict[str, object]:
        raise error

    return factory


@pytest.mark.parametrize("where", ["activation", "replay", "factory"])
async def test_a_failed_activation_rolls_back_and_the_old_token_works_once(where: str) -> None:
    with trio.fail_after(LIMIT):
        async with registry() as reg:
            old = Wire()
            created = await reg.create("s", send=old.send, close=old.close)
            token = created.resume_token.plaintext
            await reg.send_event("s", {"n": 1})
            error = ConnectionResetError(f"{where} lost")
            failing = Wire()
            factory: Any = activation
            if where == "activation":
                failing.fail(1, error)
            elif where == "replay":
                failing.fail(2, error)
            else:
                factory = _raising_factory(error)
            with pytest.raises(ConnectionResetError) as caught:
                await reg.resume(
                    "s",
                    resume_token=token,
                    last_received_server_event_seq=0,
                    send=failing.send,
                    close=failing.close,
                    activation_payload_factory=factory,
                )
            assert caught.value is error
            # The seed's rollback: the provisional attachment is gone, the
            # replaced one is not restored; nothing was closed by the library.
            assert await reg.has_attachment("s") is False
            assert await reg.is_current_attachment("s", 2) is False
            assert old.closes == failing.closes == []
            await reg.send_event("s", {"n": 2})
            assert old.seqs() == [1]
            assert failing.seqs() == ([None] if where == "replay" else [])
            retry = Wire()
            result = await reg.resume(
                "s",
                resume_token=token,
                last_received_server_event_seq=0,
                send=retry.send,
                close=retry.close,
                activation_payload_factory=activation,
            )
            assert result.attachment_generation == 3
            assert retry.seqs() == [None, 1, 2]
            assert await reg.detach("s") is True
            with pytest.raises(InvalidResumeTokenError):
                await reg.resume(
                    "s",
                    resume_token=token,
                    last_received_server_event_seq=0,
                    send=Wire().send,
                    close=Wire().close,
                )


@pytest.mark.parametrize("with_activation", [True, False], ids=["activation", "plain"])
async def test_two_concurrent_resumes_with_one_token_exactly_one_wins(
    with_activation: bool,
) -> None:
    with trio.fail_after(LIMIT):
        async with registry() as reg:
            created = await reg.create("s", send=Wire().send, close=Wire().close)
            await reg.send_event("s", {"n": 1})
            wires = [Wire(), Wire()]
            gates = [w.hold(1) for w in wires] if with_activation else []
            outcomes = [Outcome(), Outcome()]
            factory = activation if with_activation else None
            async with trio.open_nursery() as nursery:
                for wire, outcome in zip(wires, outcomes, strict=True):
                    nursery.start_soon(
                        outcome.run,
                        lambda wire=wire: reg.resume(
                            "s",
                            resume_token=created.resume_token.plaintext,
                            last_received_server_event_seq=0,
                            send=wire.send,
                            close=wire.close,
                            activation_payload_factory=factory,
                        ),
                    )
                if with_activation:
                    await settled(reg, "s")
                    # One activation is on the wire; the other resume waits for it.
                    assert [g.entered.is_set() for g in gates].count(True) == 1
                    for gate in gates:
                        gate.release()
            winners = [o for o in outcomes if o.error is None]
            losers = [o for o in outcomes if o.error is not None]
            assert len(winners) == len(losers) == 1
            assert isinstance(losers[0].error, InvalidResumeTokenError)
            won: ResumeResult = winners[0].value
            assert won.attachment_generation == 2
            assert await reg.is_current_attachment("s", 2) is True
            winner_wire = wires[outcomes.index(winners[0])]
            loser_wire = wires[outcomes.index(losers[0])]
            await reg.send_event("s", {"n": 2})
            assert winner_wire.seqs() == ([None, 1, 2] if with_activation else [2])
            assert loser_wire.frames == []


async def test_a_failed_journaled_send_is_accepted_and_replayable() -> None:
    with trio.fail_after(LIMIT):
        async with registry() as reg:
            wire = Wire()
            log: list[str] = []
            wire.log = log
            created = await reg.create("s", send=wire.send, close=wire.close)
            error = ConnectionResetError("peer went away")
            wire.fail(1, error)
            with pytest.raises(ConnectionResetError) as caught:
                await reg.send_event("s", {"n": 1}, on_accepted=lambda: log.append("accepted"))
            assert caught.value is error
            assert log == ["accepted", "send"]
            assert await reg.has_attachment("s") is True
            entry = await reg.send_event("s", {"n": 2})
            assert entry is not None
            assert entry.sequence == 2
            assert wire.seqs() == [2]
            result = await reg.resume(
                "s",
                resume_token=created.resume_token.plaintext,
                last_received_server_event_seq=0,
                send=Wire().send,
                close=Wire().close,
            )
            assert [dict(e.payload) for e in result.replay_entries] == [
                {"n": 1, "server_event_seq": 1},
                {"n": 2, "server_event_seq": 2},
            ]
            assert wire.closes == []


async def test_a_failed_unjournaled_send_is_not_accepted() -> None:
    with trio.fail_after(LIMIT):
        async with registry() as reg:
            wire = Wire()
            log: list[str] = []
            wire.log = log
            created = await reg.create("s", send=wire.send, close=wire.close)
            error = ConnectionResetError("peer went away")
            wire.fail(1, error)
            with pytest.raises(ConnectionResetError) as caught:
                await reg.send_event(
                    "s", {"audio": b"\x00"}, journal=False, on_accepted=lambda: log.append("x")
                )
            assert caught.value is error
            assert log == ["send"]
            # A successful unjournaled send is accepted after the send.
            assert (
                await reg.send_event(
                    "s", {"audio": b"\x01"}, journal=False, on_accepted=lambda: log.append("ok")
                )
                is None
            )
            assert log == ["send", "send", "ok"]
            entry = await reg.send_event("s", {"n": 1})
            assert entry is not None
            assert entry.sequence == 1  # nothing unjournaled consumed a sequence
            result = await reg.resume(
                "s",
                resume_token=created.resume_token.plaintext,
                last_received_server_event_seq=0,
                send=Wire().send,
                close=Wire().close,
            )
            assert [e.sequence for e in result.replay_entries] == [1]


async def test_a_program_that_detaches_after_a_failed_send_gets_true() -> None:
    with trio.fail_after(LIMIT):
        async with registry() as reg:
            wire = Wire()
            await reg.create("s", send=wire.send, close=wire.close, lease_generation=4)
            wire.fail(2, BrokenPipeError("closed"))
            await reg.send_event("s", {"n": 1})
            try:
                await reg.send_event("s", {"n": 2})
            except BrokenPipeError:
                released = await reg.release_attachment("s", attachment_generation=1)
            else:
                pytest.fail("the send's error did not reach its caller")
            assert released is not None
            assert (released.attachment_generation, released.lease_generation) == (1, 4)
            assert await reg.detach("s") is False
            assert wire.closes == []  # a caller waited: the library closes nothing


async def test_send_events_is_one_ordered_batch() -> None:
    with trio.fail_after(LIMIT):
        async with registry() as reg:
            wire = Wire()
            await reg.create("s", send=wire.send, close=wire.close)
            entries = await reg.send_events("s", [{"k": k} for k in range(4)])
            assert [e.sequence for e in entries if e is not None] == [1, 2, 3, 4]
            assert wire.frames == [{"k": k, "server_event_seq": k + 1} for k in range(4)]
            error = ConnectionAbortedError("mid-batch")
            wire.fail(6, error)
            with pytest.raises(ConnectionAbortedError) as caught:
                await reg.send_events("s", [{"k": k} for k in range(4, 8)])
            assert caught.value is error
            assert wire.seqs()[4:] == [5]
            assert await reg.send_events("s", [{"k": 8}], journal=False) == (None,)
