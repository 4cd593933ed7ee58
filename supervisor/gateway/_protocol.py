"""The gateway's wire protocol: frames parsed and built without I/O.

docs/protocol.md is the whole protocol (every frame, field, error and close
code, the resume and ack rules); a test checks its tables against the
constants here. In short: the client sends JSON text frames (``session.open``
or ``session.resume`` first, then ``ack``, ``input``, ``session.close`` and
*client events*: any other ``type``, sequenced by ``client_seq``), and binary
messages, each one client event whose bytes travel raw (`parse_binary_event`).
The server sends ``session.created`` / ``session.resumed`` (with
``last_client_seq``), events with ``server_event_seq``, ``client_ack``,
``input.duplicate`` and ``error``; a fatal error is followed by a close with
the code's own close code.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "CLOSE_CODES",
    "FATAL",
    "NON_FATAL",
    "Ack",
    "ClientEvent",
    "ClientFrame",
    "CloseSession",
    "Input",
    "OpenSession",
    "ProtocolError",
    "ResumeSession",
    "binary_event",
    "error_frame",
    "frame_text",
    "parse_binary_event",
    "parse_client_frame",
]

#: Frame types the gateway itself understands (client -> server); every other
#: ``type`` is a client event for the engine.
CONTROL_TYPES = frozenset({"session.open", "session.resume", "ack", "input", "session.close"})

#: Client events the gateway always takes (it cancels the task the event names).
BUILTIN_EVENT_TYPES = frozenset({"response.cancel"})

#: Frame types the server sends that the gateway itself makes (the engine's
#: events come besides, each with ``server_event_seq``).
SERVER_FRAME_TYPES = frozenset(
    {
        "session.created",
        "session.resumed",
        "client_ack",
        "input.duplicate",
        "error",
        "session.closed",
    }
)

#: A binary client event: this many bytes give the JSON header's length (big endian).
BINARY_HEADER_LENGTH = struct.Struct(">H")

# Built once: json.dumps builds an encoder per call for non-default options,
# a third of its cost on a small frame. Same options, same text.
_FRAME_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)


def frame_text(frame: Mapping[str, object]) -> str:
    """A server frame as the text of its WebSocket message: compact JSON, not
    ASCII-escaped (what ``json.dumps(frame, separators=(",", ":"),
    ensure_ascii=False)`` gives)."""
    return _FRAME_ENCODER.encode(frame)


ErrorCode = Literal[
    "bad_request",
    "unauthorized",
    "invalid_resume_token",
    "unknown_session",
    "journal_gap",
    "resume_throttled",
    "overflow",
    "session_failed",
    "overloaded",
    "store_unavailable",
    "handshake_timeout",
    "secret_throttled",
    "too_many_sessions",
    "rate_limited",
    "busy",
    "input_limit",
]

#: One close code per error code (4000-4999 are the application's to use).
CLOSE_CODES: dict[str, int] = {
    "bad_request": 4400,
    "unauthorized": 4401,
    "invalid_resume_token": 4403,
    "unknown_session": 4404,
    "handshake_timeout": 4408,
    "journal_gap": 4410,
    "overflow": 4413,
    "resume_throttled": 4429,
    "secret_throttled": 4429,
    "too_many_sessions": 4429,
    "session_failed": 4500,
    "overloaded": 4503,
    "store_unavailable": 4503,
}

#: A socket a resume took over is closed with this code and reason "replaced".
REPLACED_CLOSE_CODE = 4000

#: Errors that leave the connection open (``bad_request`` is fatal as a first frame).
NON_FATAL = frozenset({"bad_request", "rate_limited", "busy", "input_limit"})

#: Errors after which the connection is closed with the code's close code.
FATAL = frozenset(CLOSE_CODES) - NON_FATAL


class ProtocolError(Exception):
    """A frame the gateway answers with ``error {code, message}``."""

    def __init__(self, code: ErrorCode, message: str, **fields: object) -> None:
        super().__init__(message)
        self.code: ErrorCode = code
        self.message = message
        self.fields = fields


@dataclass(frozen=True, slots=True, kw_only=True)
class OpenSession:
    secret: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ResumeSession:
    session_id: str
    resume_token: str
    last_received_server_event_seq: int
    #: A credential for the ``authenticate`` hook (see `GatewayConfig.authenticate_on_first_frame`).
    secret: str | None = None

    def __repr__(self) -> str:  # the token stays out of every repr
        return (
            f"ResumeSession(session_id={self.session_id!r}, "
            f"last_received_server_event_seq={self.last_received_server_event_seq})"
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Ack:
    server_event_seq: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Input:
    client_event_id: str
    text: str


@dataclass(frozen=True, slots=True, kw_only=True)
class CloseSession:
    pass


@dataclass(frozen=True, slots=True, kw_only=True)
class ClientEvent:
    """A sequenced client event for the engine (``input`` with a ``client_seq`` too).

    ``fields``: the frame's other fields (without ``type`` and ``client_seq``);
    ``data``: a binary event's payload (``None`` for a JSON one); ``size``: the
    bytes of the WebSocket message that carried it (what the byte rate counts).
    """

    type: str
    client_seq: int
    fields: Mapping[str, object]
    data: bytes | None = None
    size: int = 0


ClientFrame = OpenSession | ResumeSession | Ack | Input | CloseSession | ClientEvent


def _field(data: dict[str, Any], name: str, kind: type, what: str) -> Any:
    value = data.get(name)
    if kind is int and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise ProtocolError("bad_request", f"{what}.{name} must be a non-negative integer")
    if kind is str and (not isinstance(value, str) or not value or not _encodable(value)):
        raise ProtocolError("bad_request", f"{what}.{name} must be a non-empty string")
    return value


def _encodable(text: str) -> bool:
    """No lone surrogate (JSON lets ``"\\ud800"`` through; UTF-8 has no such text)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _client_seq(data: dict[str, Any], kind: str) -> int:
    seq = _field(data, "client_seq", int, kind)
    if seq < 1:
        raise ProtocolError("bad_request", f"{kind}.client_seq must be 1 or more")
    return int(seq)


