"""The blocking front door, for engine threads that are not an event loop.

`ThreadSessionRegistry` is the trio door run on a loop thread of its
own, with a blocking form of every method. Most are not written again
here: each is made from the async door's method of the same name, so the
three doors share one description of the seed's methods, one outbox, one
shutdown. ``send_event``, ``send_events`` and ``acknowledge``, the engine's
hot path, build their command here and go to the session without the task
a made method runs on the loop (`supervisor.doors._thread_loop`).

    with ThreadSessionRegistry(replay_ttl_s=30, replay_max_bytes_per_session=1 << 20) as reg:
        created = reg.create("s1", send=ws.send_json, close=ws.close)
        reg.send_event("s1", {"type": "delta", "text": "hi"})
"""

from __future__ import annotations

import inspect
import math
import queue
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Concatenate, ParamSpec, TypeVar, Unpack

import outcome
import trio

from actors._commands import (
    Acknowledge,
    ActivationPayloadFactory,
    Command,
    ResumeResult,
    SendEvent,
    SendEvents,
    SessionCreated,
)
from actors._errors import RegistryClosedError, UnknownSessionError
from actors._journal import JournalEntry
from supervisor._options import RegistryOptions, RegistryOptionsDict
from supervisor._system import RegistryStats, SessionSystem
from supervisor._validate import check_session_id, check_unjournaled
from supervisor.doors._door import AsyncSessionRegistry
from supervisor.doors._thread_loop import HostedTrioRegistry, ThreadReply
from supervisor.doors._trio import serve_registry

__all__ = ["BlockingClose", "BlockingSend", "ThreadSessionRegistry"]

BlockingSend = Callable[[dict[str, object]], object]
"""A blocking transport ``send(frame)``: called on a worker thread, each attachment's in order."""
BlockingClose = Callable[[str], object]
"""A blocking transport ``close(reason)``: called on a worker thread."""

#: How often a blocking caller checks that the loop thread still runs.
_LOOP_CHECK_S = 1.0

_P = ParamSpec("_P")
_R = TypeVar("_R")


