"""The message contract between the session layer and engines in other processes.

What a gateway and an engine worker say to each other over a bus, as plain
values: pure (no I/O, no event loop), each a frozen, slotted, keyword-only
dataclass, each naming its session and the **lease generation** it was
produced under. A gateway that holds a session at lease generation *g*
refuses (and counts) an engine message produced under an older one: what a
worker says about a session that was taken over since is fenced.

Gateway to engine (the input stream of an engine pool):

- `SessionNotice` ``kind`` ``open`` (start the engine's life for the
  session), ``attach``/``detach`` (a client came or went), ``close`` (the
  session ended for good: the engine's ``stop``).
- `InputMessage`: an ``input`` to answer, once per ``client_event_id``.
- `ClientEventMessage`: a sequenced client event (``client_seq``) of a type
  the engine declared; ``data`` the bytes of a binary one.
- `CancelMessage`: a ``response.cancel`` for ``response_id``.

Engine to gateway (the output stream of the gateway that owns the session):

- `EngineEvents`: events to journal together (one ``send`` is one event,
  one ``send_many`` several), under ``message_id``, the idempotency key: a
  message delivered twice is journaled once.
- `EngineClose`: the engine closes the session (``session.close(reason)``).

`encode` gives the JSON bytes of a message (``v`` the contract's version,
``kind`` its type); `decode` reads them back or raises `MessageError` saying
what is wrong. docs/protocol.md, *Engine messages*, is the schema.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal, get_args

from actors._errors import SessionError

__all__ = [
    "MESSAGE_VERSION",
    "CancelMessage",
    "ClientEventMessage",
    "EngineClose",
    "EngineEvents",
    "EngineMessage",
    "GatewayMessage",
    "InputMessage",
    "Message",
    "MessageError",
    "NoticeKind",
    "SessionNotice",
    "decode",
    "encode",
]

#: The contract's version: every message carries it as ``v``.
MESSAGE_VERSION = 1

NoticeKind = Literal["open", "attach", "detach", "close"]
_NOTICE_KINDS: frozenset[str] = frozenset(get_args(NoticeKind))


class MessageError(SessionError, ValueError):
    """A message that is not one of the contract's (never contains its payloads)."""


def _frozen(value: Mapping[str, object]) -> Mapping[str, object]:
    return MappingProxyType(dict(value))


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionNotice:
    """A session's life, as the engine hears it: ``open``, ``attach``, ``detach``, ``close``."""

    session_id: str
    lease_generation: int
    kind: NoticeKind
    #: The client's identity (what ``authenticate`` returned), on ``open``; JSON.
    identity: object = None


@dataclass(frozen=True, slots=True, kw_only=True)
class InputMessage:
    """An ``input`` to answer (``Engine.answer``)."""

    session_id: str
    lease_generation: int
    client_event_id: str
    text: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ClientEventMessage:
    """A sequenced client event for ``on_client_event``."""

    session_id: str
    lease_generation: int
    client_seq: int
    type: str
    fields: Mapping[str, object] = field(default_factory=dict)
    data: bytes | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "fields", _frozen(self.fields))


@dataclass(frozen=True, slots=True, kw_only=True)
class CancelMessage:
    """A client's ``response.cancel``: cancel the work held under ``response_id``."""

    session_id: str
    lease_generation: int
    response_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineEvents:
    """Events an engine sends a session, journaled together, once per ``message_id``."""

    session_id: str
    lease_generation: int
    #: The idempotency key: the same work done twice yields the same key.
    message_id: str
    payloads: tuple[Mapping[str, object], ...] = field(repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "payloads", tuple(_frozen(p) for p in self.payloads))


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineClose:
    """The engine ends the session (``EngineSession.close(reason)``)."""

    session_id: str
    lease_generation: int
    message_id: str
    reason: str


GatewayMessage = SessionNotice | InputMessage | ClientEventMessage | CancelMessage
EngineMessage = EngineEvents | EngineClose
Message = GatewayMessage | EngineMessage

_KINDS: dict[type[object], str] = {
    SessionNotice: "notice",
    InputMessage: "input",
    ClientEventMessage: "client_event",
    CancelMessage: "cancel",
    EngineEvents: "engine_events",
    EngineClose: "engine_close",
}


