"""A client for the gateway that resumes by itself (anyio: trio or asyncio).

::

    async with open_session("ws://127.0.0.1:8765/ws") as session:
        await session.input("hello")
        async for event in session.events():
            ...

What it does for you (docs/clients.md says it whole):

* **Exactly once from the server**: each event with ``server_event_seq``
  reaches `ClientSession.events` once, in order, across any number of
  reconnects (a replayed duplicate is dropped and counted).
* **Exactly once to the server**: every client event (`ClientSession.send`,
  `ClientSession.input`) carries ``client_seq`` and is kept until the
  server's ``client_ack`` covers it; after a resume the client resends what
  the server's ``last_client_seq`` does not cover, and the server drops
  repeats.
* **Reconnects**: exponential backoff with jitter (`ReconnectPolicy`) up to
  a give-up deadline, resuming with the last rotated token and the last
  sequence received. Acks every ``ack_every`` events or ``ack_interval_s``;
  a heartbeat ping when the link is quiet, and a connection that stays
  silent past ``heartbeat_timeout_s`` is dropped and resumed.
* **Fatal answers end it**: the close codes in `FATAL_CLOSE_CODES` end
  `ClientSession.events` with `FatalCloseError` naming the code; no retry.

(`ClientSession` is one state machine over state every part shares, the
sequences both ways, what is pending, the connection, so it stays whole
here; its settings, counters and errors are in ``_client_policy``, the
wire in ``_client_wire``.)
"""

from __future__ import annotations

import contextlib
import json
import logging
import random
import ssl as _ssl
import uuid
from collections import deque
from collections.abc import AsyncIterator, Mapping

import anyio
import anyio.abc
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from supervisor._client_policy import (
    ACKED_WINDOW,
    FATAL_CLOSE_CODES,
    FATAL_ERRORS,
    ClientError,
    FatalCloseError,
    Options,
    Pending,
    ReconnectGaveUpError,
    ReconnectPolicy,
    Statistics,
)
from supervisor._client_wire import Connection, ConnectionEnded
from supervisor.gateway._protocol import binary_event

__all__ = [
    "FATAL_CLOSE_CODES",
    "ClientError",
    "ClientSession",
    "FatalCloseError",
    "ReconnectGaveUpError",
    "ReconnectPolicy",
    "open_session",
]

logger = logging.getLogger("duplex_supervisor.client")


