"""LoopActor: a pykka actor whose messages run on an event loop, not a thread of its own.

pykka builds an actor type from three hooks (``_create_actor_inbox``,
``_create_future``, ``_start_actor_loop``); this one runs every actor of a
registry on the registry's event loop. Each actor is still serial: its inbox
holds one atomic *scheduled* flag, set by the ``put`` that finds the actor
idle, which then asks the loop for one *turn*; further messages ride along.
A turn handles up to `THROUGHPUT` messages, then yields the loop by
scheduling the next turn, so one busy actor cannot starve the others.

A message put from the loop's own thread while the actor is idle and no turn
runs on that thread is handled at once, in the caller's stack: enqueue,
handle, answer, no thread crossed and no loop wake-up written (the reason
this runtime exists: a round trip through ``run_sync_soon`` costs several
times more). A message sent from inside another actor's turn (a session to
its supervisor, the supervisor to a session) is scheduled instead: turns
never nest, so no handler runs inside another's.

``ask`` still works (pykka's proxies too): the future is a
`LoopFuture`, a ``ThreadingFuture`` whose ``get`` from another thread
blocks that thread until the loop answers. On the loop's own thread a
``get`` of an answer not there yet could never be answered (the loop would
wait for itself): it raises ``RuntimeError`` instead of hanging. An ``ask``
from a loop task to an idle actor is answered inline, so its ``get``
returns at once; the library's doors never use futures (they answer with
callbacks on the caller's loop).
"""

from __future__ import annotations

import os
import random
import sys
import threading
from typing import Any, Protocol

import pykka
from pykka import messages

from actors._ports import LoopPort

__all__ = [
    "THROUGHPUT",
    "LoopActor",
    "LoopFuture",
    "LoopInbox",
    "StoppedFlag",
    "enter_loop_thread",
    "leave_loop_thread",
]

#: Messages one actor handles per turn before it yields the loop (Akka's
#: dispatcher ``throughput``). It matters only when many messages queue for
#: one actor at once (sent from other threads, or while it waits for its
#: turn): a door already coalesces a loop tick's ``send_event_nowait`` into
#: one message. Two rounds of ``engine_threads`` (8 threads flooding, quick
#: size, on a shared 2-core machine) gave 29-62k ev/s for 1, 39-67k for 8,
#: 46-106k for 64 and 22-92k for 512: noise dominates; 64 was never behind.
THROUGHPUT = 64


class LoopInbox(Protocol):
    """pykka's inbox contract, plus the scheduling a `LoopActor` needs.

    ``put`` calls the bound actor's ``dispatch`` when it sets the scheduled
    flag; ``take`` returns the next envelope, or ``None`` and clears the flag
    in the same step, so a message is never left behind an actor that
    believes itself idle.
    """

    def put(self, envelope: Any, /) -> None: ...

    def get(self) -> Any: ...

    def empty(self) -> bool: ...

    def bind(self, actor: LoopActor) -> None: ...

    def take(self) -> Any: ...

    def unbind(self, actor: LoopActor) -> None: ...


class _Turns(threading.local):
    #: A turn runs on this thread now: a message sent from it is scheduled.
    running = False


_turns = _Turns()

# Threads that run a registry's loop (a future's get there would wait on itself).
_loop_threads: dict[int, int] = {}
_loop_threads_lock = threading.Lock()


def enter_loop_thread() -> None:
    """The calling thread runs actors from now on (until `leave_loop_thread`)."""
    ident = threading.get_ident()
    with _loop_threads_lock:
        _loop_threads[ident] = _loop_threads.get(ident, 0) + 1


def leave_loop_thread(ident: int) -> None:
    """Thread ``ident`` no longer runs the actors of one registry."""
    with _loop_threads_lock:
        left = _loop_threads.get(ident, 1) - 1
        if left > 0:
            _loop_threads[ident] = left
        else:
            _loop_threads.pop(ident, None)


