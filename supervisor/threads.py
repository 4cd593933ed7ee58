"""The blocking front door, for engine threads that are not an event loop.

:class:`ThreadSessionRegistry` has every method of the seed's registry, with
the same names, parameters, results and errors, but blocking (each takes an
optional ``timeout``), plus ``send_event_nowait``. Attachments' ``send`` and
``close`` are plain blocking callables: each attachment gets an outbox thread
that calls them in order, so a hung client stalls only its own outbox, never
a session thread. ``on_accepted`` and observer callbacks run on one
dispatcher thread per registry.

    with ThreadSessionRegistry(replay_ttl_s=30, replay_max_bytes_per_session=1 << 20) as reg:
        created = reg.create("s1", send=ws.send_json, close=ws.close)
        reg.send_event("s1", {"type": "delta", "text": "hi"})
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from actors.errors import RegistryClosedError
from actors.journal import JournalEntry
from actors.messages import (
    AbortResume,
    Acknowledge,
    ActivationPayloadFactory,
    AuthenticateResume,
    BeginResume,
    Close,
    Command,
    DetachedAttachment,
    EndResume,
    HasAttachment,
    IsCurrentAttachment,
    LifecycleEvent,
    ReleaseAttachment,
    Resume,
    ResumeResult,
    SendEvent,
    SendEvents,
    SessionCreated,
    SettleLeaseGeneration,
    TransportAttachment,
)
from actors.ports import (
    NO_WAITER,
    Delivery,
    delivery_frames,
    settle_delivered,
    settle_dropped,
    settle_failed,
)
from actors.state import SessionConfig, check_session_id
from supervisor.actor import DEFAULT_PASSIVATE_AFTER_S, RegistryStats, SessionSystem
from supervisor.faults import FaultPlan
from supervisor.policy import RestartPolicy

__all__ = ["BlockingClose", "BlockingSend", "ThreadSessionRegistry"]

logger = logging.getLogger("duplex_supervisor.supervisor")

BlockingSend = Callable[[dict[str, object]], object]
BlockingClose = Callable[[str], object]

_STOP = object()


class ThreadReply:
    """A reply a thread blocks on. The first answer wins."""

    __slots__ = ("_error", "_event", "_lock", "_value")

    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._value: object = None
        self._error: BaseException | None = None

    def resolve(self, value: object) -> None:
        with self._lock:
            if self._event.is_set():
                return
            self._value = value
            self._event.set()

    def fail(self, error: BaseException) -> None:
        with self._lock:
            if self._event.is_set():
                return
            self._error = error
            self._event.set()

    def wait(self, timeout: float | None) -> Any:
        if not self._event.wait(timeout):
            raise TimeoutError(f"no answer within {timeout} s")
        if self._error is not None:
            raise self._error
        return self._value


class _Worker:
    """A named daemon thread running callables from a queue, in order."""

    def __init__(self, name: str) -> None:
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def submit(self, fn: Callable[[], object]) -> None:
        self._queue.put(fn)

    def stop(self) -> None:
        self._queue.put(_STOP)

    def _run(self) -> None:
        while (fn := self._queue.get()) is not _STOP:
            try:
                fn()
            except Exception:
                logger.exception("callback raised on %s", self.thread.name)


class ThreadOutbox:
    """One attachment generation's wire: blocking sends on a thread of its own.

    ``label`` only names the thread: a resume's outbox exists before the
    session has numbered its attachment. Events take the generation from the
    delivery that failed.
    """

    def __init__(
        self,
        *,
        session_id: str,
        label: str,
        send: BlockingSend,
        close: BlockingClose,
        notify: Callable[[LifecycleEvent], None],
    ) -> None:
        self._session_id = session_id
        self._send = send
        self._close = close
        self._notify = notify
        self._retired: str | None = None
        self._worker = _Worker(f"duplex-outbox:{session_id}:{label}")
        self.thread = self._worker.thread

    def post(self, delivery: Delivery) -> None:
        self._worker.submit(lambda: self._deliver(delivery))

    def retire(self, reason: str) -> None:
        if self._retired is None:
            self._retired = reason
            self._worker.stop()

    def close_transport(self, reason: str) -> None:
        if self._retired is None:
            self._retired = reason
            self._worker.submit(lambda: self._close(reason))
            self._worker.stop()

    def _deliver(self, delivery: Delivery) -> None:
        if self._retired is not None:
            settle_dropped(delivery, self._retired)
            return
        try:
            for frame in delivery_frames(delivery.effect):
                self._send(frame)
        except BaseException as exc:  # noqa: BLE001 - any send failure is the caller's answer
            if not settle_failed(delivery, exc):
                self._give_up("send_failed", delivery.effect.attachment_generation)
            return
        on_delivered = getattr(delivery.effect, "on_delivered", None)
        if on_delivered is not None:
            on_delivered()
        settle_delivered(delivery)

    def _give_up(self, reason: str, generation: int) -> None:
        self._notify(
            LifecycleEvent(
                kind="send_failed",
                session_id=self._session_id,
                attachment_generation=generation,
                reason=reason,
            )
        )
        self.close_transport(reason)


class ThreadSessionRegistry:
    """Blocking registry; see the module docstring. Use it as a context manager."""

    def __init__(
        self,
        *,
        replay_ttl_s: float,
        replay_max_bytes_per_session: int,
        replay_max_events_per_session: int | None = None,
        clock: Callable[[], float] | None = None,
        disconnect_grace_s: float | None = None,
        restart_policy: RestartPolicy | None = None,
        passivate_after_s: float | None = DEFAULT_PASSIVATE_AFTER_S,
        faults: FaultPlan | None = None,
        observer: Callable[[LifecycleEvent], None] | None = None,
        strict: bool = True,
        timeout: float | None = 30.0,
        sweep_interval_s: float | None = 1.0,
    ) -> None:
        config = SessionConfig(
            replay_ttl_s=replay_ttl_s,
            replay_max_bytes=replay_max_bytes_per_session,
            replay_max_events=replay_max_events_per_session,
            disconnect_grace_s=disconnect_grace_s,
            strict=strict,
        )
        self._strict = strict
        self._timeout = timeout
        self._dispatcher = _Worker("duplex-dispatch")
        self._system = SessionSystem(
            config=config,
            clock=clock or time.monotonic,
            port=self._dispatcher,
            restart_policy=restart_policy,
            passivate_after_s=passivate_after_s,
            faults=faults,
            observer=observer,
        )
        self._closed = False
        self._outbox_threads: list[threading.Thread] = []
        # Journals prune by TTL, and grace expires, even for idle sessions.
        self._ticker_stop = threading.Event()
        self._ticker: threading.Thread | None = None
        if sweep_interval_s is not None:
            if not sweep_interval_s > 0:
                raise ValueError("sweep_interval_s must be positive (or None: sweep() only)")
            self._ticker = threading.Thread(
                target=self._tick, args=(sweep_interval_s,), name="duplex-ticker", daemon=True
            )
            self._ticker.start()

    def __enter__(self) -> ThreadSessionRegistry:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(sessions={len(self._system.session_ids())})"

    @property
    def system(self) -> SessionSystem:
        return self._system

    # -- plumbing ------------------------------------------------------------

    def _outbox(self, session_id: str, label: str, send: Any, close: Any) -> ThreadOutbox:
        outbox = ThreadOutbox(
            session_id=session_id,
            label=label,
            send=send,
            close=close,
            notify=self._system.notify,
        )
        self._outbox_threads = [t for t in self._outbox_threads if t.is_alive()]
        self._outbox_threads.append(outbox.thread)
        return outbox

    def _open_reply(self) -> ThreadReply:
        """A reply for one call, or RegistryClosedError once shut down."""
        if self._closed:
            raise RegistryClosedError("the session registry is shut down")
        return ThreadReply()

    def _wait(self, reply: ThreadReply, timeout: float | None) -> Any:
        return reply.wait(timeout if timeout is not None else self._timeout)

    def _ask(self, session_id: str, command: Command, timeout: float | None = None) -> Any:
        reply = self._open_reply()
        self._system.call(session_id, command, reply)
        return self._wait(reply, timeout)

    # -- the seed's methods ------------------------------------------------------

    def create(
        self,
        session_id: str,
        *,
        send: BlockingSend,
        close: BlockingClose,
        lease_generation: int = 0,
        timeout: float | None = None,
    ) -> SessionCreated:
        check_session_id(session_id, strict=self._strict)
        reply = self._open_reply()
        outbox = self._outbox(session_id, "1", send, close)
        self._system.create(
            session_id,
            send=send,  # type: ignore[arg-type]
            close=close,  # type: ignore[arg-type]
            lease_generation=lease_generation,
            outbox=outbox,
            reply=reply,
        )
        try:
            created: SessionCreated = self._wait(reply, timeout)
        except BaseException:
            outbox.retire("create_failed")
            raise
        return created

    def send_event(
        self,
        session_id: str,
        payload: Mapping[str, object],
        *,
        journal: bool = True,
        on_accepted: Callable[[], None] | None = None,
        timeout: float | None = None,
    ) -> JournalEntry | None:
        command = SendEvent(payload=payload, journal=journal, on_accepted=on_accepted)
        entry: JournalEntry | None = self._ask(session_id, command, timeout)
        return entry

    def send_event_nowait(
        self, session_id: str, payload: Mapping[str, object], *, journal: bool = True
    ) -> None:
        """Queue an event and return at once; failures go to the observer and the log."""
        self._open_reply()
        if not self._system.knows(session_id):
            raise KeyError(f"unknown duplex attachment session: {session_id}")
        self._system.call(session_id, SendEvent(payload=payload, journal=journal), NO_WAITER)

    def send_events(
        self,
        session_id: str,
        payloads: Sequence[Mapping[str, object]],
        *,
        journal: bool = True,
        timeout: float | None = None,
    ) -> tuple[JournalEntry | None, ...]:
        command = SendEvents(payloads=tuple(payloads), journal=journal)
        entries: tuple[JournalEntry | None, ...] = self._ask(session_id, command, timeout)
        return entries

    def acknowledge(self, session_id: str, sequence: int, *, timeout: float | None = None) -> int:
        removed: int = self._ask(session_id, Acknowledge(sequence=sequence), timeout)
        return removed

    def detach(
        self,
        session_id: str,
        *,
        attachment_generation: int | None = None,
        timeout: float | None = None,
    ) -> bool:
        released = self.release_attachment(
            session_id, attachment_generation=attachment_generation, timeout=timeout
        )
        return released is not None

    def release_attachment(
        self,
        session_id: str,
        *,
        attachment_generation: int | None = None,
        timeout: float | None = None,
    ) -> DetachedAttachment | None:
        command = ReleaseAttachment(attachment_generation=attachment_generation)
        released: DetachedAttachment | None = self._ask(session_id, command, timeout)
        return released

    def begin_resume(self, session_id: str, *, timeout: float | None = None) -> None:
        self._ask(session_id, BeginResume(), timeout)

    def end_resume(self, session_id: str, *, timeout: float | None = None) -> int | None:
        owed: int | None = self._ask(session_id, EndResume(), timeout)
        return owed

    def settle_lease_generation(
        self, session_id: str, lease_generation: int, *, timeout: float | None = None
    ) -> int | None:
        command = SettleLeaseGeneration(lease_generation=lease_generation)
        owed: int | None = self._ask(session_id, command, timeout)
        return owed

    def has_attachment(self, session_id: str, *, timeout: float | None = None) -> bool:
        return bool(self._ask(session_id, HasAttachment(), timeout))

    def is_current_attachment(
        self, session_id: str, attachment_generation: int, *, timeout: float | None = None
    ) -> bool:
        command = IsCurrentAttachment(attachment_generation=attachment_generation)
        return bool(self._ask(session_id, command, timeout))

    def authenticate_resume(
        self,
        session_id: str,
        *,
        resume_token: str,
        last_received_server_event_seq: int,
        timeout: float | None = None,
    ) -> None:
        command = AuthenticateResume(
            resume_token=resume_token,
            last_received_server_event_seq=last_received_server_event_seq,
        )
        self._ask(session_id, command, timeout)

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
        timeout: float | None = None,
    ) -> ResumeResult:
        reply = self._open_reply()
        command = Resume(
            resume_token=resume_token,
            last_received_server_event_seq=last_received_server_event_seq,
            send=send,  # type: ignore[arg-type]
            close=close,  # type: ignore[arg-type]
            activation_payload_factory=activation_payload_factory,
            lease_generation=lease_generation,
        )
        outbox = self._outbox(session_id, "resume", send, close)
        self._system.call(session_id, command, reply, outbox)
        try:
            result: ResumeResult = self._wait(reply, timeout)
        except BaseException:
            outbox.retire("resume_failed")
            raise
        return result

    def abandon_resume(
        self, session_id: str, *, attachment_generation: int, timeout: float | None = None
    ) -> bool:
        """Roll back a resume the client may never have seen; see the async door's."""
        command = AbortResume(attachment_generation=attachment_generation)
        return bool(self._ask(session_id, command, timeout))

    def close(self, session_id: str, *, timeout: float | None = None) -> TransportAttachment | None:
        reply = self._open_reply()
        self._system.close(session_id, Close(), reply)
        attachment: TransportAttachment | None = self._wait(reply, timeout)
        return attachment

    # -- beyond the seed -----------------------------------------------------------

    def sweep(self, *, timeout: float | None = None) -> None:
        """Tick every session now: TTL pruning and disconnect grace, at once."""
        reply = self._open_reply()
        self._system.sweep(reply)
        self._wait(reply, timeout)

    def _tick(self, interval: float) -> None:
        while not self._ticker_stop.wait(interval):
            # Fire and forget: a slow sweep must not pile up behind itself.
            self._system.sweep(NO_WAITER)

    def stats(self) -> RegistryStats:
        return self._system.stats()

    def session_ids(self) -> list[str]:
        return self._system.session_ids()

    def shutdown(self, timeout: float | None = 10.0) -> None:
        """Stop every session (waiting callers get RegistryClosedError) and join threads."""
        if self._closed:
            return
        self._closed = True
        self._ticker_stop.set()
        if self._ticker is not None:
            self._ticker.join(timeout)
        try:
            reply = ThreadReply()
            self._system.shutdown(reply)
            reply.wait(timeout)
        finally:
            self._system.join(timeout)
            for thread in self._outbox_threads:
                thread.join(timeout)
            self._dispatcher.stop()
            self._dispatcher.thread.join(timeout)
