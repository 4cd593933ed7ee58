"""How `supervisor.stores._redis.RedisStore` writes a session into Redis and
reads it back: a `SessionRecord` as the record hash's fields, the events
stream's entries as `StoredEvent`, and what a write script's reply says."""

from __future__ import annotations

import json
from typing import Any, cast

from actors._errors import GapReason, SessionReplacedError, TokenConflictError
from actors._store import SessionRecord, StoredEvent

__all__ = [
    "commit_refusal",
    "record_fields",
    "script_events",
    "session_record",
    "stream_events",
    "written",
]


def written(reply: object) -> bool:
    """A script's reply that says it wrote: a commit's or a create's 1, a
    fence's or an acquire's fields."""
    return reply == 1 or isinstance(reply, list)


def commit_refusal(outcome: object, session_id: str) -> BaseException | None:
    """What the commit script's answer says: ``None`` (applied) or the refusal."""
    if outcome == 1:
        return None
    if outcome == -4:
        return TokenConflictError("the resume token was rotated by another resume")
    return SessionReplacedError(session_id)


def record_fields(record: SessionRecord) -> list[str | bytes]:
    last = record.last_resume
    values: dict[str, str | bytes] = {
        "td": record.token_digest.hex(),
        "rd": "" if record.recovery_token_digest is None else record.recovery_token_digest.hex(),
        "ag": str(record.attachment_generation),
        "lg": str(record.lease_generation),
        "ol": ""
        if record.orphaned_lease_generation is None
        else str(record.orphaned_lease_generation),
        "lr": "" if last is None else f"{last[0]}:{last[1].hex()}",
        "da": "" if record.detached_at is None else repr(record.detached_at),
        "ns": str(record.next_sequence),
        "dt": str(record.dropped_through),
        "dr": json.dumps(record.drop_runs),
        "of": "1" if record.overflowed else "0",
    }
    flat: list[str | bytes] = []
    for key, value in values.items():
        flat += [key, value]
    return flat


def session_record(raw: dict[bytes, bytes]) -> SessionRecord:
    text = {key.decode(): value.decode() for key, value in raw.items()}
    last = text["lr"]
    generation, _, digest = last.partition(":")
    runs = cast(list[list[Any]], json.loads(text["dr"]))
    return SessionRecord(
        token_digest=bytes.fromhex(text["td"]),
        recovery_token_digest=bytes.fromhex(text["rd"]) if text["rd"] else None,
        attachment_generation=int(text["ag"]),
        lease_generation=int(text["lg"]),
        orphaned_lease_generation=int(text["ol"]) if text["ol"] else None,
        last_resume=(int(generation), bytes.fromhex(digest)) if last else None,
        detached_at=float(text["da"]) if text["da"] else None,
        next_sequence=int(text["ns"]),
        dropped_through=int(text["dt"]),
        drop_runs=tuple((int(through), cast(GapReason, reason)) for through, reason in runs),
        overflowed=text["of"] == "1",
    )


def stream_events(raw: list[tuple[bytes, dict[bytes, bytes]]]) -> tuple[StoredEvent, ...]:
    return tuple(
        StoredEvent(
            sequence=int(stream_id.split(b"-")[1]),
            created_at=float(fields[b"t"]),
            encoded_bytes=int(fields[b"b"]),
            encoded=fields[b"e"],
        )
        for stream_id, fields in raw
    )


def script_events(raw: list[list[Any]]) -> tuple[StoredEvent, ...]:
    """A script's XRANGE reply: ``[id, [b"e", encoded, b"t", at, b"b", size]]`` each,
    the fields in the order the commit script's XADD wrote them."""
    return tuple(
        StoredEvent(
            sequence=int(stream_id[2:]),
            created_at=float(fields[3]),
            encoded_bytes=int(fields[5]),
            encoded=fields[1],
        )
        for stream_id, fields in raw
    )