class LoopFuture(pykka.ThreadingFuture[Any]):
    """pykka's threading future; on a loop thread, never a wait on itself."""

    def get(self, *, timeout: float | None = None) -> Any:
        if (
            self._result is None
            and self._get_hook is None
            and (_turns.running or threading.get_ident() in _loop_threads)
        ):
            raise RuntimeError(
                "a blocking get() on the actors' loop thread of an answer the loop "
                "has not produced yet would wait forever; await it elsewhere or use "
                "block=False from another thread"
            )
        return super().get(timeout=timeout)


class StoppedFlag(threading.Event):
    """pykka's ``actor_stopped``: a `threading.Event` whose condition is made
    only when a thread first waits on it.

    pykka itself only sets and reads the flag; a `threading.Event` builds a
    condition, a lock and a waiters deque per actor, six objects the garbage
    collector walks for every session (100,000 sessions made and parked spent
    more time in full collections than in their own code). ``wait`` still
    blocks like an Event's.
    """

    def __init__(self) -> None:  # no Event.__init__: no condition to make
        self._flag = False
        self._waitable: threading.Event | None = None

    def is_set(self) -> bool:
        return self._flag

    isSet = is_set  # noqa: N815 - threading.Event's old alias

    def set(self) -> None:
        with _stopped_flags_lock:
            self._flag = True
            waitable = self._waitable
        if waitable is not None:
            waitable.set()

    def clear(self) -> None:
        with _stopped_flags_lock:
            self._flag = False
            if self._waitable is not None:
                self._waitable.clear()

    def wait(self, timeout: float | None = None) -> bool:
        with _stopped_flags_lock:
            if self._flag:
                return True
            if self._waitable is None:
                self._waitable = threading.Event()
            waitable = self._waitable
        return waitable.wait(timeout)

    def _at_fork_reinit(self) -> None:
        self._waitable = None

    def __repr__(self) -> str:
        return f"<StoppedFlag {'set' if self._flag else 'unset'}>"


_stopped_flags_lock = threading.Lock()


# A generator of its own, seeded from the OS once (and again in a forked
# child): a program that seeds the `random` module must not repeat our URNs.
_urn_random = random.Random()  # noqa: S311 - a name, not a secret
os.register_at_fork(after_in_child=_urn_random.seed)
_random_bits = _urn_random.getrandbits
_UUID4_CLEAR = ~((0xF000 << 64) | (0xC000 << 48))
_UUID4_SET = (0x4000 << 64) | (0x8000 << 48)  # version 4, RFC 4122 variant


def _uuid4_urn() -> str:
    """``uuid.uuid4().urn``'s form from a seeded generator's bits, not the OS's.

    An actor's URN names it and is no secret; ``uuid4`` reads ``os.urandom``
    (a system call) and builds a UUID object for it: 8 us of each
    session's create on a loaded machine, against 1 us here.
    """
    digits = "%032x" % (_random_bits(128) & _UUID4_CLEAR | _UUID4_SET)
    return f"urn:uuid:{digits[:8]}-{digits[8:12]}-{digits[12:16]}-{digits[16:20]}-{digits[20:]}"