def _blocking(
    method: Callable[Concatenate[AsyncSessionRegistry, _P], Awaitable[_R]],
) -> Callable[Concatenate[ThreadSessionRegistry, _P], _R]:
    """The blocking form of an async door method, run on the registry's loop."""
    name = method.__name__

    def call(self: ThreadSessionRegistry, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        result: _R = self._run(name, args, kwargs)
        return result

    call.__name__ = name
    call.__qualname__ = f"ThreadSessionRegistry.{name}"
    # help() and IDEs show the async method's parameters, not *args/**kwargs.
    setattr(call, "__signature__", inspect.signature(method))  # noqa: B010
    call.__doc__ = (
        f"Blocking `AsyncSessionRegistry.{name}`: the same parameters, result "
        "and errors; it waits at most the registry's ``timeout`` "
        "(``TimeoutError``, the call cancelled as on the async door)."
    )
    return call


class ThreadSessionRegistry:
    """The seed's registry for plain threads; use it as a context manager.

    Every method of `AsyncSessionRegistry` is here, blocking, with the
    same parameters, results and errors; call them from any thread except
    the registry's own loop thread (so never from an ``on_accepted`` or an
    observer callback: that raises ``RuntimeError``). A thread's calls,
    blocking or ``send_event_nowait``, reach the registry in the order the
    thread made them. ``send`` and ``close`` of its transports are plain
    blocking callables, run on worker threads, each attachment's in order,
    so a hung client stalls only its own outbox; ``send_timeout_s`` bounds
    each send as on the other doors (a timed-out worker thread is abandoned).
    ``on_accepted`` and observer callbacks run on the loop thread and must
    not block.

    Args:
        timeout: How long a blocking call waits for its answer (``None``:
            forever). Past it the call is cancelled, exactly as a cancelled
            async call (a ``send_event`` stays journaled; a ``resume`` rolls
            back), and ``TimeoutError`` is raised.
        **options: The fields of `RegistryOptions` (typed by `RegistryOptionsDict`).

    Raises:
        TypeError: a misspelled option, before any thread starts.
        ValueError: a bad option, before any thread starts.
    """

    def __init__(
        self, *, timeout: float | None = 30.0, **options: Unpack[RegistryOptionsDict]
    ) -> None:
        self._options = RegistryOptions(**options)
        self._timeout = timeout
        self._started = threading.Event()
        self._stop: trio.Event | None = None
        self._door: HostedTrioRegistry | None = None
        # The actors of a registry that was shut down: stats() still reads
        # their figures, as on the async doors.
        self._ended: SessionSystem | None = None
        self._failure: BaseException | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="duplex-loop", daemon=True)
        self._thread.start()
        self._started.wait()
        if self._failure is not None:
            raise self._failure

    def _loop(self) -> None:
        try:
            trio.run(self._serve)
        except BaseException as exc:  # noqa: BLE001 - handed to the constructor
            self._failure = exc
        finally:
            self._started.set()

    async def _serve(self) -> None:
        registry: Any
        async with serve_registry(self._options, HostedTrioRegistry) as registry:
            self._door = registry
            self._stop = trio.Event()
            self._started.set()
            await self._stop.wait()

    def __enter__(self) -> ThreadSessionRegistry:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(sessions={len(self.session_ids())})"

    @property
    def system(self) -> SessionSystem:
        """The actors behind this registry (for tests and diagnostics)."""
        return self._hosted().system

    def _hosted(self) -> HostedTrioRegistry:
        door = self._door
        if door is None:
            raise RegistryClosedError("the session registry is shut down")
        return door

    def _run(self, name: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
        """Run the async door's method ``name`` on the loop; block for its outcome.

        The call rides the registry's port, like ``send_event_nowait``, so it
        reaches the loop after everything this thread queued before it.
        """
        door = self._hosted()
        if self._closed:
            raise RegistryClosedError("the session registry is shut down")
        if threading.current_thread() is self._thread:
            raise RuntimeError("a blocking call from the registry's own loop thread")
        method = getattr(door, name)
        limit = math.inf if self._timeout is None else self._timeout
        done = threading.Event()
        answer: list[outcome.Outcome[Any]] = []

        async def call() -> None:
            try:
                with trio.move_on_after(limit) as scope:
                    answer.append(outcome.Value(await method(*args, **kwargs)))
                if scope.cancelled_caught:
                    answer.append(outcome.Error(TimeoutError(f"no answer within {limit} s")))
            except trio.Cancelled:
                # The registry shut down under this call.
                answer.append(outcome.Error(RegistryClosedError("the registry was shut down")))
                raise
            except BaseException as exc:  # noqa: BLE001 - it is the caller's answer
                answer.append(outcome.Error(exc))
            finally:
                done.set()

        door.submit(lambda: door.spawn(call))
        while not done.wait(_LOOP_CHECK_S):
            if not self._thread.is_alive():
                raise RegistryClosedError("the session registry is shut down")
        return answer[0].unwrap()

    def _ask(self, session_id: str, command: Command) -> Any:
        """What the async door's plain `_ask` methods do, without a task per call.

        Same order (through the port), same answer, same timeout: past it the
        caller gets ``TimeoutError``; a call still waiting for room is
        cancelled, one already sent to its session stays sent.
        """
        door = self._hosted()
        if self._closed:
            raise RegistryClosedError("the session registry is shut down")
        if threading.current_thread() is self._thread:
            raise RuntimeError("a blocking call from the registry's own loop thread")
        reply = ThreadReply(door.port)
        door.submit(lambda: door.ask_for_thread(session_id, command, reply))
        limit = self._timeout
        deadline = math.inf if limit is None else time.monotonic() + limit
        while not reply.landed.wait(min(_LOOP_CHECK_S, max(deadline - time.monotonic(), 0.0))):
            if not self._thread.is_alive():
                raise RegistryClosedError("the session registry is shut down")
            if limit is not None and deadline != math.inf and time.monotonic() >= deadline:
                # Once: the loop decides, so a call is either cancelled or sent.
                deadline = math.inf
                door.submit(lambda: door.give_up(reply, limit))
        return reply.answer()

    # -- the seed's methods, and the async door's others, blocking -----------------------

    def create(
        self,
        session_id: str,
        *,
        send: BlockingSend,
        close: BlockingClose,
        lease_generation: int = 0,
    ) -> SessionCreated:
        """Blocking `AsyncSessionRegistry.create`, for blocking transports.

        ``send`` and ``close`` are plain callables, run on worker threads;
        the returned attachment (and every later one) holds them as given.
        """
        kwargs = {"send": send, "close": close, "lease_generation": lease_generation}
        created: SessionCreated = self._run("create", (session_id,), kwargs)
        return created

    def send_event(
        self,
        session_id: str,
        payload: Mapping[str, object],
        *,
        journal: bool = True,
        on_accepted: Callable[[], None] | None = None,
    ) -> JournalEntry | None:
        """Blocking `AsyncSessionRegistry.send_event`: the same parameters,
        result and errors; it waits at most the registry's ``timeout``
        (``TimeoutError``; the event stays journaled, as on the async door)."""
        check_session_id(session_id, strict=self._options.strict)
        check_unjournaled(payload, journal=journal, strict=self._options.strict)
        command = SendEvent(payload=payload, journal=journal, on_accepted=on_accepted)
        entry: JournalEntry | None = self._ask(session_id, command)
        return entry

    def send_events(
        self,
        session_id: str,
        payloads: Sequence[Mapping[str, object]],
        *,
        journal: bool = True,
    ) -> tuple[JournalEntry | None, ...]:
        """Blocking `AsyncSessionRegistry.send_events`, as ``send_event``."""
        check_session_id(session_id, strict=self._options.strict)
        for payload in payloads:
            check_unjournaled(payload, journal=journal, strict=self._options.strict)
        command = SendEvents(payloads=tuple(payloads), journal=journal)
        entries: tuple[JournalEntry | None, ...] = self._ask(session_id, command)
        return entries

    def acknowledge(self, session_id: str, sequence: int) -> int:
        """Blocking `AsyncSessionRegistry.acknowledge`, as ``send_event``."""
        check_session_id(session_id, strict=self._options.strict)
        removed: int = self._ask(session_id, Acknowledge(sequence=sequence))
        return removed

    detach = _blocking(AsyncSessionRegistry.detach)
    release_attachment = _blocking(AsyncSessionRegistry.release_attachment)
    begin_resume = _blocking(AsyncSessionRegistry.begin_resume)
    end_resume = _blocking(AsyncSessionRegistry.end_resume)
    settle_lease_generation = _blocking(AsyncSessionRegistry.settle_lease_generation)
    has_attachment = _blocking(AsyncSessionRegistry.has_attachment)
    is_current_attachment = _blocking(AsyncSessionRegistry.is_current_attachment)
    authenticate_resume = _blocking(AsyncSessionRegistry.authenticate_resume)

    def resume(
        self,
        session_id: str,
        *,
        resume_token: str,
        last_received_server_event_seq: int,
        send: BlockingSend,
        close: BlockingClose,
        activation_payload_factory: ActivationPayloadFactory | None = None,
        lease_generation: int | None = None,
    ) -> ResumeResult:
        """Blocking `AsyncSessionRegistry.resume`, for blocking transports.

        Past the registry's ``timeout`` the resume is cancelled and rolls
        back exactly as a cancelled async resume does.
        """
        kwargs = {
            "resume_token": resume_token,
            "last_received_server_event_seq": last_received_server_event_seq,
            "send": send,
            "close": close,
            "activation_payload_factory": activation_payload_factory,
            "lease_generation": lease_generation,
        }
        result: ResumeResult = self._run("resume", (session_id,), kwargs)
        return result

    abandon_resume = _blocking(AsyncSessionRegistry.abandon_resume)
    close = _blocking(AsyncSessionRegistry.close)
    sweep = _blocking(AsyncSessionRegistry.sweep)

    # -- without a wait --------------------------------------------------------------------

    def send_event_nowait(
        self, session_id: str, payload: Mapping[str, object], *, journal: bool = True
    ) -> None:
        """Queue an event and return at once, from any thread.

        The event reaches the registry's loop in call order per thread and is
        then handled as the async door's ``send_event_nowait``: refusals are
        logged and reach the observer as ``event_refused`` events. Leaving
        the registry delivers what was queued before (within
        ``drain_timeout_s``).

        Raises:
            UnknownSessionError: the registry holds no such session.
            queue.Full: the session has ``max_pending_per_session`` calls in
                flight (read without a lock: events already on their way
                past it are refused and reported instead).
            RegistryClosedError: the registry is shut down.
        """
        check_session_id(session_id, strict=self._options.strict)
        check_unjournaled(payload, journal=journal, strict=self._options.strict)
        door = self._hosted()
        if self._closed:
            raise RegistryClosedError("the session registry is shut down")
        if not door.system.knows(session_id):
            raise UnknownSessionError(session_id)
        if door.pending_calls(session_id) >= self._options.max_pending_per_session:
            raise queue.Full(f"session {session_id} has too many calls in flight")
        door.submit(lambda: door.send_event_nowait_or_report(session_id, payload, journal))

    def stats(self) -> RegistryStats:
        """The registry's figures, read without an actor round trip.

        After ``shutdown()`` it still answers: the figures the registry ended with.
        """
        door, ended = self._door, self._ended
        if door is None and ended is not None:
            return ended.stats()
        return self._hosted().stats()

    def session_ids(self) -> list[str]:
        """The ids of the sessions the registry holds now."""
        door = self._door
        return door.session_ids() if door is not None else []

    def shutdown(self) -> None:
        """Shut the registry down as the async doors do at the end of their block.

        Queued ``send_event_nowait`` calls and outboxes drain for up to
        ``drain_timeout_s``; then every session stops (waiting callers get
        `RegistryClosedError`; no transport's ``close`` is
        called) and every thread of the registry is joined. Idempotent.
        """
        if self._closed:
            return
        self._closed = True
        stop, door = self._stop, self._door
        if stop is not None and door is not None:
            # Through the port: after everything a thread queued before.
            door.submit(stop.set)
        self._thread.join()
        if door is not None:
            self._ended = door.system
        self._door = None
