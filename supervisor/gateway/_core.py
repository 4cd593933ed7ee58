"""The gateway's protocol for one connection, without I/O: frames and ticks in, actions out.

`ConnectionCore` is the whole protocol of `supervisor.gateway._protocol`
as one connection sees it: the first frame (and its deadline), opening or
resuming, confirming a resume, acks, inputs (rate, dedupe, in-flight and
lifetime caps), errors and their close codes, keepalive and idle rules. It is
fed client messages, timer ticks and the outcomes of the calls it asked for,
and answers with actions (send this frame, close with this code, call the
registry, call the engine); it never awaits and reads no clock of its own.

The shells (the trio server, the ASGI app) only move bytes and time in and
out; `GatewayService.converse` (`supervisor.gateway._service`) carries the
actions out against a registry, an engine and a transport. The protocol is written once, here.

Re-exported here: the actions (`supervisor.gateway._actions`); what a
session keeps across its connections, `InputLedger` and `ClientSequence`
(`supervisor.gateway._ledgers`); the failed resumes and credentials
counted, `Throttles` (`supervisor.gateway._throttles`).
"""

from __future__ import annotations

import enum

from supervisor.gateway._actions import (
    Action,
    AnswerInput,
    CallAck,
    CloseSocket,
    DeliverEvent,
    EndConnection,
    EndSession,
    OpenRequested,
    Ping,
    ResumeRequested,
    SendDirect,
    SendThroughSession,
)
from supervisor.gateway._config import GatewayConfig
from supervisor.gateway._ledgers import ClientSequence, InputLedger, InputVerdict, SequenceVerdict
from supervisor.gateway._limits import ByteRate, InputRate
from supervisor.gateway._protocol import (
    BUILTIN_EVENT_TYPES,
    CLOSE_CODES,
    FATAL,
    Ack,
    ClientEvent,
    ClientFrame,
    CloseSession,
    Input,
    OpenSession,
    ProtocolError,
    ResumeSession,
    error_frame,
    parse_client_frame,
)
from supervisor.gateway._throttles import Throttles

__all__ = [
    "Action",
    "AnswerInput",
    "CallAck",
    "ClientSequence",
    "CloseSocket",
    "ConnectionCore",
    "DeliverEvent",
    "EndConnection",
    "EndSession",
    "InputLedger",
    "InputVerdict",
    "OpenRequested",
    "Ping",
    "ResumeRequested",
    "SendDirect",
    "SendThroughSession",
    "SequenceVerdict",
    "Throttles",
    "TransportClosedError",
]


class TransportClosedError(Exception):
    """A shell's WebSocket is closed (by either side): no more messages either way."""


class Phase(enum.Enum):
    FIRST_FRAME = "first_frame"
    ADMITTING = "admitting"
    OPEN = "open"
    ENDED = "ended"


