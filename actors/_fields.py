"""The fields a session keeps beside its journal and transport, in one record.

Pure data: no I/O, no threads, no event loop.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field, fields
from typing import Any

__all__ = ["FIELD_NAMES", "SessionFields", "field_values"]


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionFields:
    """What a session keeps beside its journal and its transport: the one list.

    A live `SessionState` holds one (replaced whole when a field changes, so
    a snapshot is a reference), a `ParkedSession` and a stored
    `actors._store.SessionRecord` are one, and every copy between them goes
    through `field_values`: a field added here is parked, unparked,
    snapshotted, restored and stored without another line (the Redis store
    names its hash field for it in `supervisor.redis_store`).
    """

    #: The SHA-256 of the current resume token (the session keeps no plaintext).
    token_digest: bytes = field(repr=False)
    #: ``None`` unless a failed activation handed the presented token back;
    #: honoured only while detached, once.
    recovery_token_digest: bytes | None = field(repr=False)
    #: >= 1, only grows; names the current (or last) attachment.
    attachment_generation: int
    #: The lease the attached connection serves; only grows.
    lease_generation: int
    #: ``None``, or a lease nobody serves yet, parked for the next activation.
    orphaned_lease_generation: int | None
    #: The latest resume's generation (<= ``attachment_generation``) and the
    #: digest it accepted, for an abort from a caller that gave up on it.
    last_resume: tuple[int, bytes] | None = field(repr=False)
    #: When it was detached (``None``: attached, or closed), in its holder's
    #: clock: the session clock's in a live or parked session, the wall
    #: clock's in a record.
    detached_at: float | None


#: `SessionFields`' names, in order; `field_values` reads them in one C call.
FIELD_NAMES: tuple[str, ...] = tuple(f.name for f in fields(SessionFields))
_read_fields = operator.attrgetter(*FIELD_NAMES)


def field_values(holder: SessionFields) -> dict[str, Any]:
    """``holder``'s `SessionFields` (it may be a subclass), as keyword arguments."""
    return dict(zip(FIELD_NAMES, _read_fields(holder), strict=True))