class ClientSession:
    """One session, kept alive across connections. Made by `open_session`."""

    def __init__(self, options: Options) -> None:
        self._options = options
        self._session_id = ""
        self._token = ""
        #: The last ``server_event_seq`` delivered, and the last one acked.
        self._last_seq = 0
        self._acked_seq = 0
        self._ack_due: float | None = None
        self._next_client_seq = 1
        #: Client events the server has not acked, in ``client_seq`` order, and the
        #: last one written on the current connection.
        self._pending: deque[Pending] = deque()
        #: The last acked ones too: with a session store, a ``client_ack`` says
        #: accepted, and a process that dies before handling an accepted event
        #: leaves a lower ``last_client_seq`` to the next one. The last
        #: `ACKED_WINDOW` of them, and every one from the oldest input not yet
        #: answered on (the store's ``last_client_seq`` stays below it until
        #: its answer ends): `_trim_acked`.
        self._acked: deque[Pending] = deque()
        self._written_upto = 0
        self._unanswered: dict[str, str] = {}
        self._answered_signal = anyio.Event()
        self._connection: Connection | None = None
        self._flush_lock = anyio.Lock()
        self._stats = Statistics()
        self._closing = False
        self._failure: ClientError | None = None
        self._events_in: MemoryObjectSendStream[dict[str, object]]
        self._events_out: MemoryObjectReceiveStream[dict[str, object]]
        self._events_in, self._events_out = anyio.create_memory_object_stream[dict[str, object]](
            options.buffer
        )

    @property
    def session_id(self) -> str:
        """The session's id (``sess_...``), the same across reconnects."""
        return self._session_id

    @property
    def last_server_event_seq(self) -> int:
        """The last ``server_event_seq`` received (what a resume asks to follow)."""
        return self._last_seq

    def statistics(self) -> dict[str, int]:
        """Counters: ``events``, ``resumes``, ``replayed`` (events the server said it
        replayed), ``duplicates_dropped``, ``reconnect_attempts``, ``disconnects``,
        ``client_events_sent``, ``client_events_acked``, ``client_events_resent``,
        ``inputs_sent``, ``inputs_answered``, ``errors`` (non-fatal error frames)."""
        stats = self._stats
        return {name: getattr(stats, name) for name in stats.__dataclass_fields__}

    def events(self) -> AsyncIterator[dict[str, object]]:
        """The session's events, each once and in order; ends when the session
        closes, or raises `FatalCloseError` / `ReconnectGaveUpError`. (An
        iterator, not a generator: leaving an ``async for`` early leaves
        nothing to finalize.)"""
        return _Events(self)

    async def input(self, text: str, *, client_event_id: str | None = None) -> str:
        """Send an input; return its id (made up when not given). The engine answers
        it once; its answer ends with a ``response.done`` naming the id. Waits while
        ``max_inputs_in_flight`` inputs are unanswered."""
        input_id = client_event_id or f"in_{uuid.uuid4().hex}"
        while len(self._unanswered) >= self._options.max_inputs_in_flight:
            self._raise_if_over()
            self._answered_signal = anyio.Event()
            await self._answered_signal.wait()
        self._unanswered[input_id] = text
        self._stats.inputs_sent += 1
        await self._queue({"type": "input", "client_event_id": input_id, "text": text}, input_id)
        return input_id

    async def send(
        self, event: Mapping[str, object] | bytes, *, type: str | None = None, **fields: object
    ) -> int:
        """Send a client event: a mapping with ``type``, or ``bytes`` (a binary event,
        raw on the wire) with ``type=`` and any header ``fields``. Returns its
        ``client_seq``; it reaches the engine once, in order, across reconnects."""
        if isinstance(event, bytes | bytearray | memoryview):
            if not type:
                raise ValueError("a binary event needs type=")
            return await self._queue({"type": type, **fields}, None, bytes(event))
        if not isinstance(event.get("type"), str):
            raise ValueError("a client event is a mapping with a string 'type'")
        return await self._queue(dict(event), None)

    async def cut(self) -> None:
        """Drop the current connection without a close frame, as a network would
        (the client then resumes by itself)."""
        if self._connection is not None:
            await self._connection.abort()

    async def close(self) -> None:
        """End the session for good (``session.close``): the server closes it and
        `events` ends once the close arrives."""
        self._closing = True
        if self._connection is not None:
            with contextlib.suppress(ConnectionEnded):
                await self._connection.send_json({"type": "session.close"})

    # -- sending -----------------------------------------------------------------------

    def _raise_if_over(self) -> None:
        if self._failure is not None:
            raise self._failure
        if self._closing:
            raise ClientError("the session is closing")

    async def _queue(
        self, frame: dict[str, object], input_id: str | None, data: bytes | None = None
    ) -> int:
        self._raise_if_over()
        seq = self._next_client_seq
        self._next_client_seq += 1
        frame["client_seq"] = seq
        message: str | bytes
        if data is None:
            message = json.dumps(frame, separators=(",", ":"))
        else:
            message = binary_event(frame, data)
        self._pending.append(Pending(client_seq=seq, message=message, input_id=input_id))
        await self._flush()
        return seq

    async def _flush(self) -> None:
        """Write every pending event past the last written, in ``client_seq`` order."""
        async with self._flush_lock:
            connection = self._connection
            for pending in list(self._pending):
                if connection is None or connection is not self._connection:
                    return
                if pending.client_seq <= self._written_upto:
                    continue
                try:
                    if isinstance(pending.message, bytes):
                        await connection.send_bytes(pending.message)
                    else:
                        await connection.send_text(pending.message)
                except ConnectionEnded:
                    return  # the reader sees the drop; the resume resends
                self._written_upto = pending.client_seq
                self._stats.client_events_sent += 1

    # -- receiving ---------------------------------------------------------------------

    async def _on_frame(self, frame: dict[str, object]) -> None:
        seq = frame.get("server_event_seq")
        kind = frame.get("type")
        if isinstance(seq, int):
            if seq <= self._last_seq:
                self._stats.duplicates_dropped += 1
                return
            if seq != self._last_seq + 1:
                raise ClientError(f"server_event_seq jumped from {self._last_seq} to {seq}")
            self._last_seq = seq
            self._stats.events += 1
            if kind == "response.done":
                self._answered(frame.get("client_event_id"))
            if self._ack_due is None:
                self._ack_due = anyio.current_time() + self._options.ack_interval_s
            await self._events_in.send(frame)
            if self._last_seq - self._acked_seq >= self._options.ack_every:
                await self._ack()
        elif kind == "client_ack":
            acked = frame.get("client_seq")
            if isinstance(acked, int):
                self._drop_pending_through(acked)
        elif kind == "error":
            await self._on_error(frame)
        elif kind == "session.closed":
            self._closing = True

    def _answered(self, input_id: object) -> None:
        if isinstance(input_id, str) and self._unanswered.pop(input_id, None) is not None:
            self._stats.inputs_answered += 1
            self._answered_signal.set()
            self._trim_acked()

    def _drop_pending_through(self, client_seq: int) -> None:
        while self._pending and self._pending[0].client_seq <= client_seq:
            self._acked.append(self._pending.popleft())
            self._stats.client_events_acked += 1
        self._trim_acked()

    def _trim_acked(self) -> None:
        """Forget acked events past the window, up to the oldest unanswered input."""
        acked = self._acked
        while len(acked) > ACKED_WINDOW and acked[0].input_id not in self._unanswered:
            acked.popleft()

    async def _on_error(self, frame: dict[str, object]) -> None:
        code = str(frame.get("code"))
        message = str(frame.get("message", ""))
        if code in FATAL_ERRORS:
            raise FatalCloseError(FATAL_ERRORS[code], code, message)
        self._stats.errors += 1
        input_id = frame.get("client_event_id")
        if code == "input_limit" and isinstance(input_id, str):
            # The session answered all the inputs it ever will: this one is not coming.
            self._unanswered.pop(input_id, None)
            self._answered_signal.set()
        if code == "busy" and isinstance(input_id, str) and input_id in self._unanswered:
            # Sequenced, then refused: the same input again, under a new client_seq.
            await self._queue(
                {"type": "input", "client_event_id": input_id, "text": self._unanswered[input_id]},
                input_id,
            )
            return
        client_seq = frame.get("client_seq")
        if code == "bad_request" and isinstance(client_seq, int) and "last_client_seq" not in frame:
            raise FatalCloseError(4400, code, f"client event {client_seq} refused: {message}")
        if isinstance(client_seq, int):
            # Refused before sequencing (rate) or ahead of a refused one: a resume
            # says where the server is, and the client resends from there.
            logger.info("client event %s refused (%s): resuming to resend", client_seq, code)
            raise ConnectionEnded(None, f"resync after {code}")
        logger.warning("the gateway answered an error: %s %s", code, message)

    async def _ack(self) -> None:
        self._ack_due = None
        if self._connection is None or self._last_seq == self._acked_seq:
            return
        seq = self._last_seq
        with contextlib.suppress(ConnectionEnded):
            await self._connection.send_json({"type": "ack", "server_event_seq": seq})
            self._acked_seq = seq

    # -- the connection's life ----------------------------------------------------------

    async def _handshake(self, connection: Connection) -> None:
        """Open or resume on ``connection``; on success it becomes the current one."""
        if not self._session_id:
            await connection.send_json({"type": "session.open", "secret": self._options.secret})
        else:
            await connection.send_json(
                {
                    "type": "session.resume",
                    "session_id": self._session_id,
                    "resume_token": self._token,
                    "last_received_server_event_seq": self._last_seq,
                }
            )
        with anyio.fail_after(self._options.connect_timeout_s):
            frame = await connection.receive()
        if not isinstance(frame, dict) or frame.get("type") not in (
            "session.created",
            "session.resumed",
        ):
            if isinstance(frame, dict) and frame.get("type") == "error":
                await self._on_error(frame)
            raise ConnectionEnded(None, f"unexpected first frame {frame!r:.80}")
        self._session_id = str(frame["session_id"])
        self._token = str(frame["resume_token"])
        last_client_seq = frame.get("last_client_seq", 0)
        last_client_seq = last_client_seq if isinstance(last_client_seq, int) else 0
        self._drop_pending_through(last_client_seq)
        while self._acked and self._acked[-1].client_seq > last_client_seq:
            self._pending.appendleft(self._acked.pop())  # acked, then lost with its process
        first = self._pending[0].client_seq if self._pending else self._next_client_seq
        if first > last_client_seq + 1:
            raise ClientError(
                f"the server has client events through {last_client_seq}; this client "
                f"keeps them from {first} on (acked and forgotten before)"
            )
        resend = len(self._pending) if frame["type"] == "session.resumed" else 0
        if frame["type"] == "session.resumed":
            self._stats.resumes += 1
            replayed = frame.get("replayed")
            self._stats.replayed += max(0, replayed) if isinstance(replayed, int) else 0
            self._acked_seq = min(self._acked_seq, self._last_seq)
        self._written_upto = last_client_seq
        self._connection = connection
        # Speaking first confirms the resume (the server then retires the old token).
        await connection.send_json({"type": "ack", "server_event_seq": self._last_seq})
        self._acked_seq = self._last_seq
        await self._flush()
        self._stats.client_events_resent += resend
        if self._closing:  # a close asked for while the link was down
            await connection.send_json({"type": "session.close"})

    async def _serve(self, connection: Connection) -> None:
        """Read ``connection`` until it ends; acks and heartbeats on the way."""
        options = self._options
        pinged = False
        while True:
            now = anyio.current_time()
            wake = connection.heard_from + (
                options.heartbeat_timeout_s if pinged else options.heartbeat_interval_s
            )
            if self._ack_due is not None:
                wake = min(wake, self._ack_due)
            frame: dict[str, object] | bytes | None = None
            with anyio.move_on_after(max(0.0, wake - now)):
                frame = await connection.receive()
            if isinstance(frame, dict):
                pinged = False
                await self._on_frame(frame)
                continue
            now = anyio.current_time()
            if self._ack_due is not None and now >= self._ack_due:
                await self._ack()
            if now - connection.heard_from >= options.heartbeat_interval_s and not pinged:
                pinged = True
                await connection.ping()
            elif pinged and now - connection.heard_from >= (
                options.heartbeat_interval_s + options.heartbeat_timeout_s
            ):
                raise ConnectionEnded(None, "heartbeat timed out")
            elif now - connection.heard_from < options.heartbeat_interval_s:
                pinged = False

    async def _connect(self) -> Connection:
        options = self._options
        return await Connection.open(
            options.url,
            ssl=options.ssl,
            timeout_s=options.connect_timeout_s,
            write_timeout_s=options.heartbeat_timeout_s,
        )

    async def _reconnect(self) -> None:
        """Resume on a new connection, backing off between attempts."""
        policy = self._options.policy
        lost_at = anyio.current_time()
        attempt = 0
        while True:
            delay = policy.delay(attempt, self._options.rng)
            if anyio.current_time() + delay - lost_at > policy.give_up_after_s:
                raise ReconnectGaveUpError(
                    f"no resume within {policy.give_up_after_s:g} s ({attempt} attempts)"
                )
            await anyio.sleep(delay)
            attempt += 1
            self._stats.reconnect_attempts += 1
            try:
                await self._start()
                return
            except (ConnectionEnded, OSError, TimeoutError, *_DROPS) as exc:
                code = exc.code if isinstance(exc, ConnectionEnded) else None
                if code in FATAL_CLOSE_CODES:
                    raise FatalCloseError(code, FATAL_CLOSE_CODES[code]) from None
                logger.debug("resume attempt %d failed: %s", attempt, exc)

    async def _maintain(self) -> None:
        """Serve connection after connection until the session ends or fails."""
        try:
            while True:
                connection = self._connection
                if connection is None:
                    raise ClientError("no connection to serve")  # unreachable: _start set one
                try:
                    await self._serve(connection)
                except (ConnectionEnded, *_DROPS) as exc:
                    code = exc.code if isinstance(exc, ConnectionEnded) else None
                    if code in FATAL_CLOSE_CODES:
                        raise FatalCloseError(code, FATAL_CLOSE_CODES[code]) from None
                    if code == 1000 or (self._closing and code is not None):
                        return  # closed for good (session_closed)
                finally:
                    self._connection = None
                    await connection.abort()
                self._stats.disconnects += 1
                await self._reconnect()
        except ClientError as exc:
            self._failure = exc
        finally:
            self._events_in.close()
            self._answered_signal.set()

    async def _start(self) -> None:
        connection = await self._connect()
        try:
            await self._handshake(connection)
        except BaseException:
            await connection.abort()
            raise

    async def _shutdown(self) -> None:
        connection = self._connection
        self._connection = None
        if connection is not None:
            await connection.close()


