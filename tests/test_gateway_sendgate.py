"""The shells' send gate: one sender at a time, FIFO, no checkpoint when free."""

from __future__ import annotations

import asyncio

import anyio
import pytest
import trio
import trio.testing

from supervisor.gateway._sendgate import SendGate


async def test_a_free_gate_is_taken_without_a_checkpoint() -> None:
    gate = SendGate(trio.Event)
    with trio.CancelScope() as scope:
        scope.cancel()
        # A trio.Lock would raise Cancelled here: its acquire checkpoints.
        async with gate:
            assert gate.busy
    assert not scope.cancelled_caught
    assert not gate.busy


async def test_waiters_get_the_gate_in_arrival_order() -> None:
    gate = SendGate(trio.Event)
    order: list[int] = []

    async def sender(n: int) -> None:
        async with gate:
            order.append(n)
            await trio.sleep(0)

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            await gate.__aenter__()
            for n in range(5):
                nursery.start_soon(sender, n)
                await trio.testing.wait_all_tasks_blocked()
            await gate.__aexit__(None, None, None)
    assert order == [0, 1, 2, 3, 4]
    assert not gate.busy


async def test_a_cancelled_waiter_leaves_the_queue() -> None:
    gate = SendGate(trio.Event)
    got: list[str] = []

    async def sender(name: str) -> None:
        async with gate:
            got.append(name)

    doomed = trio.CancelScope()

    async def cancelled_sender() -> None:
        with doomed:
            await sender("cancelled")

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            await gate.__aenter__()
            nursery.start_soon(sender, "first")
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(cancelled_sender)
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(sender, "last")
            await trio.testing.wait_all_tasks_blocked()
            doomed.cancel()
            await trio.testing.wait_all_tasks_blocked()
            await gate.__aexit__(None, None, None)
    assert got == ["first", "last"]
    assert not gate.busy


def test_asyncio_a_waiter_cancelled_after_its_handover_passes_the_gate_on() -> None:
    async def main() -> list[str]:
        gate = SendGate(anyio.Event)
        got: list[str] = []

        async def sender(name: str) -> None:
            async with gate:
                got.append(name)

        await gate.__aenter__()
        handed = asyncio.ensure_future(sender("handed"))
        after = asyncio.ensure_future(sender("after"))
        await asyncio.sleep(0)
        await gate.__aexit__(None, None, None)  # hands the gate to "handed"...
        handed.cancel()  # ...which is cancelled before it runs
        with pytest.raises(asyncio.CancelledError):
            await handed
        await asyncio.wait_for(after, 5)
        assert not gate.busy
        return got

    assert asyncio.run(main()) == ["after"]
