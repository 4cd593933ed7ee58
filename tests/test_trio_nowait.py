"""send_event_nowait through the trio door: per-producer order and backpressure."""

from __future__ import annotations

import threading

import pytest
import trio
import trio.testing

from tests.trio_support import LIMIT, Outcome, Wire, registry

PRODUCERS = 8
PER_PRODUCER = 50


def _check_order(wire: Wire) -> None:
    frames = wire.frames[:-1]
    assert wire.frames[-1]["done"] is True
    total = PRODUCERS * PER_PRODUCER
    assert [f["server_event_seq"] for f in frames] == list(range(1, total + 1))
    for p in range(PRODUCERS):
        assert [f["i"] for f in frames if f["p"] == p] == list(range(PER_PRODUCER))


async def test_nowait_from_concurrent_tasks_keeps_each_producers_order() -> None:
    with trio.fail_after(LIMIT):
        async with registry() as reg:
            wire = Wire()
            await reg.create("s", send=wire.send, close=wire.close)

            async def producer(p: int) -> None:
                for i in range(PER_PRODUCER):
                    reg.send_event_nowait("s", {"p": p, "i": i})
                    await trio.lowlevel.checkpoint()  # interleave with the others

            async with trio.open_nursery() as nursery:
                for p in range(PRODUCERS):
                    nursery.start_soon(producer, p)
            # An awaited send returns once its frame, the last one, was sent.
            await reg.send_event("s", {"done": True})
            _check_order(wire)
            # The producers really interleaved on the wire.
            firsts = [f["p"] for f in wire.frames[:PRODUCERS]]
            assert len(set(firsts)) > 1


async def test_nowait_from_eight_threads_at_once_keeps_each_threads_order() -> None:
    with trio.fail_after(LIMIT):
        async with registry() as reg:
            wire = Wire()
            await reg.create("s", send=wire.send, close=wire.close)
            start = threading.Barrier(PRODUCERS)

            def producer(p: int) -> None:
                start.wait(LIMIT)
                for i in range(PER_PRODUCER):
                    trio.from_thread.run_sync(reg.send_event_nowait, "s", {"p": p, "i": i})

            async with trio.open_nursery() as nursery:
                for p in range(PRODUCERS):
                    nursery.start_soon(trio.to_thread.run_sync, producer, p)
            await reg.send_event("s", {"done": True})
            _check_order(wire)


async def test_backpressure_at_the_cap_refuses_nowait_and_holds_awaited_sends() -> None:
    with trio.fail_after(LIMIT):
        async with registry(max_pending_per_session=4) as reg:
            wire, other = Wire(), Wire()
            await reg.create("s", send=wire.send, close=wire.close)
            await reg.create("t", send=other.send, close=other.close)
            gate = wire.hold(1)
            for i in range(4):
                reg.send_event_nowait("s", {"i": i})
            await gate.entered.wait()
            with pytest.raises(trio.WouldBlock):
                reg.send_event_nowait("s", {"i": "refused"})
            waiting = Outcome()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(waiting.run, lambda: reg.send_event("s", {"i": 4}))
                await trio.testing.wait_all_tasks_blocked()
                assert not waiting.done.is_set()
                # Another session is not held by this one's cap.
                entry = await reg.send_event("t", {"n": 1})
                assert entry is not None
                assert other.seqs() == [1]
                assert not waiting.done.is_set()
                assert wire.frames == []
                gate.release()
            assert waiting.error is None
            # The refused event consumed nothing; the awaited one came last.
            assert waiting.value.sequence == 5
            assert [f["i"] for f in wire.frames] == [0, 1, 2, 3, 4]
            assert wire.seqs() == [1, 2, 3, 4, 5]
            # Room again: nowait works once the frames are out.
            reg.send_event_nowait("s", {"i": 5})
            await reg.send_event("s", {"i": 6})
            assert wire.seqs()[-2:] == [6, 7]


@pytest.mark.parametrize("failure", ["send_failed", "send_timeout"])
async def test_a_failed_nowait_send_frees_its_slot(failure: str) -> None:
    with trio.fail_after(LIMIT):
        async with registry(max_pending_per_session=1, send_timeout_s=0.2) as reg:
            wire = Wire()
            await reg.create("s", send=wire.send, close=wire.close)
            if failure == "send_failed":
                wire.fail(1, ConnectionResetError("gone"))
            else:
                wire.hold(1)  # never released: the send times out
            reg.send_event_nowait("s", {"n": 1})
            await wire.closed.wait()
            assert wire.closes == [failure]
            # The failed frame's slot is freed: a session left full would
            # hold the owner's detach (it waits for room) forever ...
            assert await reg.detach("s") is True
            # ... and refuse every later nowait.
            reg.send_event_nowait("s", {"n": 2})
            entry = await reg.send_event("s", {"n": 3})
            assert entry is not None
            assert entry.sequence == 3
