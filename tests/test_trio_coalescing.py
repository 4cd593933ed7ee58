"""send_event_nowait calls of one loop tick reach their session as one message.

Coalescing must change nothing a caller can see: each event is accepted or
refused on its own, per-session order holds across nowait and awaited
calls, and backpressure slots are freed for every event of a burst.
"""

from __future__ import annotations

import logging

import pytest
import trio

from actors._commands import LifecycleEvent
from supervisor import FaultPlan
from tests.trio_support import LIMIT, Wire, registry


async def test_one_bad_payload_in_a_burst_refuses_only_itself(
    caplog: pytest.LogCaptureFixture,
) -> None:
    events: list[LifecycleEvent] = []
    with trio.fail_after(LIMIT):
        async with registry(observer=events.append) as reg:
            wire = Wire()
            await reg.create("s", send=wire.send, close=wire.close)
            # No checkpoint between them: one tick, one burst.
            reg.send_event_nowait("s", {"n": 1})
            reg.send_event_nowait("s", {"n": float("nan")})  # not JSON: refused
            reg.send_event_nowait("s", {"n": 3})
            last = await reg.send_event("s", {"n": 4})
            assert last is not None
            assert [f["n"] for f in wire.frames] == [1, 3, 4]
            assert wire.seqs() == [1, 2, 3]  # the refused one took no sequence
            assert reg.stats().events_journaled == 3
    refusals = [
        r for r in caplog.records if "send_event_nowait to session s was refused" in r.message
    ]
    assert len(refusals) == 1
    assert [(e.kind, e.reason) for e in events if e.kind == "event_refused"] == [
        ("event_refused", "InvalidPayloadError")
    ]


async def test_each_refusal_in_a_burst_is_reported_with_its_own_reason() -> None:
    events: list[LifecycleEvent] = []
    with trio.fail_after(LIMIT):
        async with registry(observer=events.append, replay_max_events_per_session=2) as reg:
            wire = Wire()
            await reg.create("s", send=wire.send, close=wire.close)
            # One tick, one burst: a bad payload, two that fit, one past the cap.
            reg.send_event_nowait("s", {"n": float("nan")})
            reg.send_event_nowait("s", {"n": 1})
            reg.send_event_nowait("s", {"n": 2})
            reg.send_event_nowait("s", {"n": 3})
            assert await reg.has_attachment("s")  # after the burst, in order
    assert [e.reason for e in events if e.kind == "event_refused"] == [
        "InvalidPayloadError",
        "JournalOverflowError",
    ]


async def test_a_failed_send_of_a_burst_is_no_refusal_of_its_events() -> None:
    events: list[LifecycleEvent] = []
    plan = FaultPlan()
    with trio.fail_after(LIMIT):
        async with registry(observer=events.append, faults=plan) as reg:
            wire = Wire()
            await reg.create("s", send=wire.send, close=wire.close)
            plan.fail_send("s", nth=1)
            reg.send_event_nowait("s", {"n": float("nan")})  # refused
            reg.send_event_nowait("s", {"n": 1})  # journaled; its send fails
            await wire.closed.wait()
            assert reg.stats().events_journaled == 1
    # The transport failure is told once, as such; the journaled event was
    # accepted (a resume replays it), and the bad one is refused for itself.
    assert [e.reason for e in events if e.kind == "event_refused"] == ["InvalidPayloadError"]
    assert [e.reason for e in events if e.kind == "send_failed"] == ["send_failed"]
    assert wire.closes == ["send_failed"]


async def test_an_awaited_call_after_nowait_calls_keeps_their_order() -> None:
    with trio.fail_after(LIMIT):
        async with registry() as reg:
            wire = Wire()
            await reg.create("s", send=wire.send, close=wire.close)
            for n in range(5):
                reg.send_event_nowait("s", {"n": n})
            # Sent before the burst's own end-of-tick flush: it must flush first.
            entry = await reg.send_event("s", {"n": "awaited"})
            assert entry is not None
            assert entry.sequence == 6
            assert [f["n"] for f in wire.frames] == [0, 1, 2, 3, 4, "awaited"]


async def test_switching_journal_flags_inside_a_tick_keeps_order() -> None:
    with trio.fail_after(LIMIT):
        async with registry() as reg:
            wire = Wire()
            await reg.create("s", send=wire.send, close=wire.close)
            reg.send_event_nowait("s", {"n": 1})
            reg.send_event_nowait("s", {"n": "audio"}, journal=False)
            reg.send_event_nowait("s", {"n": 2})
            await reg.send_event("s", {"n": 3})
            assert [f["n"] for f in wire.frames] == [1, "audio", 2, 3]
            assert [f.get("server_event_seq") for f in wire.frames] == [1, None, 2, 3]


async def test_overflow_inside_a_burst_refuses_the_rest_and_frees_every_slot(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    with trio.fail_after(LIMIT):
        # Room for about three small events.
        async with registry(replay_max_bytes_per_session=100, max_pending_per_session=8) as reg:
            wire = Wire()
            await reg.create("s", send=wire.send, close=wire.close)
            for n in range(8):
                reg.send_event_nowait("s", {"n": n})
            # All eight slots come back: the ninth is not refused for room.
            with trio.fail_after(5):
                while True:
                    try:
                        reg.send_event_nowait("s", {"n": "late"})
                        break
                    except trio.WouldBlock:
                        await trio.sleep(0.001)
            await reg.has_attachment("s")
            delivered = [f["n"] for f in wire.frames]
            assert delivered == list(range(len(delivered)))
            assert 0 < len(delivered) < 8
            assert reg.stats().overflow_errors >= 8 - len(delivered)