def _event(data: dict[str, Any], size: int, payload: bytes | None) -> ClientEvent:
    kind = data["type"]
    seq = _client_seq(data, kind)
    fields = {k: v for k, v in data.items() if k not in ("type", "client_seq", "binary")}
    return ClientEvent(type=kind, client_seq=seq, fields=fields, data=payload, size=size)


def parse_binary_event(message: bytes) -> ClientEvent:
    """A binary message: a 2-byte big-endian length, that many bytes of a UTF-8
    JSON header object (``type``, ``client_seq``, any other fields), then the
    event's bytes, raw."""
    if len(message) < BINARY_HEADER_LENGTH.size:
        raise ProtocolError("bad_request", "binary message shorter than its header length")
    (length,) = BINARY_HEADER_LENGTH.unpack_from(message)
    end = BINARY_HEADER_LENGTH.size + length
    if len(message) < end:
        raise ProtocolError("bad_request", "binary message shorter than its header")
    try:
        header = json.loads(message[BINARY_HEADER_LENGTH.size : end].decode("utf-8"))
    except (ValueError, RecursionError):
        raise ProtocolError("bad_request", "binary header is not UTF-8 JSON") from None
    if not isinstance(header, dict):
        raise ProtocolError("bad_request", "binary header is not a JSON object")
    kind = header.get("type")
    if not isinstance(kind, str) or not kind or kind in CONTROL_TYPES:
        raise ProtocolError("bad_request", "a binary message carries a client event's type")
    return _event(header, len(message), message[end:])


def binary_event(header: Mapping[str, object], data: bytes) -> bytes:
    """A binary client event as `parse_binary_event` reads it (what a client sends)."""
    encoded = json.dumps(header, separators=(",", ":")).encode("utf-8")
    return BINARY_HEADER_LENGTH.pack(len(encoded)) + encoded + data


def parse_client_frame(message: str | bytes, *, max_text: int = 16_384) -> ClientFrame:
    """One client frame, or `ProtocolError` (``bad_request``) saying why."""
    if isinstance(message, bytes):
        return parse_binary_event(message)
    try:
        data = json.loads(message)
    except (ValueError, RecursionError):
        raise ProtocolError("bad_request", "frame is not JSON") from None
    if not isinstance(data, dict):
        raise ProtocolError("bad_request", "frame is not a JSON object")
    kind = data.get("type")
    if kind in ("session.open", "session.resume"):
        secret = data.get("secret")
        if secret is not None and not (isinstance(secret, str) and _encodable(secret)):
            raise ProtocolError("bad_request", f"{kind}.secret must be a string")
    if kind == "session.open":
        return OpenSession(secret=secret)
    if kind == "session.resume":
        return ResumeSession(
            secret=secret,
            session_id=_field(data, "session_id", str, kind),
            resume_token=_field(data, "resume_token", str, kind),
            last_received_server_event_seq=_field(
                data, "last_received_server_event_seq", int, kind
            ),
        )
    if kind == "ack":
        return Ack(server_event_seq=_field(data, "server_event_seq", int, kind))
    if kind == "input":
        text = _field(data, "text", str, kind)
        if len(text) > max_text:
            raise ProtocolError("bad_request", f"input.text is longer than {max_text}")
        client_event_id = _field(data, "client_event_id", str, kind)
        if "client_seq" in data:
            # Sequenced as a client event, and answered once per id as ever.
            return _event(data, len(message), None)
        return Input(client_event_id=client_event_id, text=text)
    if kind == "session.close":
        return CloseSession()
    if isinstance(kind, str) and kind and _encodable(kind):
        return _event(data, len(message), None)
    raise ProtocolError("bad_request", "a frame needs a string type")


def error_frame(error: ProtocolError) -> dict[str, object]:
    return {"type": "error", "code": error.code, "message": error.message, **error.fields}
