"""What a door's loop supplies, and what every door does with it.

`LoopDoor` is what `supervisor.doors._door.AsyncSessionRegistry` stands on.
A subclass says how its loop waits (`LoopReply`), starts an outbox, sleeps,
shields a wait and spells cancellation; the trio and asyncio doors are those
subclasses, and the thread door runs the trio one on a loop thread of its
own. Written here once for all three: the supervisor's timers, the outboxes
kept for the drain, the shutdown, and undoing a ``create`` or ``resume``
whose caller was cancelled.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from actors._commands import (
    AbortResume,
    Close,
    CloseCallable,
    Command,
    ResumeResult,
    SendCallable,
)
from actors._errors import RegistryClosedError, SessionCrashedError, SessionError
from supervisor._options import RegistryOptions
from supervisor._system import SessionSystem
from supervisor.doors._door_calls import LoopReply, SessionCalls, report_refused
from supervisor.doors._loop_port import CoalescingPort
from supervisor.doors._outbox import OutboxCore

__all__ = ["LoopDoor"]

logger = logging.getLogger("duplex_supervisor.supervisor")

#: How long a cancelled resume waits, shielded, to learn whether to roll back.
_ABORT_WAIT_S = 30.0
#: How long shutdown waits for every session to stop.
_STOP_WAIT_S = 10.0


class LoopDoor:
    """A registry's side of its loop: see the module docstring."""

    def __init__(self, *, options: RegistryOptions, port: CoalescingPort) -> None:
        self._options = options
        self._system = options.start_system(port)
        # Bound once: every outbox holds it (a bound method per outbox was
        # one more object per session for the garbage collector).
        self._notify = self._system.notify
        self._port = port
        self._strict = options.strict
        self._send_timeout_s = options.send_timeout_s
        self._calls = SessionCalls(
            self._system,
            port,
            max_pending=options.max_pending_per_session,
            new_reply=self._new_reply,
            new_event=self._new_event,
            notify=self._notify,
        )
        # Outboxes whose pumps may still run (for the drain on exit); finished
        # ones are dropped whenever the list doubles: O(1) a create, amortized.
        self._outboxes: list[OutboxCore] = []
        self._prune_outboxes_at = 64
        self._closed = False

    # -- what a loop supplies ---------------------------------------------------------

    def _new_reply(self) -> LoopReply:
        raise NotImplementedError

    def _start_outbox(
        self, session_id: str, send: SendCallable, close: CloseCallable
    ) -> OutboxCore:
        raise NotImplementedError

    def _would_block(self, session_id: str) -> BaseException:
        raise NotImplementedError

    def _new_event(self) -> Any:
        """The loop's one-shot event (``set()``, ``await wait()``)."""
        raise NotImplementedError

    def _is_cancellation(self, exc: BaseException) -> bool:
        raise NotImplementedError

    async def _shielded(self, reply: LoopReply, timeout: float) -> Any:
        """Wait for ``reply`` where no cancellation reaches, up to ``timeout``."""
        raise NotImplementedError

    async def _sleep(self, seconds: float) -> None:
        raise NotImplementedError

    def _now(self) -> float:
        """The loop's clock (real time: the drain deadline is not logical time)."""
        raise NotImplementedError

    async def _run_timers(self) -> None:
        """The supervisor's timers (restart backoffs), looked at on the loop.

        Sleeps until the next timer is due, or `Timers.POLL_S` at most, so a
        timer on a clock that jumps (a fake or shifted one) still fires.
        """
        timers = self._system.timers
        while True:
            wait = timers.wait_s()
            await self._sleep(timers.POLL_S if wait is None else max(wait, 0.001))
            self._system.poll_timers()

    # -- shutdown, the same for every door ---------------------------------------------

    async def _shut_down(self) -> None:
        """Drain, then stop every session, then the supervisor. Runs once.

        1. No new call is taken (`RegistryClosedError`).
        2. Queued ``send_event_nowait`` calls go to their sessions, and for
           up to ``drain_timeout_s`` calls in flight settle and outboxes send
           what they hold.
        3. Every session stops: calls still waiting get
           ``RegistryClosedError``; outboxes are retired with the reason
           ``"shutdown"``, their unsent frames dropped (logged with a count).
           No transport's ``close`` is called: the transports belong to
           their owners, as in the seed.
        4. The supervisor stops (nothing to join: no actor has a thread).

        Must be called shielded from cancellation (each door does).
        """
        if self._closed:
            return
        self._closed = True
        self._calls.flush_all()
        deadline = self._now() + self._options.drain_timeout_s
        # A call still in flight (a send_event_nowait whose frame is on its way
        # from the actor to its outbox) is undrained too, not only queued frames.
        while not self._drained() and self._now() < deadline:
            await self._sleep(0.005)
        if not self._drained():
            logger.warning(
                "registry shut down with %d calls in flight and %d outboxes not drained",
                self._calls.in_flight(),
                sum(1 for o in self._outboxes if not o.idle),
            )
        stopped = self._new_reply()
        self._system.shutdown(stopped)
        try:
            await self._shielded(stopped, _STOP_WAIT_S)
        except (SessionError, TimeoutError):
            logger.warning("stopping the sessions did not answer")
        self._system.join()

    def _drained(self) -> bool:
        return not self._calls.pending and all(o.idle for o in self._outboxes)

    # -- plumbing -------------------------------------------------------------------

    def _keep(self, outbox: OutboxCore) -> None:
        self._outboxes.append(outbox)
        if len(self._outboxes) >= self._prune_outboxes_at:
            self._outboxes = [o for o in self._outboxes if not o.finished]
            self._prune_outboxes_at = 2 * len(self._outboxes) + 64

    @property
    def system(self) -> SessionSystem:
        """The actors behind this registry (for tests and diagnostics)."""
        return self._system

    def submit(self, fn: Callable[[], object]) -> None:
        """Run ``fn`` soon on the registry's loop; callable from any thread."""
        self._port.submit(fn)

    def report_refused(self, session_id: str, error: BaseException) -> None:
        """Log a refused ``send_event_nowait`` and tell the observer."""
        report_refused(self._system.notify, session_id, error)

    def _check_open(self) -> None:
        if self._closed:
            raise RegistryClosedError("the session registry is shut down")

    def _ask(self, session_id: str, command: Command) -> Awaitable[Any]:
        """Send ``command`` and return what to await for its answer (`SessionCalls.ask`)."""
        self._check_open()
        return self._calls.ask(session_id, command)

    # -- a create or resume whose caller was cancelled is undone -------------------------

    async def _create_unanswered(
        self, session_id: str, reply: LoopReply, outbox: OutboxCore, exc: BaseException
    ) -> None:
        """A create's wait for its answer raised ``exc`` (the caller re-raises
        it): its outbox stops, and a create whose caller was cancelled
        before the answer is closed again."""
        outbox.stop("create_failed", close=False)
        if self._is_cancellation(exc):
            await self._undo_cancelled_create(session_id, reply)

    async def _undo_cancelled_create(self, session_id: str, reply: LoopReply) -> None:
        """The caller gave up before it saw its token: the session must not stay."""
        try:
            await self._shielded(reply, _ABORT_WAIT_S)
        except Exception:  # noqa: BLE001 - not created: nothing to undo
            return
        closing = self._new_reply()
        self._system.close(session_id, Close(), closing)
        try:
            await self._shielded(closing, _ABORT_WAIT_S)
        except Exception:  # noqa: BLE001 - a crashed close leaves it to the owner
            logger.warning("closing the cancelled create of %s failed", session_id)

    async def _await_resume(
        self, session_id: str, reply: LoopReply, outbox: OutboxCore, *, activates: bool
    ) -> ResumeResult:
        """The resume's answer; cancelled before its commit point, rolled back."""
        try:
            result: ResumeResult = await reply.wait()
        except BaseException as exc:
            if self._is_cancellation(exc):
                await self._roll_back_cancelled(session_id, reply, outbox, activates=activates)
            outbox.stop("resume_failed", close=False)
            raise
        return result

    async def _roll_back_cancelled(
        self, session_id: str, reply: LoopReply, outbox: OutboxCore, *, activates: bool
    ) -> None:
        outbox.abort_activation()
        try:
            result = await self._shielded(reply, _ABORT_WAIT_S)
        except Exception:  # noqa: BLE001 - it failed or was aborted: nothing stands
            return
        if not isinstance(result, ResumeResult) or activates:
            # With an activation, success means it reached the wire: committed.
            return
        abort = self._new_reply()
        command = AbortResume(attachment_generation=result.attachment_generation)
        self._system.call(session_id, command, abort, internal=True)
        try:
            await self._shielded(abort, _ABORT_WAIT_S)
        except SessionCrashedError:
            logger.warning("rolling back a cancelled resume of %s crashed once", session_id)
