"""Every registry method called on a session the registry does not know ("nope").

Shared by the per-door tests: ``RAISING`` are the methods that answer
``UnknownSessionError`` (the seed's ``KeyError``), ``ANSWERING`` the ones
that answer as the seed did, with that answer. Each entry takes a registry
of an async door and returns what the call returns (a coroutine, or for
``send_event_nowait`` nothing); `outcome` awaits it if need be.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from supervisor.testing import Wire

Call = Callable[[Any], Any]

#: The transport an unknown session's resume is handed: it must get nothing.
NOWHERE = Wire()

RAISING: dict[str, Call] = {
    "send_event": lambda r: r.send_event("nope", {"n": 1}),
    "send_event_nowait": lambda r: r.send_event_nowait("nope", {"n": 1}),
    "send_events": lambda r: r.send_events("nope", [{"n": 1}]),
    "acknowledge": lambda r: r.acknowledge("nope", 0),
    "begin_resume": lambda r: r.begin_resume("nope"),
    "authenticate_resume": lambda r: r.authenticate_resume(
        "nope", resume_token="t", last_received_server_event_seq=0
    ),
    "resume": lambda r: r.resume(
        "nope",
        resume_token="t",
        last_received_server_event_seq=0,
        send=NOWHERE.send,
        close=NOWHERE.close,
    ),
    "abandon_resume": lambda r: r.abandon_resume("nope", attachment_generation=1),
}

ANSWERING: dict[str, tuple[Call, object]] = {
    "detach": (lambda r: r.detach("nope"), False),
    "detach_generation": (lambda r: r.detach("nope", attachment_generation=1), False),
    "release_attachment": (lambda r: r.release_attachment("nope"), None),
    "end_resume": (lambda r: r.end_resume("nope"), None),
    "settle_lease_generation": (lambda r: r.settle_lease_generation("nope", 3), None),
    "has_attachment": (lambda r: r.has_attachment("nope"), False),
    "is_current_attachment": (lambda r: r.is_current_attachment("nope", 1), False),
    "close": (lambda r: r.close("nope"), None),
}


async def outcome(registry: object, call: Call) -> object:
    """What ``call(registry)`` answers, awaited if it is awaitable."""
    result = call(registry)
    return await result if isinstance(result, Awaitable) else result