class _Events:
    """`ClientSession.events`: the buffered events, then the failure if any."""

    def __init__(self, session: ClientSession) -> None:
        self._session = session

    def __aiter__(self) -> _Events:
        return self

    async def __anext__(self) -> dict[str, object]:
        try:
            return await self._session._events_out.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            if self._session._failure is not None:
                raise self._session._failure from None
            raise StopAsyncIteration from None


_DROPS = (anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream)


# Over ~60 lines: its options are named keywords (the public API), documented here.
@contextlib.asynccontextmanager
async def open_session(
    url: str,
    *,
    secret: str | None = None,
    ssl: _ssl.SSLContext | None = None,
    reconnect: ReconnectPolicy | None = None,
    ack_every: int = 10,
    ack_interval_s: float = 0.2,
    heartbeat_interval_s: float = 15.0,
    heartbeat_timeout_s: float = 10.0,
    connect_timeout_s: float = 10.0,
    max_inputs_in_flight: int = 8,
    buffer: int = 1024,
    close_on_exit: bool = True,
    seed: int | None = None,
) -> AsyncIterator[ClientSession]:
    """Open a session at ``url`` (``ws://`` or ``wss://host:port/path``) and keep it
    alive until the block ends.

    ``secret``: the gateway's shared secret, sent in ``session.open`` (never in
    the URL). ``ssl``: the context for ``wss://`` (default: the system's CAs).
    ``reconnect``: the backoff and give-up deadline. Acks go out every
    ``ack_every`` events or ``ack_interval_s`` after an unacked one. A quiet
    link is pinged after ``heartbeat_interval_s`` and dropped (then resumed)
    if nothing arrives within ``heartbeat_timeout_s``. ``close_on_exit``: end
    the session for good on the way out (else it stays resumable until its
    TTL). ``seed``: the jitter's random seed (tests). The first connection's
    failure (refused, fatal close) raises here; later ones are resumed.
    """
    if ack_every < 1 or max_inputs_in_flight < 1 or buffer < 1:
        raise ValueError("ack_every, max_inputs_in_flight and buffer must be >= 1")
    options = Options(
        url=url,
        secret=secret,
        ssl=ssl,
        policy=reconnect or ReconnectPolicy(),
        ack_every=ack_every,
        ack_interval_s=ack_interval_s,
        heartbeat_interval_s=heartbeat_interval_s,
        heartbeat_timeout_s=heartbeat_timeout_s,
        connect_timeout_s=connect_timeout_s,
        max_inputs_in_flight=max_inputs_in_flight,
        buffer=buffer,
        rng=random.Random(seed),  # noqa: S311 - jitter, not secrets
    )
    session = ClientSession(options)
    try:
        await session._start()
    except BaseException as exc:
        session._events_in.close()
        session._events_out.close()
        if isinstance(exc, ConnectionEnded) and exc.code in FATAL_CLOSE_CODES:
            raise FatalCloseError(exc.code, FATAL_CLOSE_CODES[exc.code]) from None
        raise
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(session._maintain)
        try:
            yield session
            if close_on_exit and session._failure is None:
                await session.close()
                with anyio.move_on_after(connect_timeout_s):
                    async for _ in session._events_out:
                        pass
        finally:
            tasks.cancel_scope.cancel()
            with anyio.CancelScope(shield=True):
                await session._shutdown()
            session._events_out.close()
