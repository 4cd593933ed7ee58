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

`InputLedger` is a session's answered ids, kept for the session's
whole life (across connections): it decides whether an input is new, a
repeat, over the in-flight cap or past the lifetime bound.

`ClientSequence` is a session's last accepted ``client_seq`` (O(1) per
session, across connections, plus the runs a store says another process
handled above it): each sequenced client event is accepted once, in order; a
repeat is dropped and counted, a jump ahead refused.
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from actors._client_seqs import ClientWatermark, Runs
from supervisor.gateway._config import GatewayConfig
from supervisor.gateway._limits import ByteRate, FailureThrottle, InputRate
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
    "Throttles",
    "TransportClosedError",
]


class TransportClosedError(Exception):
    """A shell's WebSocket is closed (by either side): no more messages either way."""


#: What `InputLedger.decide` says about an input.
InputVerdict = Literal["answer", "duplicate", "busy", "input_limit"]

#: What `ClientSequence.accept` says about a client event's ``client_seq``.
SequenceVerdict = Literal["accepted", "repeat", "ahead"]


@dataclass(frozen=True, slots=True, kw_only=True)
class SendDirect:
    """Put ``frame`` on the socket itself (no session to send through yet)."""

    frame: Mapping[str, object]


@dataclass(frozen=True, slots=True, kw_only=True)
class SendThroughSession:
    """Send ``frame`` through the session, unjournaled, in order with its events."""

    frame: Mapping[str, object]


@dataclass(frozen=True, slots=True, kw_only=True)
class CloseSocket:
    """Close the WebSocket with ``code`` and ``reason``; the connection ends."""

    code: int
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class EndConnection:
    """Stop serving this connection (it is closed normally by the shell)."""

    why: str


@dataclass(frozen=True, slots=True, kw_only=True)
class OpenRequested:
    """Admit a new session (secret, caps), create it, send ``session.created``."""

    frame: OpenSession


@dataclass(frozen=True, slots=True, kw_only=True)
class ResumeRequested:
    """Run the seed's resume flow for ``frame``."""

    frame: ResumeSession


@dataclass(frozen=True, slots=True, kw_only=True)
class CallAck:
    """``registry.acknowledge(session, server_event_seq)``."""

    server_event_seq: int


@dataclass(frozen=True, slots=True, kw_only=True)
class AnswerInput:
    """Start the engine's answer to a new input (already counted in flight)."""

    client_event_id: str
    text: str


@dataclass(frozen=True, slots=True, kw_only=True)
class DeliverEvent:
    """Sequence a client event against its session, then hand it to the engine;
    report the verdict with `ConnectionCore.event_verdict`."""

    event: ClientEvent


@dataclass(frozen=True, slots=True, kw_only=True)
class EndSession:
    """The client closed its session for good: close it, then the socket (1000)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Ping:
    """Ping the peer; report its pong with `ConnectionCore.pong`."""


Action = (
    SendDirect
    | SendThroughSession
    | CloseSocket
    | EndConnection
    | OpenRequested
    | ResumeRequested
    | CallAck
    | AnswerInput
    | DeliverEvent
    | EndSession
    | Ping
)


class Phase(enum.Enum):
    FIRST_FRAME = "first_frame"
    ADMITTING = "admitting"
    OPEN = "open"
    ENDED = "ended"


def _digest(client_event_id: str) -> bytes:
    return hashlib.blake2b(client_event_id.encode("utf-8"), digest_size=16).digest()


@dataclass(slots=True)
class InputLedger:
    """One session's inputs for its whole life: answered ids (16-byte digests),
    answers in flight. Only an input to answer is remembered."""

    max_ids: int
    max_in_flight: int
    answered: set[bytes] = field(default_factory=set)
    in_flight: int = 0

    def decide(self, client_event_id: str) -> InputVerdict:
        digest = _digest(client_event_id)
        if digest in self.answered:
            return "duplicate"
        if len(self.answered) >= self.max_ids:
            return "input_limit"
        if self.in_flight >= self.max_in_flight:
            return "busy"
        self.answered.add(digest)
        self.in_flight += 1
        return "answer"

    def done(self) -> None:
        """One answer finished (sent, or given up with its session)."""
        self.in_flight = max(0, self.in_flight - 1)


@dataclass(slots=True)
class ClientSequence:
    """A session's last accepted ``client_seq``, the repeats it dropped, and the
    runs above ``last`` handled elsewhere (by a process that held the session
    before, as its store says): repeats too, once the client resends them."""

    last: int = 0
    repeats: int = 0
    handled_above: Runs = ()

    def accept(self, client_seq: int) -> SequenceVerdict:
        if client_seq <= self.last:
            self.repeats += 1
            return "repeat"
        if client_seq != self.last + 1:
            return "ahead"
        self.last = client_seq
        runs = self.handled_above
        if runs and runs[0][0] <= client_seq:
            if client_seq >= runs[0][1]:
                self.handled_above = runs[1:]
            self.repeats += 1
            return "repeat"
        return "accepted"

    def catch_up(self, stored: ClientWatermark) -> None:
        """Take in what the store says was handled (by any process)."""
        ours = ClientWatermark(last_client_seq=self.last, handled_above=self.handled_above)
        merged = ours.merged(stored)
        self.last, self.handled_above = merged.last_client_seq, merged.handled_above


class Throttles:
    """Failed resumes (per client address and per session) and wrong secrets or
    refused identities (per client address). Only a failure is ever refused:
    callers verify the credential first and come here once it was wrong, so
    the right token or secret is never answered throttled. Each failure
    counts; the answer is the failure's own error until its key is blocked."""

    def __init__(self, config: GatewayConfig) -> None:
        keys = config.throttle_max_addresses
        self._resumes = FailureThrottle(
            config.resume_failures_allowed, config.resume_failure_window_s, keys
        )
        self._sessions = FailureThrottle(
            config.session_resume_failures_allowed, config.session_resume_failure_window_s, keys
        )
        self._secrets = FailureThrottle(
            config.secret_failures_allowed, config.secret_failure_window_s, keys
        )

    def __len__(self) -> int:
        """Keys (addresses, sessions) held now: bounded and expiring."""
        return len(self._resumes) + len(self._sessions) + len(self._secrets)

    def failed_resume(
        self, address: str, session_id: str, error: ProtocolError, now: float
    ) -> ProtocolError:
        blocked = self._resumes.blocked(address, now) or self._sessions.blocked(session_id, now)
        self._resumes.failed(address, now)
        self._sessions.failed(session_id, now)
        if blocked:
            return ProtocolError("resume_throttled", "too many failed resumes; wait and retry")
        return error

    def failed_credential(self, address: str, message: str, now: float) -> ProtocolError:
        blocked = self._secrets.blocked(address, now)
        self._secrets.failed(address, now)
        if blocked:
            return ProtocolError("secret_throttled", "too many wrong secrets from this address")
        return ProtocolError("unauthorized", message)


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
