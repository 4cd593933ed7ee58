"""The asyncio front door: ``open_session_registry()``, the same surface as trio's.

    async with open_session_registry(
        replay_ttl_s=30, replay_max_bytes_per_session=1 << 20
    ) as registry:
        created = await registry.create("s1", send=ws.send_json, close=ws.close)
        await registry.send_event("s1", {"type": "delta", "text": "hi"})

``send`` and ``close`` are coroutine functions of the running loop. Replies,
``on_accepted`` and observer callbacks reach the loop through
``loop.call_soon_threadsafe``, coalesced. ``send_event_nowait`` raises
``asyncio.QueueFull`` where trio's door raises ``trio.WouldBlock``. For code
written against the seed's class, see `supervisor.compat`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Unpack

from actors._commands import CloseCallable, SendCallable
from actors._ports import NO_WAITER
from supervisor._options import RegistryOptions, RegistryOptionsDict
from supervisor.doors._door import AsyncSessionRegistry
from supervisor.doors._door_calls import LoopReply
from supervisor.doors._loop_port import CoalescingPort
from supervisor.doors._outbox import AsyncioOutbox, OutboxCore

__all__ = ["AsyncioSessionRegistry", "open_session_registry"]


class AsyncioReply(LoopReply):
    """Completes a loop future; waiters shield it, so a cancelled one may wait again."""

    __slots__ = ("_future",)

    def __init__(
        self,
        port: CoalescingPort,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        super().__init__(port)
        self._future: asyncio.Future[None] = loop.create_future()

    def _wake(self) -> None:
        if not self._future.done():
            self._future.set_result(None)

    async def wait(self) -> Any:
        if not self._done:
            await asyncio.shield(self._future)
        return self._outcome()


class AsyncioSessionRegistry(AsyncSessionRegistry):
    """A registry bound to the running asyncio loop; `aclose` ends it.

    Build it inside a running loop, with the keyword arguments of
    `RegistryOptions`, or let
    `open_session_registry` build and close it.
    ``send_event_nowait`` raises ``asyncio.QueueFull`` when the session has
    ``max_pending_per_session`` calls in flight.
    """

    def __init__(self, **options: Unpack[RegistryOptionsDict]) -> None:
        self._loop = asyncio.get_running_loop()
        super().__init__(
            options=RegistryOptions(**options),
            port=CoalescingPort(self._loop.call_soon_threadsafe),
        )
        self._tasks: set[asyncio.Task[None]] = set()
        self._spawn(self._run_timers())
        interval = self._options.sweep_interval_s
        if interval is not None:
            self._spawn(self._ticker(interval))

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop the registry runs on: call its methods from there only."""
        return self._loop

    def _spawn(self, coro: Any) -> None:
        task = self._loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _new_reply(self) -> LoopReply:
        return AsyncioReply(self._port, self._loop)

    def _start_outbox(
        self, session_id: str, send: SendCallable, close: CloseCallable
    ) -> OutboxCore:
        outbox = AsyncioOutbox(
            session_id=session_id,
            send=send,
            close=close,
            port=self._port,
            notify=self._notify,
            send_timeout_s=self._send_timeout_s,
            faults=self._system.transport_faults,
        )
        self._keep(outbox)
        self._spawn(outbox.run())
        return outbox

    def _would_block(self, session_id: str) -> BaseException:
        return asyncio.QueueFull(f"session {session_id} has too many calls in flight")

    def _new_event(self) -> asyncio.Event:
        return asyncio.Event()

    def _is_cancellation(self, exc: BaseException) -> bool:
        return isinstance(exc, asyncio.CancelledError)

    async def _shielded(self, reply: LoopReply, timeout: float) -> Any:
        try:
            return await asyncio.wait_for(asyncio.shield(reply.wait()), timeout)
        except TimeoutError:
            raise TimeoutError("no answer within the shielded wait") from None

    async def _ticker(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            if not self._closed:
                self._system.sweep(NO_WAITER)

    async def _sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    def _now(self) -> float:
        return self._loop.time()

    async def aclose(self) -> None:
        """Shut the registry down (see ``open_session_registry``); idempotent.

        Shielded, like trio's door: a caller cancelled (even again and again)
        while closing still waits until every actor has stopped, then gets
        its cancellation. Otherwise a caller could leave with sessions
        still answering and outboxes still sending.
        """
        if self._closed:
            return
        closing = self._loop.create_task(self._stop_everything())
        cancelled = False
        while not closing.done():
            try:
                await asyncio.shield(closing)
            except asyncio.CancelledError:
                cancelled = True
        if cancelled:
            raise asyncio.CancelledError
        closing.result()

    async def _stop_everything(self) -> None:
        await self._shut_down()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


@asynccontextmanager
async def open_session_registry(
    **options: Unpack[RegistryOptionsDict],
) -> AsyncIterator[AsyncioSessionRegistry]:
    """Run a session registry on the running asyncio loop, for the block's duration.

    The asyncio twin of the trio door's ``open_session_registry``: the same
    keyword arguments (the fields of `RegistryOptions`),
    the same methods, the same shutdown at the end of the block (shielded
    from cancellation: drain for up to ``drain_timeout_s``, stop every
    session and the supervisor; no transport's ``close`` is called).
    ``send`` and ``close`` of its transports are coroutine functions.

    Yields:
        AsyncioSessionRegistry: the registry.
    """
    registry = AsyncioSessionRegistry(**options)
    try:
        yield registry
    finally:
        await registry.aclose()
