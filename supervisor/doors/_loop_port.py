"""The port that carries callables onto a registry's event loop, coalesced.

Session actors, outboxes and replies hand work to the loop through a
`CoalescingPort`: callables run on the loop in submission order, and a burst
of them costs the loop one wake-up.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable

import trio

__all__ = ["CoalescingPort"]

logger = logging.getLogger("duplex_supervisor.supervisor")


class CoalescingPort:
    """A `LoopPort` over a thread-safe ``schedule(fn)``.

    Callables run on the loop in submission order. While a drain is
    scheduled and not yet run, later submissions ride along with it, so a
    burst from many actors costs the loop one wake-up. Once the loop has
    ended, submissions are dropped (a caller that could wait is gone too).
    """

    def __init__(
        self,
        schedule: Callable[[Callable[[], None]], object],
        schedule_here: Callable[[Callable[[], None]], bool] | None = None,
    ) -> None:
        self._schedule = schedule
        #: How the loop's own thread schedules a drain without the wake-up
        #: socket write that ``schedule`` pays (a syscall per reply or mailbox
        #: post from an inline turn was the largest single cost of creating
        #: sessions); ``False`` when it cannot (then ``schedule`` is used).
        self._schedule_here = schedule_here
        self._lock = threading.Lock()
        self._pending: deque[Callable[[], object]] = deque()
        self._scheduled = False
        #: The loop's thread: the one that builds the port (each door builds
        #: it on its loop), confirmed at every drain.
        self.loop_thread_id: int | None = threading.get_ident()

    def submit(self, fn: Callable[[], object]) -> None:
        with self._lock:
            self._pending.append(fn)
            if self._scheduled:
                return
            self._scheduled = True
        here = self._schedule_here
        if here is not None and threading.get_ident() == self.loop_thread_id and here(self._drain):
            return
        try:
            self._schedule(self._drain)
        except (trio.RunFinishedError, RuntimeError):
            with self._lock:
                self._pending.clear()
                self._scheduled = False

    def on_loop(self) -> bool:
        return threading.get_ident() == self.loop_thread_id

    def may_run_now(self) -> bool:
        """On the loop with nothing submitted still waiting: running a
        callable now keeps submission order (an actor answering inline must
        not overtake the ``on_accepted`` it submitted just before)."""
        return not self._pending and threading.get_ident() == self.loop_thread_id

    def _drain(self) -> None:
        self.loop_thread_id = threading.get_ident()
        while True:
            with self._lock:
                if not self._pending:
                    self._scheduled = False
                    return
                batch = list(self._pending)
                self._pending.clear()
            for fn in batch:
                try:
                    fn()
                except Exception:
                    logger.exception("a callback raised on the registry's loop")
