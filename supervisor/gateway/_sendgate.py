"""One socket's sends, one at a time and in arrival order, at no cost when nobody waits.

`SendGate` is what a shell's transport takes around each send (a frame
must not interleave with another, a close must not overtake a frame). A
trio or anyio ``Lock`` does that too, but its ``acquire`` checkpoints even
when the lock is free: a task switch per frame, which measured 11 % of the
uvicorn shell's profile. The socket send the gate guards is itself the
checkpoint, so the free gate is taken without one.

Waiters queue in arrival order (FIFO) and the gate is handed straight to
the next one, so nobody overtakes a queued sender. A waiter cancelled after
it was handed the gate passes it on.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Protocol

__all__ = ["SendGate"]


class _Event(Protocol):
    def set(self) -> None: ...

    def is_set(self) -> bool: ...

    async def wait(self) -> object: ...


class SendGate:
    """An async context manager: at most one holder, FIFO handover.

    ``new_event``: the loop's one-shot event type (``trio.Event``, or
    ``anyio.Event`` on any loop); made only when a sender has to wait.
    """

    __slots__ = ("_busy", "_new_event", "_waiters")

    def __init__(self, new_event: Callable[[], _Event]) -> None:
        self._new_event = new_event
        self._busy = False
        self._waiters: deque[_Event] = deque()

    @property
    def busy(self) -> bool:
        return self._busy

    async def __aenter__(self) -> None:
        if not self._busy:
            self._busy = True
            return
        turn = self._new_event()
        self._waiters.append(turn)
        try:
            await turn.wait()
        except BaseException:
            if turn.is_set():
                self._release()  # handed the gate, then cancelled: pass it on
            else:
                self._waiters.remove(turn)
            raise
        # Handed over: the gate stayed busy for us.

    async def __aexit__(self, *exc_info: object) -> None:
        self._release()

    def try_enter(self) -> bool:
        """Take the gate if it is free, without waiting; `release` gives it back."""
        if self._busy:
            return False
        self._busy = True
        return True

    def release(self) -> None:
        """Give back a gate taken with `try_enter` (to the next waiter, if any)."""
        self._release()

    def _release(self) -> None:
        if self._waiters:
            self._waiters.popleft().set()
        else:
            self._busy = False
