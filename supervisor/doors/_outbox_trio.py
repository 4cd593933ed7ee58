"""The outboxes of a trio loop: `TrioOutbox`, and `BlockingTrioOutbox` for
the thread door's blocking transports (see `supervisor.doors._outbox`)."""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from typing import Any

import outcome
import trio

from actors._commands import Activate, Deliver
from actors._errors import ActivationAbortedError
from actors._ports import Delivery, delivery_frames, settle_dropped
from supervisor.doors._outbox import OutboxCore
from supervisor.doors._send_watchdog import ParkedTask, SendWatchdog

__all__ = ["BlockingTrioOutbox", "TrioOutbox"]


class TrioOutbox(OutboxCore):
    """The outbox on a trio loop; its pump runs in the registry's nursery.

    The pump runs inside one cancel scope until a send is cut (by the
    registry's `SendWatchdog` when it ran ``send_timeout_s``, or by an
    aborted activation); only then is a new scope opened. A send only stamps
    when it began: a scope and a deadline per send were a measured cost of
    every awaited send, and a deadline per frame of every replayed frame.
    """

    #: Whether a delivery's frames go out one ``send`` each (`_deliver`'s
    #: short path); a subclass that sends them its own way says ``False``.
    _sends_each_frame = True

    def __init__(
        self,
        *,
        watchdog: SendWatchdog | None,
        nursery: trio.Nursery | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        # With a nursery, the pump starts there on the first delivery or
        # close, not at once: most sessions of a large registry sit detached
        # or parked, and a task spawned per create was a measured cost of
        # creating them. Without one, the owner runs ``run`` itself.
        self._nursery = nursery
        if watchdog is None and self._timeout != math.inf:
            raise ValueError("a trio outbox with a send timeout needs a SendWatchdog")
        self._watchdog = watchdog if self._timeout != math.inf else None
        self._clock = trio.lowlevel.current_clock()
        self._pump_scope: trio.CancelScope | None = None
        # Where the pump waits for deliveries; made by its first wait (most
        # outboxes of a large registry never run a pump: one object fewer for
        # the garbage collector to walk per session).
        self._parked: ParkedTask | None = None
        #: When the send in progress began (trio's clock): the watchdog reads it.
        self.send_began = 0.0

    async def run(self) -> None:
        try:
            while True:
                with trio.CancelScope() as scope:
                    self._pump_scope = scope
                    await self._pump()
                if not scope.cancel_called:
                    return
        finally:
            self._pump_scope = None
            self.finished = True

    def _interrupted(self) -> bool:
        scope = self._pump_scope
        return scope is not None and scope.cancel_called

    def cut(self) -> None:
        """The watchdog's verdict: the send in progress ran out of time."""
        if self._pump_scope is not None:
            self._pump_scope.cancel()

    def _park(self) -> Awaitable[object]:
        parked = self._parked
        if parked is None:
            parked = self._parked = ParkedTask()
        return parked.park()

    def _wake(self) -> None:
        nursery = self._nursery
        if nursery is None:
            if self._parked is not None:
                self._parked.wake()
            return
        self._nursery = None
        if self._pending or self._close_reason is not None:
            try:
                nursery.start_soon(self.run, name=f"duplex-outbox:{self._session_id}")
                return
            except RuntimeError:  # the registry's nursery has closed
                while self._pending:
                    settle_dropped(self._pending.popleft(), "cancelled")
        self.finished = True  # retired before any delivery: no pump at all

    async def _within_timeout(self, call: Callable[[Any], Awaitable[None]], arg: Any) -> bool:
        scope = self._pump_scope
        watchdog = self._watchdog
        if watchdog is not None:
            self.send_began = self._clock.current_time()
            watchdog.watch(self)
        try:
            await call(arg)
        except trio.Cancelled:
            if scope is None or not scope.cancel_called:
                raise  # not cut here: the pump itself is being cancelled
            if self._aborted and self._activating:
                raise ActivationAbortedError("the resume's caller was cancelled") from None
            return False
        finally:
            if watchdog is not None:
                watchdog.unwatch(self)
        return True

    def _restart_timer(self) -> None:
        if self._watchdog is not None:
            self.send_began = self._clock.current_time()

    async def _deliver(self, delivery: Delivery) -> None:
        """`OutboxCore._deliver` for an event's frames without a fault plan
        (every awaited send): the same steps in one coroutine, where the
        general path awaits three more per delivery (the timed call, the
        frames, their generator)."""
        effect = delivery.effect
        if self._faults is not None or type(effect) is not Deliver or not self._sends_each_frame:
            await super()._deliver(delivery)
            return
        watchdog, send, timed_out = self._watchdog, self._send, False
        try:
            if watchdog is not None:
                self.send_began = self._clock.current_time()
                watchdog.watch(self)
            try:
                first = True
                for frame in effect.frames:
                    if not first and watchdog is not None:
                        self.send_began = self._clock.current_time()  # a timer per frame
                    first = False
                    await send(dict(frame))
            except trio.Cancelled:
                scope = self._pump_scope
                if scope is None or not scope.cancel_called:
                    raise  # not cut here: the pump itself is being cancelled
                timed_out = True
            finally:
                if watchdog is not None:
                    watchdog.unwatch(self)
            if timed_out:
                raise self._timed_out()
        except BaseException as exc:  # noqa: BLE001 - the general path's rule on trio
            # (`_propagates` is False here: a pump being cancelled raises again
            # at its next checkpoint).
            self._discard(delivery)
            self._failed(delivery, exc)
            return
        self._sent(delivery)

    async def _sleep(self, seconds: float) -> None:
        await trio.sleep(seconds)

    def _cancel_current_send(self) -> None:
        self.cut()

    def _propagates(self, exc: BaseException) -> bool:
        # A trio.Cancelled from the send is a failed send; if the pump itself
        # is being cancelled, its next checkpoint raises again.
        return False


class BlockingTrioOutbox(TrioOutbox):
    """A trio outbox over a blocking transport (the thread door's).

    ``send`` and ``close`` are plain blocking callables, run on worker
    threads. A delivery's frames go out in one worker-thread hop (a hop per
    frame cost the thread door five sixths of its throughput); the send
    timeout still bounds each frame: the worker stamps when each frame's
    send began, and the registry's watchdog cuts the delivery once one frame
    ran ``send_timeout_s`` (the worker thread is abandoned, still blocked).
    With a fault plan, frames go one hop each, so faults hit the nth send.
    """

    _sends_each_frame = False  # one worker-thread hop per delivery (`_send_frames`)

    def __init__(self, *, limiter: trio.CapacityLimiter, **kwargs: Any) -> None:
        blocking_send: Callable[[dict[str, object]], object] = kwargs.pop("send")
        blocking_close: Callable[[str], object] = kwargs.pop("close")

        async def send_in_thread(frame: dict[str, object]) -> None:
            await trio.to_thread.run_sync(
                blocking_send, frame, abandon_on_cancel=True, limiter=limiter
            )

        async def close_in_thread(reason: str) -> None:
            await trio.to_thread.run_sync(
                blocking_close, reason, abandon_on_cancel=True, limiter=limiter
            )

        super().__init__(send=send_in_thread, close=close_in_thread, **kwargs)
        self._blocking_send = blocking_send

    async def _send_frames(self, effect: Deliver | Activate) -> None:
        if self._faults is not None:
            await super()._send_frames(effect)
            return
        frames = list(delivery_frames(effect))
        self._sends += len(frames)
        send = self._blocking_send
        # trio's clock (perf_counter based) may be read from any thread.
        now = self._clock.current_time if self._watchdog is not None else None

        def send_all() -> None:
            for frame in frames:
                if now is not None:
                    self.send_began = now()
                send(frame)

        await self._in_worker(send_all, self._answer_from_worker(effect))

    def _answer_from_worker(self, effect: Deliver | Activate) -> Callable[[], None] | None:
        """How the worker answers a plain thread waiting for this delivery
        once its frames went out, before the loop settles it (one thread hop
        less per blocking ``send_event``); ``None`` if the loop must answer.

        Only for an event with nothing to run on the loop first (no
        ``on_accepted`` to call, no activation to report), and only a reply
        with ``answer_sent(value)`` (the thread door's): the first of that
        and the loop's own answer wins. The loop still settles the delivery,
        after the worker's report that reached the port first, so the
        caller's next call lands behind it.
        """
        if not isinstance(effect, Deliver) or effect.on_delivered is not None:
            return None
        delivery = self._pending[0] if self._pending else None
        if delivery is None or delivery.effect is not effect:
            return None
        answer_sent: Callable[[object], None] | None = getattr(delivery.reply, "answer_sent", None)
        if answer_sent is None:
            return None
        value = delivery.value
        return lambda: answer_sent(value)

    async def _in_worker(
        self, fn: Callable[[], None], answer: Callable[[], None] | None = None
    ) -> None:
        """Run ``fn`` on one of trio's cached worker threads, its end reported
        through the registry's port (then ``answer`` called there if ``fn``
        returned); a cancelled wait abandons the thread.

        ``trio.to_thread.run_sync`` costs a delivery an extra scheduler pass
        (its limiter's checkpoint) and a wake-up of its own (the port's ride
        along with the loop's other work); the limiter here is unbounded.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        task = trio.lowlevel.current_task()
        abandoned = False

        def back(result: outcome.Outcome[None]) -> None:
            if not abandoned:
                trio.lowlevel.reschedule(task, result)

        def report(result: outcome.Outcome[None]) -> None:
            self._port.submit(lambda: back(result))
            if answer is not None and isinstance(result, outcome.Value):
                answer()

        def abandon(_: object) -> trio.lowlevel.Abort:
            nonlocal abandoned
            abandoned = True
            return trio.lowlevel.Abort.SUCCEEDED

        trio.lowlevel.start_thread_soon(fn, report)
        await trio.lowlevel.wait_task_rescheduled(abandon)
