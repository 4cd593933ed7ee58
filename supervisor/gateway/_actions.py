"""The actions `ConnectionCore` (`supervisor.gateway._core`) answers with: what
`GatewayService` (`supervisor.gateway._service`) carries out for one
connection (send this frame, close with this code, call the registry, call
the engine)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from supervisor.gateway._protocol import ClientEvent, OpenSession, ResumeSession

__all__ = [
    "Action",
    "AnswerInput",
    "CallAck",
    "CloseSocket",
    "DeliverEvent",
    "EndConnection",
    "EndSession",
    "OpenRequested",
    "Ping",
    "ResumeRequested",
    "SendDirect",
    "SendThroughSession",
]


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
