"""The trio door's send timeout, on trio's mock clock: each frame gets exactly
``send_timeout_s``, however long the delivery and however long the registry
sat idle before (its one watchdog then waits without a deadline).

The clock only moves when a test jumps it, and each jump happens while a
frame is known to be in its send, so the figures asserted are logical time.
The session clock is the registry's fake one; ``pytest-timeout`` guards
against a hang (a ``fail_after`` on the mock clock would never fire).
"""

from __future__ import annotations

import pytest
import trio
import trio.testing

from supervisor import SendTimeoutError
from tests.trio_support import Outcome, registry


class SlowWire:
    """A transport whose every send takes ``seconds`` of trio's clock (forever: None)."""

    def __init__(self, seconds: float | None) -> None:
        self.seconds = seconds
        self.frames: list[dict[str, object]] = []
        self.closes: list[str] = []
        self._entered_send, self.entered = trio.open_memory_channel[None](100)

    async def send(self, frame: dict[str, object]) -> None:
        self._entered_send.send_nowait(None)
        if self.seconds is None:
            await trio.sleep_forever()
        await trio.sleep(self.seconds)
        self.frames.append(frame)

    async def close(self, reason: str) -> None:
        self.closes.append(reason)


async def test_each_frame_of_a_delivery_gets_the_whole_send_timeout(
    mock_clock: trio.testing.MockClock,
) -> None:
    # Three frames of 6 s against a 10 s timeout: 18 s for the delivery.
    wire = SlowWire(6.0)
    async with registry(send_timeout_s=10.0) as reg:
        await reg.create("s", send=wire.send, close=wire.close)
        batch = Outcome()
        payloads = [{"n": n} for n in range(3)]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(batch.run, lambda: reg.send_events("s", payloads))
            for _ in range(3):
                await wire.entered.receive()
                await trio.testing.wait_all_tasks_blocked()
                mock_clock.jump(6.0)
        assert batch.error is None
        assert [frame["n"] for frame in wire.frames] == [0, 1, 2]
        assert wire.closes == []


@pytest.mark.parametrize("idle_first", [False, True])
async def test_a_hung_send_is_cut_when_it_ran_exactly_the_send_timeout(
    mock_clock: trio.testing.MockClock, idle_first: bool
) -> None:
    wire = SlowWire(0.0)
    async with registry(send_timeout_s=10.0) as reg:
        await reg.create("s", send=wire.send, close=wire.close)
        await reg.send_event("s", {"n": 1})
        await wire.entered.receive()
        if idle_first:
            # Past a whole timeout without a send: the watchdog waits idle.
            for _ in range(3):
                await trio.testing.wait_all_tasks_blocked()
                mock_clock.jump(10.0)
        wire.seconds = None
        hung = Outcome()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(hung.run, lambda: reg.send_event("s", {"n": 2}))
            await wire.entered.receive()
            await trio.testing.wait_all_tasks_blocked()
            # Binary fractions: the sums are exact on the clock.
            mock_clock.jump(10.0 - 2**-10)
            await trio.testing.wait_all_tasks_blocked()
            assert not hung.done.is_set()
            mock_clock.jump(2**-10)
        assert isinstance(hung.error, SendTimeoutError)
        await trio.testing.wait_all_tasks_blocked()
        assert wire.closes == ["send_timeout"]