class ConnectionCore:
    """One connection's protocol state. ``keepalive``: whether this shell pings
    (an ASGI server pings by itself, so its shell does not)."""

    def __init__(
        self,
        config: GatewayConfig,
        now: float,
        *,
        keepalive: bool = True,
        event_types: frozenset[str] = frozenset(),
    ) -> None:
        self._config = config
        self._keepalive = keepalive
        #: Client event types taken besides ``input`` and the built-in ones.
        self._event_types = event_types | BUILTIN_EVENT_TYPES
        self.phase = Phase.FIRST_FRAME
        self._deadline = now + config.handshake_timeout_s
        self._rate = InputRate(config.max_inputs_per_second)
        self._event_rate = InputRate(config.max_client_events_per_second)
        self._byte_rate = ByteRate(config.max_client_bytes_per_second)
        #: The session's last accepted ``client_seq`` (as this connection knows
        #: it), what ``client_ack`` last said, and when an ack falls due.
        self.last_client_seq = 0
        self._acked_client_seq = 0
        self._ack_due: float | None = None
        self._ping_at = now + config.ping_interval_s
        self._ping_sent: float | None = None
        #: Set when a resume attached this connection; cleared by the client's
        #: next frame (the confirmation that ``session.resumed`` arrived).
        self.unconfirmed_resume = False
        self.session_id: str | None = None
        self.attachment_generation: int | None = None
        #: Error codes this connection sent, in order (for counters and tests).
        self.errors: list[str] = []

    # -- what the shell feeds in ----------------------------------------------------

    def next_deadline(self) -> float | None:
        """When `tick` has something to do next (``None``: nothing timed)."""
        if self.phase is Phase.FIRST_FRAME:
            return self._deadline
        if self.phase is not Phase.OPEN:
            return None
        keepalive: float | None = None
        if self._keepalive:
            keepalive = (
                self._ping_at
                if self._ping_sent is None
                else self._ping_sent + self._config.idle_timeout_s
            )
        if self._ack_due is None:
            return keepalive
        return self._ack_due if keepalive is None else min(keepalive, self._ack_due)

    def tick(self, now: float) -> list[Action]:
        if self.phase is Phase.FIRST_FRAME and now >= self._deadline:
            return self._fatal(ProtocolError("handshake_timeout", "no first frame in time"))
        if self.phase is not Phase.OPEN:
            return []
        if self._ack_due is not None and now >= self._ack_due:
            return self._client_ack()
        if not self._keepalive:
            return []
        if self._ping_sent is not None:
            if now >= self._ping_sent + self._config.idle_timeout_s:
                self.phase = Phase.ENDED
                return [EndConnection(why="idle")]
            return []
        if now >= self._ping_at:
            self._ping_sent = now
            return [Ping()]
        return []

    def pong(self, now: float) -> None:
        self._ping_sent = None
        self._ping_at = now + self._config.ping_interval_s

    def receive(self, message: str | bytes, now: float) -> list[Action]:
        """A client message (a whole text or binary WebSocket message)."""
        if self.phase is Phase.ENDED:
            return []
        if self.phase is Phase.FIRST_FRAME:
            return self._first(message)
        if self.phase is Phase.ADMITTING:
            # The shell reads no more until the admission is settled.
            return []
        self.unconfirmed_resume = False
        try:
            frame = self._parse(message)
            if isinstance(frame, Ack):
                return [CallAck(server_event_seq=frame.server_event_seq)]
            if isinstance(frame, Input):
                if not self._rate.allow(now):
                    raise ProtocolError(
                        "rate_limited",
                        f"more than {self._config.max_inputs_per_second:g} inputs a second",
                        client_event_id=frame.client_event_id,
                    )
                return [AnswerInput(client_event_id=frame.client_event_id, text=frame.text)]
            if isinstance(frame, ClientEvent):
                return self._client_event(frame, now)
            if isinstance(frame, CloseSession):
                self.phase = Phase.ENDED
                return [EndSession()]
            raise ProtocolError("bad_request", "the session is already open")
        except ProtocolError as error:
            return self.fail(error)

    def _client_event(self, event: ClientEvent, now: float) -> list[Action]:
        seq = event.client_seq
        if event.type != "input" and event.type not in self._event_types:
            raise ProtocolError(
                "bad_request", f"unknown client event type {event.type!r}", client_seq=seq
            )
        if not self._event_rate.allow(now):
            raise ProtocolError(
                "rate_limited",
                f"more than {self._config.max_client_events_per_second:g} client events a second",
                client_seq=seq,
            )
        if not self._byte_rate.allow(event.size, now):
            raise ProtocolError(
                "rate_limited",
                f"more than {self._config.max_client_bytes_per_second:g} bytes a second",
                client_seq=seq,
            )
        if event.type == "input" and not self._rate.allow(now):
            raise ProtocolError(
                "rate_limited",
                f"more than {self._config.max_inputs_per_second:g} inputs a second",
                client_seq=seq,
                client_event_id=event.fields.get("client_event_id"),
            )
        return [DeliverEvent(event=event)]

    def event_verdict(
        self, event: ClientEvent, verdict: SequenceVerdict, last_client_seq: int, now: float
    ) -> list[Action]:
        """What the session's `ClientSequence` said about ``event``; ``last_client_seq``:
        the session's last accepted sequence after it."""
        self.last_client_seq = last_client_seq
        if verdict == "ahead":
            return self.fail(
                ProtocolError(
                    "bad_request",
                    f"client_seq {event.client_seq} skips ahead of {last_client_seq + 1}",
                    client_seq=event.client_seq,
                    last_client_seq=last_client_seq,
                )
            )
        if self._ack_due is None:
            self._ack_due = now + self._config.client_ack_interval_s
        if last_client_seq - self._acked_client_seq >= self._config.client_ack_every:
            return self._client_ack()
        return []

    def _client_ack(self) -> list[Action]:
        self._ack_due = None
        if self.last_client_seq == self._acked_client_seq:
            return []
        self._acked_client_seq = self.last_client_seq
        return [
            SendThroughSession(frame={"type": "client_ack", "client_seq": self.last_client_seq})
        ]

    def admitted(
        self,
        session_id: str,
        generation: int,
        *,
        resumed: bool,
        now: float,
        last_client_seq: int = 0,
    ) -> None:
        """The open or resume asked for succeeded; the session is attached here
        (``session.created`` / ``session.resumed`` said ``last_client_seq``)."""
        self.phase = Phase.OPEN
        self.last_client_seq = self._acked_client_seq = last_client_seq
        self.session_id = session_id
        self.attachment_generation = generation
        # A resume stays unconfirmed until the client speaks on this
        # connection: session.resumed may have died with the link, leaving
        # the client only the token it presented.
        self.unconfirmed_resume = resumed
        self._ping_at = now + self._config.ping_interval_s

    def input_verdict(self, client_event_id: str, verdict: InputVerdict) -> list[Action]:
        """What the session's `InputLedger` said about an input to answer."""
        if verdict == "answer":
            return []
        if verdict == "duplicate":
            return [
                SendThroughSession(
                    frame={"type": "input.duplicate", "client_event_id": client_event_id}
                )
            ]
        if verdict == "busy":
            message = f"{self._config.max_inputs_in_flight} answers are still on their way"
        else:
            message = "the session answered its maximum of inputs"
        return self.fail(ProtocolError(verdict, message, client_event_id=client_event_id))

    def fail(self, error: ProtocolError) -> list[Action]:
        """Answer ``error``: fatal ones (and any before a session) close the socket."""
        if self.phase is Phase.ENDED:
            return []
        if self.phase is Phase.OPEN and error.code not in FATAL:
            self.errors.append(error.code)
            return [SendThroughSession(frame=error_frame(error))]
        return self._fatal(error)

    def session_gone(self) -> list[Action]:
        return self._fatal(ProtocolError("session_failed", "the session is gone"))

    def ended(self) -> None:
        """The connection is over, whatever ended it."""
        self.phase = Phase.ENDED

    # -- inside ---------------------------------------------------------------------

    def _first(self, message: str | bytes) -> list[Action]:
        try:
            frame = self._parse(message)
        except ProtocolError as error:
            return self._fatal(error)
        if isinstance(frame, OpenSession):
            self.phase = Phase.ADMITTING
            return [OpenRequested(frame=frame)]
        if isinstance(frame, ResumeSession):
            self.phase = Phase.ADMITTING
            return [ResumeRequested(frame=frame)]
        return self._fatal(
            ProtocolError("bad_request", "first frame must be session.open or resume")
        )

    def _fatal(self, error: ProtocolError) -> list[Action]:
        self.phase = Phase.ENDED
        self.errors.append(error.code)
        code = CLOSE_CODES[error.code] if error.code in FATAL else CLOSE_CODES["bad_request"]
        return [SendDirect(frame=error_frame(error)), CloseSocket(code=code, reason=error.code)]

    def _parse(self, message: str | bytes) -> ClientFrame:
        limit = self._config.max_frame_bytes
        # A text frame's bytes are its UTF-8, up to 4 per character.
        if len(message) > limit or (
            isinstance(message, str)
            and len(message) * 4 > limit
            and len(message.encode("utf-8", "surrogatepass")) > limit
        ):
            raise ProtocolError("bad_request", f"frame over {limit} bytes")
        return parse_client_frame(message)
