"""The trio front door: ``open_session_registry()``.

    async with open_session_registry(
        replay_ttl_s=30, replay_max_bytes_per_session=1 << 20
    ) as registry:
        created = await registry.create("s1", send=ws.send_json, close=ws.aclose)
        await registry.send_event("s1", {"type": "delta", "text": "hi"})

``send`` and ``close`` are trio async functions. Each attachment's outbox
pump runs in the registry's nursery; ``on_accepted``, observer callbacks and
replies reach the loop through ``TrioToken.run_sync_soon``, coalesced, so a
waiting task never parks a thread. Leaving the block stops new work, lets
outboxes drain for up to ``drain_timeout_s``, then stops every actor.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import outcome
import trio

from actors.errors import SessionError
from actors.messages import CloseCallable, LifecycleEvent, SendCallable
from actors.ports import NO_WAITER
from actors.state import SessionConfig
from supervisor.actor import DEFAULT_PASSIVATE_AFTER_S, SessionSystem
from supervisor.async_door import AsyncSessionRegistry, LoopReply, check_timing
from supervisor.faults import FaultPlan
from supervisor.outbox import CoalescingPort, OutboxCore, TrioOutbox
from supervisor.policy import RestartPolicy

__all__ = ["TrioSessionRegistry", "open_session_registry"]


class TrioReply(LoopReply):
    """Wakes one waiting trio task with ``reschedule``; a cancelled waiter may wait again."""

    __slots__ = ("_task",)

    def __init__(self, port: CoalescingPort, on_settled: Callable[[], None] | None = None) -> None:
        super().__init__(port, on_settled)
        self._task: trio.lowlevel.Task | None = None

    def _wake(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            trio.lowlevel.reschedule(task, outcome.Value(None))

    async def wait(self) -> Any:
        if not self._done:
            self._task = trio.lowlevel.current_task()

            def abort(_: object) -> trio.lowlevel.Abort:
                self._task = None
                return trio.lowlevel.Abort.SUCCEEDED

            await trio.lowlevel.wait_task_rescheduled(abort)
        else:
            await trio.lowlevel.checkpoint()
        return self._outcome()


class TrioSessionRegistry(AsyncSessionRegistry):
    """The registry :func:`open_session_registry` yields."""

    def __init__(
        self,
        *,
        nursery: trio.Nursery,
        system: SessionSystem,
        port: CoalescingPort,
        strict: bool,
        send_timeout_s: float | None,
        max_pending_per_session: int,
    ) -> None:
        super().__init__(
            system=system,
            port=port,
            strict=strict,
            send_timeout_s=send_timeout_s,
            max_pending_per_session=max_pending_per_session,
        )
        self._nursery = nursery

    def _new_reply(self, on_settled: Callable[[], None] | None = None) -> LoopReply:
        return TrioReply(self._port, on_settled)

    def _start_outbox(
        self, session_id: str, send: SendCallable, close: CloseCallable
    ) -> OutboxCore:
        outbox = TrioOutbox(
            session_id=session_id,
            send=send,
            close=close,
            port=self._port,
            notify=self._system.notify,
            send_timeout_s=self._send_timeout_s,
            faults=self._system.transport_faults,
        )
        self._keep(outbox)
        self._nursery.start_soon(outbox.run, name=f"duplex-outbox:{session_id}")
        return outbox

    def _would_block(self, session_id: str) -> BaseException:
        return trio.WouldBlock(f"session {session_id} has too many calls in flight")

    def _new_event(self) -> trio.Event:
        return trio.Event()

    def _is_cancellation(self, exc: BaseException) -> bool:
        return isinstance(exc, trio.Cancelled)

    async def _shielded(self, reply: LoopReply, timeout: float) -> Any:
        with trio.CancelScope(shield=True, deadline=trio.current_time() + timeout):
            return await reply.wait()
        raise TimeoutError("no answer within the shielded wait")

    async def _drain(self, timeout: float) -> None:
        self._flush_all()
        # A call still in flight (a send_event_nowait whose frame is on its way
        # from the actor to its outbox) is undrained too, not only queued frames.
        with trio.move_on_after(timeout):
            while self._pending or not all(o.idle for o in self._outboxes):
                await trio.sleep(0.01)

    async def _ticker(self, interval: float) -> None:
        while True:
            await trio.sleep(interval)
            if not self._closed:
                self._system.sweep(NO_WAITER)

    async def _aclose(self, drain_timeout_s: float) -> None:
        if self._closed:
            return
        self._closed = True
        with trio.CancelScope(shield=True):
            await self._drain(drain_timeout_s)
            reply = self._new_reply()
            self._system.shutdown(reply)
            with trio.move_on_after(10), contextlib.suppress(SessionError):
                # Whatever the stop answered, every thread is joined below.
                await reply.wait()
            await trio.to_thread.run_sync(self._system.join, 10.0)


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
) -> AsyncIterator[TrioSessionRegistry]:
    """A registry of actor sessions for the current trio run; see the module docstring.

    ``send_timeout_s``: a send running longer makes the library give up on
    that transport (``close("send_timeout")``); ``None`` waits forever.
    ``sweep_interval_s``: how often, in real time, TTLs and the disconnect
    grace are checked (``None``: only on ``await registry.sweep()``).
    """
    check_timing(sweep_interval_s=sweep_interval_s, send_timeout_s=send_timeout_s)
    config = SessionConfig(
        replay_ttl_s=replay_ttl_s,
        replay_max_bytes=replay_max_bytes_per_session,
        replay_max_events=replay_max_events_per_session,
        disconnect_grace_s=disconnect_grace_s,
        strict=strict,
    )
    port = CoalescingPort(trio.lowlevel.current_trio_token().run_sync_soon)
    system = SessionSystem(
        config=config,
        clock=clock or time.monotonic,
        port=port,
        restart_policy=restart_policy,
        passivate_after_s=passivate_after_s,
        faults=faults,
        observer=observer,
    )
    async with trio.open_nursery() as nursery:
        registry = TrioSessionRegistry(
            nursery=nursery,
            system=system,
            port=port,
            strict=strict,
            send_timeout_s=send_timeout_s,
            max_pending_per_session=max_pending_per_session,
        )
        if sweep_interval_s is not None:
            nursery.start_soon(registry._ticker, sweep_interval_s)
        try:
            yield registry
        finally:
            await registry._aclose(drain_timeout_s)
            nursery.cancel_scope.cancel()