def encode(message: Message) -> bytes:
    """The JSON bytes of ``message``; `MessageError` for payloads that are not JSON."""
    body: dict[str, object] = {
        "v": MESSAGE_VERSION,
        "kind": _KINDS[type(message)],
        "session_id": message.session_id,
        "lease_generation": message.lease_generation,
    }
    match message:
        case SessionNotice():
            body["notice"] = message.kind
            if message.identity is not None:
                body["identity"] = message.identity
        case InputMessage():
            body["client_event_id"] = message.client_event_id
            body["text"] = message.text
        case ClientEventMessage():
            body["client_seq"] = message.client_seq
            body["type"] = message.type
            body["fields"] = dict(message.fields)
            if message.data is not None:
                body["data"] = base64.b64encode(message.data).decode("ascii")
        case CancelMessage():
            body["response_id"] = message.response_id
        case EngineEvents():
            body["message_id"] = message.message_id
            body["payloads"] = [dict(p) for p in message.payloads]
        case EngineClose():
            body["message_id"] = message.message_id
            body["reason"] = message.reason
    try:
        return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    except (TypeError, ValueError) as exc:
        raise MessageError(f"{body['kind']} message is not JSON: {exc}") from None


class _Fields:
    """Typed reads of a decoded object, each failing with the field's name."""

    def __init__(self, body: Mapping[str, object], kind: str) -> None:
        self.body = body
        self.kind = kind

    def _get(self, name: str) -> object:
        if name not in self.body:
            raise MessageError(f"{self.kind} message: missing {name!r}")
        return self.body[name]

    def text(self, name: str) -> str:
        value = self._get(name)
        if not isinstance(value, str):
            raise MessageError(f"{self.kind} message: {name!r} must be a string")
        return value

    def whole(self, name: str, *, minimum: int = 0) -> int:
        value = self._get(name)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise MessageError(f"{self.kind} message: {name!r} must be an integer >= {minimum}")
        return value

    def mapping(self, name: str) -> Mapping[str, object]:
        value = self._get(name)
        if not isinstance(value, dict):
            raise MessageError(f"{self.kind} message: {name!r} must be an object")
        return value

    def mappings(self, name: str) -> tuple[Mapping[str, object], ...]:
        value = self._get(name)
        if not isinstance(value, list) or not all(isinstance(p, dict) for p in value):
            raise MessageError(f"{self.kind} message: {name!r} must be a list of objects")
        return tuple(value)


def _envelope(raw: bytes | str) -> dict[str, Any]:
    """The JSON object of a message of this version and a known kind."""
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, ValueError):
        raise MessageError("message is not JSON") from None
    if not isinstance(body, dict):
        raise MessageError("message is not a JSON object")
    version = body.get("v")
    if version != MESSAGE_VERSION:
        raise MessageError(f"message version {version!r} is not {MESSAGE_VERSION}")
    kind = body.get("kind")
    if kind not in _KINDS.values():
        raise MessageError(f"unknown message kind {kind!r}")
    return body


def _client_event_data(body: Mapping[str, object], read: _Fields) -> bytes | None:
    """A client event's binary payload (base64 on the wire), if it has one."""
    if "data" not in body:
        return None
    try:
        return base64.b64decode(read.text("data"), validate=True)
    except (binascii.Error, ValueError):
        raise MessageError("client_event message: 'data' is not base64") from None


def decode(raw: bytes | str) -> Message:
    """The message in ``raw`` (what `encode` made); `MessageError` if it is not one."""
    body = _envelope(raw)
    kind = body["kind"]
    read = _Fields(body, kind)
    session_id = read.text("session_id")
    lease_generation = read.whole("lease_generation")
    if kind == "notice":
        notice = read.text("notice")
        if notice not in _NOTICE_KINDS:
            raise MessageError(f"notice message: unknown notice {notice!r}")
        return SessionNotice(
            session_id=session_id,
            lease_generation=lease_generation,
            kind=notice,  # type: ignore[arg-type]  # checked against NoticeKind above
            identity=body.get("identity"),
        )
    if kind == "input":
        return InputMessage(
            session_id=session_id,
            lease_generation=lease_generation,
            client_event_id=read.text("client_event_id"),
            text=read.text("text"),
        )
    if kind == "client_event":
        return ClientEventMessage(
            session_id=session_id,
            lease_generation=lease_generation,
            client_seq=read.whole("client_seq", minimum=1),
            type=read.text("type"),
            fields=read.mapping("fields"),
            data=_client_event_data(body, read),
        )
    if kind == "cancel":
        return CancelMessage(
            session_id=session_id,
            lease_generation=lease_generation,
            response_id=read.text("response_id"),
        )
    if kind == "engine_events":
        return EngineEvents(
            session_id=session_id,
            lease_generation=lease_generation,
            message_id=read.text("message_id"),
            payloads=read.mappings("payloads"),
        )
    return EngineClose(
        session_id=session_id,
        lease_generation=lease_generation,
        message_id=read.text("message_id"),
        reason=read.text("reason"),
    )
