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
written against the seed's class, see :mod:`supervisor.compat`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from actors.errors import SessionError
from actors.messages import CloseCallable, LifecycleEvent, SendCallable
from actors.ports import NO_WAITER
from actors.state import SessionConfig
from supervisor.actor import DEFAULT_PASSIVATE_AFTER_S, SessionSystem
from supervisor.async_door import AsyncSessionRegistry, LoopReply, check_timing
from supervisor.faults import FaultPlan
from supervisor.outbox import AsyncioOutbox, CoalescingPort, OutboxCore
from supervisor.policy import RestartPolicy

__all__ = ["AsyncioSessionRegistry", "open_session_registry"]


class AsyncioReply(LoopReply):
    """Completes a loop future; waiters shield it, so a cancelled one may wait again."""

    __slots__ = ("_future",)

    def __init__(
        self,
        port: CoalescingPort,
        loop: asyncio.AbstractEventLoop,
        on_settled: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(port, on_settled)
        self._future: asyncio.Future[None] = loop.create_future()

    def _wake(self) -> None:
        if not self._future.done():
            self._future.set_result(None)

    async def wait(self) -> Any:
        if not self._done:
            await asyncio.shield(self._future)
        return self._outcome()


class AsyncioSessionRegistry(AsyncSessionRegistry):
    """An actor registry bound to the running asyncio loop; :meth:`aclose` ends it.

    Build it inside a running loop (``open_session_registry`` does).
    """

    def __init__(
        self,
        *,
        replay_ttl_s: float,
        replay_max_bytes_per_session: int,
        replay_max_events_per_session: int | None = None,
        clock: Callable[[], float] | None = None,
        disconnect_grace_s: float | None = None,
        send_timeout_s: float | None = 10.0,
        restart_policy: RestartPolicy | None = None,
        passivate_after_s: float | None = DEFAULT_PASSIVATE_AFTER_S,
        faults: FaultPlan | None = None,
        observer: Callable[[LifecycleEvent], None] | None = None,
        sweep_interval_s: float | None = 1.0,
        max_pending_per_session: int = 10_000,
        strict: bool = True,
        daemon_threads: bool = False,
    ) -> None:
        check_timing(sweep_interval_s=sweep_interval_s, send_timeout_s=send_timeout_s)
        self._loop = asyncio.get_running_loop()
        port = CoalescingPort(self._loop.call_soon_threadsafe)
        super().__init__(
            system=SessionSystem(
                config=SessionConfig(
                    replay_ttl_s=replay_ttl_s,
                    replay_max_bytes=replay_max_bytes_per_session,
                    replay_max_events=replay_max_events_per_session,
                    disconnect_grace_s=disconnect_grace_s,
                    strict=strict,
                ),
                clock=clock or time.monotonic,
                port=port,
                restart_policy=restart_policy,
                passivate_after_s=passivate_after_s,
                faults=faults,
                observer=observer,
                daemon_threads=daemon_threads,
            ),
            port=port,
            strict=strict,
            send_timeout_s=send_timeout_s,
            max_pending_per_session=max_pending_per_session,
        )
        self._tasks: set[asyncio.Task[None]] = set()
        if sweep_interval_s is not None:
            self._spawn(self._ticker(sweep_interval_s))

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def _spawn(self, coro: Any) -> None:
        task = self._loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _new_reply(self, on_settled: Callable[[], None] | None = None) -> LoopReply:
        return AsyncioReply(self._port, self._loop, on_settled)

    def _start_outbox(
        self, session_id: str, send: SendCallable, close: CloseCallable
    ) -> OutboxCore:
        outbox = AsyncioOutbox(
            session_id=session_id,
            send=send,
            close=close,
            port=self._port,
            notify=self._system.notify,
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

    async def aclose(self, drain_timeout_s: float = 2.0) -> None:
        """Stop new work, let outboxes drain a little, stop every actor, join.

        Shielded, like trio's door: a caller cancelled (even again and again)
        while closing still waits until every actor has stopped, then gets
        its cancellation. Otherwise the actors' threads would outlive the
        registry and keep the interpreter from exiting.
        """
        if self._closed:
            return
        self._closed = True
        closing = self._loop.create_task(self._shut_down(drain_timeout_s))
        cancelled = False
        while not closing.done():
            try:
                await asyncio.shield(closing)
            except asyncio.CancelledError:
                cancelled = True
        if cancelled:
            raise asyncio.CancelledError
        closing.result()

    async def _shut_down(self, drain_timeout_s: float) -> None:
        self._flush_all()
        deadline = self._loop.time() + drain_timeout_s
        # A call still in flight (a send_event_nowait whose frame is on its way
        # from the actor to its outbox) is undrained too, not only queued frames.
        while (self._pending or not all(o.idle for o in self._outboxes)) and (
            self._loop.time() < deadline
        ):
            await asyncio.sleep(0.01)
        reply = self._new_reply()
        self._system.shutdown(reply)
        with contextlib.suppress(SessionError, TimeoutError):
            # Whatever the stop answered, every thread is joined below.
            await asyncio.wait_for(reply.wait(), 10)
        await self._loop.run_in_executor(None, self._system.join, 10.0)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


@asynccontextmanager
async def open_session_registry(
    *,
    replay_ttl_s: float,
    replay_max_bytes_per_session: int,
    replay_max_events_per_session: int | None = None,
    clock: Callable[[], float] | None = None,
    disconnect_grace_s: float | None = None,
    send_timeout_s: float | None = 10.0,
    restart_policy: RestartPolicy | None = None,
    passivate_after_s: float | None = DEFAULT_PASSIVATE_AFTER_S,
    faults: FaultPlan | None = None,
    observer: Callable[[LifecycleEvent], None] | None = None,
    sweep_interval_s: float | None = 1.0,
    max_pending_per_session: int = 10_000,
    strict: bool = True,
    drain_timeout_s: float = 2.0,
) -> AsyncIterator[AsyncioSessionRegistry]:
    """An actor registry for the running asyncio loop (parameters as trio's door)."""
    registry = AsyncioSessionRegistry(
        replay_ttl_s=replay_ttl_s,
        replay_max_bytes_per_session=replay_max_bytes_per_session,
        replay_max_events_per_session=replay_max_events_per_session,
        clock=clock,
        disconnect_grace_s=disconnect_grace_s,
        send_timeout_s=send_timeout_s,
        restart_policy=restart_policy,
        passivate_after_s=passivate_after_s,
        faults=faults,
        observer=observer,
        sweep_interval_s=sweep_interval_s,
        max_pending_per_session=max_pending_per_session,
        strict=strict,
    )
    try:
        yield registry
    finally:
        await registry.aclose(drain_timeout_s)
