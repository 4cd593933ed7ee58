"""A JSON codec for commands, effects, results and events (kept with the tests).

No library code uses it yet: it moves back into the library with the step
that carries commands between processes.

``to_dict(message)`` gives a dict of JSON values with a ``"type"`` key (the
class name in snake case); ``from_dict(data, **bindings)`` builds the message
back. Fields marked local in `actors._commands` (callables of this
process) are not encoded; pass them as ``bindings`` when decoding. A resume
token travels as its plaintext, and only inside the dict returned: this
module logs nothing and its errors never quote a value.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from actors import _commands as messages
from actors._credential import ResumeToken
from actors._errors import InvalidInputError
from actors._journal import JournalEntry

__all__ = ["CodecError", "from_dict", "message_types", "to_dict"]


class CodecError(InvalidInputError):
    """A dict that does not describe a known message."""


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


_TYPES: dict[str, type[Any]] = {
    _snake(cls.__name__): cls
    for cls in (
        messages.TransportAttachment,
        messages.SessionCreated,
        messages.DetachedAttachment,
        messages.ResumeResult,
        messages.TickResult,
        messages.SendEvent,
        messages.SendEvents,
        messages.Acknowledge,
        messages.ReleaseAttachment,
        messages.BeginResume,
        messages.EndResume,
        messages.SettleLeaseGeneration,
        messages.HasAttachment,
        messages.IsCurrentAttachment,
        messages.AuthenticateResume,
        messages.Resume,
        messages.ActivationOutcome,
        messages.AbortResume,
        messages.Tick,
        messages.Close,
        messages.LifecycleEvent,
        messages.EventAccepted,
        messages.Deliver,
        messages.Activate,
        messages.RetireAttachment,
        messages.Notify,
    )
}
_NAMES = {cls: name for name, cls in _TYPES.items()}
_PLAINTEXT_TOKENS = (messages.AuthenticateResume, messages.Resume)


def message_types() -> tuple[str, ...]:
    """The ``"type"`` names the codec knows."""
    return tuple(_TYPES)


def _encode(value: object) -> object:
    if isinstance(value, ResumeToken):
        return value.plaintext
    if isinstance(value, JournalEntry):
        return {
            "type": "journal_entry",
            "sequence": value.sequence,
            "created_monotonic": value.created_monotonic,
            "encoded_bytes": value.encoded_bytes,
            "payload": _encode(value.payload),
        }
    if type(value) in _NAMES:
        return to_dict(value)
    if isinstance(value, Mapping):
        return {str(k): _encode(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_encode(v) for v in value]
    return value


def to_dict(message: object) -> dict[str, object]:
    """Encode ``message``; local fields (callables) are left out."""
    name = _NAMES.get(type(message))
    if name is None:
        raise CodecError(f"not an encodable message: {type(message).__name__}")
    out: dict[str, object] = {"type": name}
    for f in dataclasses.fields(message):  # type: ignore[arg-type]
        if f.metadata.get("local"):
            continue
        out[f.name] = _encode(getattr(message, f.name))
    return out


def _decode_value(name: str, value: object) -> object:
    if isinstance(value, dict) and "type" in value:
        if value["type"] == "journal_entry":
            return JournalEntry(
                sequence=value["sequence"],
                created_monotonic=value["created_monotonic"],
                encoded_bytes=value["encoded_bytes"],
                payload=MappingProxyType(dict(value["payload"])),
            )
        if value["type"] in _TYPES:
            return from_dict(value)
    if isinstance(value, list):
        return tuple(_decode_value(name, v) for v in value)
    return value


def from_dict(data: Mapping[str, object], **bindings: object) -> Any:
    """Decode what `to_dict` made; ``bindings`` supply the local fields.

    A binding also stands in for a field whose encoded message has local
    fields of its own, which a nested decode could not supply: a
    `ResumeResult`'s ``replaced_attachment``.
    """
    if not isinstance(data, Mapping):
        raise CodecError("a message must be a JSON object")
    kind = data.get("type")
    cls = _TYPES.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise CodecError("unknown message type")
    kwargs: dict[str, object] = {}
    for f in dataclasses.fields(cls):
        if f.name in bindings:
            # A local field, or one holding a message with local fields of its
            # own (ResumeResult.replaced_attachment): only the caller has it.
            kwargs[f.name] = bindings[f.name]
            continue
        if f.metadata.get("local"):
            continue
        if f.name not in data:
            continue
        value = data[f.name]
        if f.metadata.get("secret"):
            # Commands carry the client's plaintext; results carry a token.
            value = str(value) if cls in _PLAINTEXT_TOKENS else ResumeToken(str(value))
        elif f.name in ("frames", "payloads") and isinstance(value, list):
            value = tuple(value)
        elif f.name != "payload":
            value = _decode_value(f.name, value)
        kwargs[f.name] = value
    unknown = set(bindings) - {f.name for f in dataclasses.fields(cls)}
    if unknown:
        raise CodecError(f"bindings name no field of {cls.__name__}: {sorted(unknown)}")
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise CodecError(f"{cls.__name__} is missing a field or binding: {exc}") from None
