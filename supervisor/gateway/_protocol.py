"""The gateway's wire protocol: JSON text frames, parsed and built without I/O.

Client -> server, one JSON object per text frame, ``type`` first:

==================  ===========================================================
``session.open``    ``{secret?}``: start a session (the first frame)
``session.resume``  ``{session_id, resume_token, last_received_server_event_seq}``
                    (the first frame)
``ack``             ``{server_event_seq}``: the client has these; drop them
``input``           ``{client_event_id, text}``: answered exactly once per id
``session.close``   end the session for good
==================  ===========================================================

Server -> client: ``session.created {session_id, resume_token,
attachment_generation}`` or ``session.resumed {session_id, resume_token,
attachment_generation, replayed}``, then events each carrying
``server_event_seq``, ``input.duplicate {client_event_id}`` for a retried
input, and ``error {code, message}``; a fatal error is followed by a close
with the code's own close code. The errors in `NON_FATAL` leave the
connection open; a refused input's error carries its ``client_event_id``, and
the input was not answered (it may be sent again).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "CLOSE_CODES",
    "FATAL",
    "NON_FATAL",
    "Ack",
    "ClientFrame",
    "CloseSession",
    "Input",
    "OpenSession",
    "ProtocolError",
    "ResumeSession",
    "error_frame",
    "frame_text",
    "parse_client_frame",
]

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


ClientFrame = OpenSession | ResumeSession | Ack | Input | CloseSession


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


def parse_client_frame(message: str | bytes, *, max_text: int = 16_384) -> ClientFrame:
    """One client frame, or `ProtocolError` (``bad_request``) saying why."""
    if isinstance(message, bytes):
        raise ProtocolError("bad_request", "binary frames are not part of the protocol")
    try:
        data = json.loads(message)
    except (ValueError, RecursionError):
        raise ProtocolError("bad_request", "frame is not JSON") from None
    if not isinstance(data, dict):
        raise ProtocolError("bad_request", "frame is not a JSON object")
    kind = data.get("type")
    if kind == "session.open":
        secret = data.get("secret")
        if secret is not None and not (isinstance(secret, str) and _encodable(secret)):
            raise ProtocolError("bad_request", "session.open.secret must be a string")
        return OpenSession(secret=secret)
    if kind == "session.resume":
        return ResumeSession(
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
        return Input(client_event_id=_field(data, "client_event_id", str, kind), text=text)
    if kind == "session.close":
        return CloseSession()
    raise ProtocolError("bad_request", "unknown frame type")


def error_frame(error: ProtocolError) -> dict[str, object]:
    return {"type": "error", "code": error.code, "message": error.message, **error.fields}