class LoopActor(pykka.Actor):
    """A pykka actor run in turns on a `LoopPort` (see the module docstring).

    A subclass gives the loop as ``actor_loop`` before calling
    ``LoopActor.__init__`` and an inbox that is a `LoopInbox`.
    """

    actor_loop: LoopPort
    _started_turns = False

    def __init__(self, *_args: Any, **_kwargs: Any) -> None:
        # pykka.Actor.__init__'s four fields (a test holds them to pykka's),
        # with a StoppedFlag where pykka makes a threading.Event.
        self.actor_urn = _uuid4_urn()
        self.actor_inbox = self._create_actor_inbox()
        self.actor_stopped = StoppedFlag()
        self._actor_ref = pykka.ActorRef(self)

    @staticmethod
    def _create_future() -> pykka.Future[Any]:
        return LoopFuture()

    def _start_actor_loop(self) -> None:
        inbox: LoopInbox = self.actor_inbox  # type: ignore[assignment]
        inbox.bind(self)  # scheduled from here: the first turn runs on_start
        self.dispatch()

    def dispatch(self) -> None:
        """Run a turn now if the caller is the loop, outside any turn; else soon."""
        if not _turns.running and self.actor_loop.on_loop():
            self._turn()
        else:
            self.actor_loop.submit(self._turn)

    def _turn(self) -> None:
        outer = _turns.running
        _turns.running = True
        try:
            self._run_turn()
        finally:
            _turns.running = outer

    def handle_told_now(self, message: Any) -> None:
        """Handle ``message`` in the caller's stack, then what queued meanwhile.

        Called by an inbox that found this actor started, idle and not
        stopped, on the loop's thread outside any turn, and marked it
        scheduled (so nothing else runs it meanwhile) without queueing
        ``message``: the common awaited call costs no envelope, no queue
        round trip and no pass through pykka's dispatch (``message`` is one
        of the library's own, told, never a pykka message or an ``ask``).
        """
        _turns.running = True
        try:
            try:
                self.on_receive(message)
            except Exception:  # noqa: BLE001 - as _handle_envelope: the actor stops
                self._unasked_failure()
            except BaseException:
                self._stop()  # as _handle_envelope: the interrupt goes on up
                raise
            self._run_turn(THROUGHPUT - 1)
        finally:
            _turns.running = False

    def _run_turn(self, budget: int = THROUGHPUT) -> None:
        inbox: LoopInbox = self.actor_inbox  # type: ignore[assignment]
        if not self._started_turns:
            self._started_turns = True
            self._actor_loop_setup()
        # The flag read as a field, not through is_set (two calls per message).
        stopped: StoppedFlag = self.actor_stopped  # type: ignore[assignment]
        for _ in range(budget):
            if stopped._flag:
                break
            envelope = inbox.take()
            if envelope is None:
                return
            self._handle_envelope(envelope)
        else:
            if not stopped._flag:
                self.actor_loop.submit(self._turn)  # yield the loop; still scheduled
                return
        inbox.unbind(self)
        self._actor_loop_teardown()

    def _handle_envelope(self, envelope: Any) -> None:
        """pykka's loop body for one message (``_actor_loop_running``)."""
        reply_to = envelope.reply_to
        try:
            response = self._handle_receive(envelope.message)
            if reply_to is not None:
                reply_to.set(response)
        except Exception:  # noqa: BLE001 - pykka's rule: to the asker, or the actor stops
            if reply_to is not None:
                reply_to.set_exception()
            else:
                self._unasked_failure()
        except BaseException:
            # pykka stops every actor here; a loop must not wait on its own
            # actors, so this one stops and the interrupt goes on up.
            self._stop()
            raise

    def _unasked_failure(self) -> None:
        """pykka's rule for the exception being handled, nobody asking: logged,
        ``on_failure`` told, the actor stops."""
        self._handle_failure(*sys.exc_info())
        try:
            self.on_failure(*sys.exc_info())
        except Exception:  # noqa: BLE001 - pykka's rule: logged, the actor stops
            self._handle_failure(*sys.exc_info())

    def _actor_loop_teardown(self) -> None:
        # pykka's: answer what is left (this inbox is the actor's own).
        inbox: LoopInbox = self.actor_inbox  # type: ignore[assignment]
        while True:
            envelope = inbox.take()
            if envelope is None:
                return
            if envelope.reply_to is not None:
                if isinstance(envelope.message, messages._ActorStop):
                    envelope.reply_to.set(None)
                else:
                    envelope.reply_to.set_exception(
                        exc_info=(
                            pykka.ActorDeadError,
                            pykka.ActorDeadError(
                                f"{self.actor_ref} stopped before handling the message"
                            ),
                            None,
                        )
                    )
