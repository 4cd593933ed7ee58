"""Ordered outboxes owned by an event loop: the delivery logic, and asyncio's outbox.

An outbox is one attachment generation's wire. Session actors post
deliveries to it; a `CoalescingPort` (`supervisor.doors._loop_port`) carries
each post onto the loop (many posts, one wake-up while the loop is busy); one
pump task per outbox (on trio, started by its first delivery) sends the
frames, in order, through the transport's async ``send`` and settles every
delivery: the waiting caller gets its value or the send's exception; an
activation reports its outcome to the session first. A transport whose
``send`` has a ``send_now`` (the gateway's trio shell) is handed a lone
one-frame event at once instead, in the poster's step (`OutboxCore._sent_at_once`).

The delivery logic is written once here (`OutboxCore`), as coroutines that
await only what the loop-specific subclass supplies (park/wake, a timed
call, sleeping), so the trio outboxes (`supervisor.doors._outbox_trio`) and
the asyncio outbox below cannot drift apart.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, Literal

from actors._commands import Activate, CloseCallable, Deliver, LifecycleEvent, SendCallable
from actors._errors import ActivationAbortedError, SendTimeoutError
from actors._ports import Delivery, delivery_frames, settle_delivered, settle_dropped, settle_failed
from supervisor._faults import FaultPlan
from supervisor.doors._loop_port import CoalescingPort

__all__ = ["AsyncioOutbox", "CoalescingPort", "OutboxCore"]

logger = logging.getLogger("duplex_supervisor.supervisor")


class OutboxCore:
    """One attachment's ordered wire; see the module docstring.

    Thread-safe entry points (``post``, ``retire``, ``close_transport``)
    submit to the port, but for a ``post`` made on the loop with nothing
    queued before it (an actor answering in its caller's stack), which is
    accepted at once: order with the port's other callbacks holds either
    way. Everything else runs on the loop.
    """

    def __init__(
        self,
        *,
        session_id: str,
        send: SendCallable,
        close: CloseCallable,
        port: CoalescingPort,
        notify: Callable[[LifecycleEvent], None],
        send_timeout_s: float | None,
        faults: FaultPlan | None,
    ) -> None:
        self._session_id = session_id
        self._send = send
        self._close = close
        self._port = port
        self._notify = notify
        self._timeout = math.inf if send_timeout_s is None else send_timeout_s
        self._faults = faults
        # Invariant: deliveries posted and not yet settled, in posting order;
        # None until the first (an empty deque is ~600 bytes and one more
        # object for the garbage collector, per session that never sends).
        self._pending: deque[Delivery] | None = None
        # Invariant: once set, nothing more is sent; pending ones are dropped.
        self._retired: str | None = None
        self._close_reason: str | None = None
        # The caller of the resume that made this outbox gave up: an
        # activation not yet delivered must fail (and roll back).
        self._aborted = False
        self._activating = False
        self._sends = 0
        self._closing = False
        # The reason of a retire queued on the loop (`_retire_queued`).
        self._retiring: str | None = None
        self.finished = False
        # A transport's ``send.send_now(frame, encoded) -> bool``, if it has
        # one (and no fault plan numbers the sends): see `_sent_at_once`.
        self._send_now: Callable[[dict[str, object], bytes | None], bool] | None = (
            getattr(send, "send_now", None) if faults is None else None
        )

    # -- any thread ------------------------------------------------------------------

    def post(self, delivery: Delivery) -> None:
        if self._port.may_run_now():
            self._accept(delivery)
        else:
            self._port.submit(lambda: self._accept(delivery))

    def retire(self, reason: str) -> None:
        # Always later, never in the caller's stack: a session retires an
        # outbox while that outbox's pump may be settling a failed send (an
        # activation's rollback), and the pump's own verdict (close the
        # transport) must come first.
        port = self._port
        if not port.on_loop():
            port.submit(lambda: self.stop(reason, close=False))
        elif self._retiring is None:
            # A bound method, not a closure (four objects fewer per detach);
            # a later retire would find this one's stop done: a no-op.
            self._retiring = reason
            port.submit(self._retire_queued)

    def _retire_queued(self) -> None:
        assert self._retiring is not None  # noqa: S101 - set before it was queued
        self.stop(self._retiring, close=False)

    def close_transport(self, reason: str) -> None:
        self._port.submit(lambda: self.stop(reason, close=True))

    # -- on the loop --------------------------------------------------------------------

    @property
    def idle(self) -> bool:
        """Nothing left to send, nor a transport's close still to make (a
        registry's shutdown drain waits for that close too)."""
        return not self._pending and self._close_reason is None and not self._closing

    @property
    def frames_queued(self) -> int:
        """Frames of the deliveries accepted and not yet settled: a delivery's
        frames count until its last one is written (or it is dropped).
        Counted when asked (a scrape), so a send pays nothing for it."""
        return sum(
            1 + len(d.effect.replay) if isinstance(d.effect, Activate) else len(d.effect.frames)
            for d in self._pending or ()
        )

    def stop(self, reason: str, *, close: bool) -> None:
        if self._retired is not None:
            return
        self._retired = reason
        if close:
            self._close_reason = reason
        while self._pending:
            settle_dropped(self._pending.popleft(), reason)
        self._wake()

    def abort_activation(self) -> None:
        """The resume's caller was cancelled: fail its activation unless delivered."""
        self._aborted = True
        pending = self._pending or deque()
        for delivery in [d for d in pending if isinstance(d.effect, Activate)]:
            pending.remove(delivery)
            settle_failed(delivery, ActivationAbortedError("the resume's caller was cancelled"))
        if self._activating:
            self._cancel_current_send()

    def _accept(self, delivery: Delivery) -> None:
        if self._retired is not None:
            settle_dropped(delivery, self._retired)
        elif self._aborted and isinstance(delivery.effect, Activate):
            settle_failed(delivery, ActivationAbortedError("the resume's caller was cancelled"))
        elif not self._pending and self._send_now is not None and self._sent_at_once(delivery):
            return
        else:
            if self._pending is None:
                self._pending = deque()
            self._pending.append(delivery)
            self._wake()

    def _sent_at_once(self, delivery: Delivery) -> bool:
        """A lone one-frame event with nothing before it, written by the
        transport's ``send_now`` in the poster's step and settled there;
        ``False``: nothing was written, it goes the pump's way.

        A pump's send costs a task switch to the pump, the transport's
        checkpoint, and one back to the waiting caller: most of the gateway's
        cost per event beyond the floor's, and a scheduler pass of latency.
        ``send_now(frame, encoded)`` (``encoded``: the frame's compact JSON
        if the journal made it, else ``None``) must take the whole frame or
        write nothing, never wait and never raise (a frame it could write
        only in part, it finishes itself before any later send); with nothing
        pending the pump sends nothing, so order holds. An ``on_delivered``
        callback runs in the pump, never in the actor turn that posted its
        delivery.
        """
        effect = delivery.effect
        send_now = self._send_now
        if (
            send_now is None
            or not isinstance(effect, Deliver)
            or effect.on_delivered is not None
            or len(effect.frames) != 1
            or not send_now(dict(effect.frames[0]), effect.encoded[0] if effect.encoded else None)
        ):
            return False
        settle_delivered(delivery)
        return True

    async def run(self) -> None:
        """The pump: send, in order, until retired."""
        try:
            await self._pump()
        finally:
            self.finished = True

    async def _pump(self) -> None:
        """Send, in order, until retired, or until `_interrupted` (then the
        loop's own ``run`` calls this again, the delivery already settled)."""
        while True:
            while self._pending and self._retired is None:
                await self._deliver(self._pending[0])
                if self._interrupted():
                    return
            if self._retired is not None:
                # Taken, so a pump run again after an interruption closes once.
                reason, self._close_reason = self._close_reason, None
                if reason is not None:
                    await self._close_now(reason)
                return
            await self._park()

    async def _deliver(self, delivery: Delivery) -> None:
        effect = delivery.effect
        self._activating = isinstance(effect, Activate)
        try:
            if not await self._within_timeout(self._send_frames, effect):
                raise self._timed_out()
        except BaseException as exc:
            self._discard(delivery)
            if self._propagates(exc):
                settle_dropped(delivery, "cancelled")
                raise
            self._failed(delivery, exc)
            return
        finally:
            self._activating = False
        self._sent(delivery)

    def _timed_out(self) -> SendTimeoutError:
        return SendTimeoutError(
            f"a send to session {self._session_id} took longer than {self._timeout} s"
        )

    def _sent(self, delivery: Delivery) -> None:
        """Every frame of ``delivery`` went out: its ``on_accepted``, then its caller."""
        self._discard(delivery)
        on_delivered = getattr(delivery.effect, "on_delivered", None)
        if on_delivered is not None:
            try:
                on_delivered()
            except Exception:
                logger.exception("on_accepted raised in session %s", self._session_id)
        settle_delivered(delivery)

    def _discard(self, delivery: Delivery) -> None:
        if self._pending and self._pending[0] is delivery:
            self._pending.popleft()

    def _failed(self, delivery: Delivery, exc: BaseException) -> None:
        generation = delivery.effect.attachment_generation
        if isinstance(exc, SendTimeoutError):
            # The library gives up on a hung transport itself.
            settle_failed(delivery, exc)
            self._give_up("send_timeout", generation)
        elif not settle_failed(delivery, exc):
            # Nobody waits for this frame, so nobody else would notice.
            self._give_up("send_failed", generation)

    def _give_up(self, reason: Literal["send_timeout", "send_failed"], generation: int) -> None:
        self._notify(
            LifecycleEvent(
                kind=reason,
                session_id=self._session_id,
                attachment_generation=generation,
                reason=reason,
            )
        )
        self.stop(reason, close=True)

    async def _send_frames(self, effect: Deliver | Activate) -> None:
        # One timer for the delivery, restarted per frame: the timeout bounds
        # each send, not a long replay as a whole. The first frame's is the
        # one _within_timeout just started (a deadline set twice per frame
        # was a measured cost of every awaited send).
        faults = self._faults
        if faults is None:
            # Per frame only what a replay must pay (sends are numbered
            # only for a fault plan).
            send, restart, started = self._send, self._restart_timer, False
            for frame in delivery_frames(effect):
                if started:
                    restart()
                started = True
                await send(frame)
            return
        for index, frame in enumerate(delivery_frames(effect)):
            self._sends += 1
            if index:
                self._restart_timer()
            if faults is not None:
                action = faults.transport_action(
                    self._session_id, effect.attachment_generation, self._sends
                )
                if action is not None:
                    await action.apply(self._sleep)
            await self._send(frame)

    async def _close_now(self, reason: str) -> None:
        self._closing = True
        try:
            if self._faults is not None:
                self._faults.check_close(self._session_id)
            await self._within_timeout(self._close, reason)
        except Exception:  # noqa: BLE001 - a failed close is logged; the session goes on
            logger.warning("closing a transport of session %s failed", self._session_id)
        finally:
            self._closing = False

    # -- what a loop supplies ---------------------------------------------------------

    def _interrupted(self) -> bool:
        """Whether the pump must leave `_pump` to be run again (trio: its
        cancel scope was used to cut a send)."""
        return False

    def _park(self) -> Awaitable[object]:
        """What the pump awaits (at once) until `_wake`."""
        raise NotImplementedError

    def _wake(self) -> None:
        raise NotImplementedError

    async def _within_timeout(self, call: Callable[[Any], Awaitable[None]], arg: Any) -> bool:
        """Await ``call(arg)``; ``False`` if the send timeout ran out first.
        (A function and its argument, not a closure: one runs per send.)"""
        raise NotImplementedError

    def _restart_timer(self) -> None:
        """Give the send about to start a whole ``send_timeout_s`` of its own."""
        raise NotImplementedError

    async def _sleep(self, seconds: float) -> None:
        raise NotImplementedError

    def _cancel_current_send(self) -> None:
        raise NotImplementedError

    def _propagates(self, exc: BaseException) -> bool:
        """Whether ``exc`` is the pump's own cancellation, not a failed send."""
        raise NotImplementedError


class AsyncioOutbox(OutboxCore):
    """The outbox on an asyncio loop; its pump is a task on that loop."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._event = asyncio.Event()
        self._current: asyncio.Task[None] | None = None
        self._timer: asyncio.Timeout | None = None
        self._cancelled_by_abort = False

    async def _park(self) -> None:
        await self._event.wait()
        self._event.clear()

    def _wake(self) -> None:
        self._event.set()

    async def _within_timeout(self, call: Callable[[Any], Awaitable[None]], arg: Any) -> bool:
        if not self._activating:
            # Only an activation's send is ever aborted: any other runs in the
            # pump's task (a task per delivery was a measured cost).
            return await self._timed(call, arg)
        # An activation's sends run as their own task so an abort can cancel
        # them without touching the pump's own cancellation state.
        task: asyncio.Task[bool] = asyncio.ensure_future(self._timed(call, arg))
        self._current = task  # type: ignore[assignment]
        try:
            await asyncio.wait({task})
        except asyncio.CancelledError:
            task.cancel()
            raise
        finally:
            self._current = None
        if task.cancelled() and self._cancelled_by_abort:
            raise ActivationAbortedError("the resume's caller was cancelled")
        return task.result()

    async def _timed(self, call: Callable[[Any], Awaitable[None]], arg: Any) -> bool:
        timer = asyncio.timeout(None)
        try:
            async with timer:
                self._timer = timer
                self._restart_timer()
                await call(arg)
        except TimeoutError:
            if timer.expired():
                return False
            raise  # the transport's own TimeoutError: a failed send
        finally:
            self._timer = None
        return True

    def _restart_timer(self) -> None:
        if self._timer is not None and self._timeout != math.inf:
            self._timer.reschedule(asyncio.get_running_loop().time() + self._timeout)

    async def _sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    def _cancel_current_send(self) -> None:
        if self._current is not None:
            self._cancelled_by_abort = True
            self._current.cancel()

    def _propagates(self, exc: BaseException) -> bool:
        task = asyncio.current_task()
        return (
            isinstance(exc, asyncio.CancelledError) and task is not None and (task.cancelling() > 0)
        )
