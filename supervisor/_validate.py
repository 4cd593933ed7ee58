"""The doors' argument checks, run before anything is queued.

A door refuses a bad argument in the caller's own frame, with the documented
error, before a message reaches an actor: a bad value there would crash the
session (or, for a session id that cannot be a dict key, the supervisor),
and on the thread door a refused call never answered would block its caller.

Strict doors (trio, asyncio, threads) check everything below. The seed
drop-in (``strict=False``) refuses only what the seed itself refused: a
session id that cannot be a key (the seed's dict raised ``TypeError``).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping

from actors import _transition as transition
from actors._errors import InvalidInputError, InvalidPayloadError, InvalidSessionIdError

__all__ = [
    "check_generation",
    "check_session_id",
    "check_transport",
    "check_unjournaled",
]


def check_session_id(session_id: object, *, strict: bool) -> None:
    """A non-empty ``str`` (strict), or at least a hashable value (the seed's rule).

    Raises:
        InvalidSessionIdError: (a ``TypeError`` and ``ValueError``) otherwise.
    """
    if strict:
        transition.check_session_id(session_id, strict=True)  # the machine's own rule
        return
    try:
        hash(session_id)
    except TypeError:
        raise InvalidSessionIdError("session id must be hashable") from None


def check_generation(value: object, *, what: str, optional: bool, strict: bool) -> None:
    """An ``int`` (not a ``bool``) ``>= 0``; ``None`` too where ``optional``.

    Raises:
        InvalidInputError: otherwise (strict doors only).
    """
    if not strict or (value is None and optional):
        return
    transition.check_generation(value, what=what, optional=optional)  # an int, not a bool
    assert isinstance(value, int)  # noqa: S101 - just checked
    if value < 0:
        raise InvalidInputError(f"{what} must be >= 0")


def _is_async_callable(fn: object) -> bool:
    # iscoroutinefunction sees through functools.partial; an instance with
    # an ``async def __call__`` is async too.
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 - the method, not callable()
    )


def check_transport(send: object, close: object, *, asynchronous: bool, strict: bool) -> None:
    """``send`` and ``close`` callables; ``async def`` ones where ``asynchronous``.

    An async door awaits what they return, so a plain function would fail at
    its first frame, far from the call that handed it over.

    Raises:
        InvalidInputError: otherwise (strict doors only).
    """
    if not strict:
        return
    for name, fn in (("send", send), ("close", close)):
        if not callable(fn):
            raise InvalidInputError(f"{name} must be callable, got {type(fn).__name__}")
        if asynchronous and not _is_async_callable(fn):
            raise InvalidInputError(f"{name} must be an async function on this door")


def check_unjournaled(payload: object, *, journal: bool, strict: bool) -> None:
    """Refuse an unjournaled payload that carries its own ``server_event_seq``.

    Refused rather than stripped: the key is the client's acknowledgement
    handle, and a frame carrying one it never got from the journal would be
    acknowledged (or ordered) as if it were a journaled event. Dropping it
    silently would hide the caller's mistake instead.

    Raises:
        InvalidPayloadError: (strict doors only).
    """
    if strict and not journal and isinstance(payload, Mapping) and "server_event_seq" in payload:
        raise InvalidPayloadError(
            "an unjournaled payload must not carry server_event_seq (the journal numbers events)"
        )
