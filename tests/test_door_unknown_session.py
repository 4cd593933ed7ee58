"""An unknown session is an UnknownSessionError (a KeyError and a SessionError)
from every door and every method that raised KeyError in the seed, and from
the methods we added that name a session; the others answer False or None."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import trio

from actors.errors import SessionError, UnknownSessionError
from supervisor import (
    AsyncSessionRegistry,
    ThreadSessionRegistry,
    open_asyncio_registry,
    open_session_registry,
)
from supervisor.compat import DuplexSessionAttachmentRegistry
from supervisor.testing import FakeClock, Wire

OPTIONS: dict[str, Any] = {
    "replay_ttl_s": 60.0,
    "replay_max_bytes_per_session": 1 << 20,
    "clock": FakeClock(),
    "sweep_interval_s": None,
}
WIRE = Wire()

#: Every method that raises for an unknown session, called on "nope".
RAISING: dict[str, Callable[[Any], Any]] = {
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
        send=WIRE.send,
        close=WIRE.close,
    ),
    "abandon_resume": lambda r: r.abandon_resume("nope", attachment_generation=1),
}

#: Every other method, with the seed's answer for an unknown session.
ANSWERING: dict[str, tuple[Callable[[Any], Any], object]] = {
    "detach": (lambda r: r.detach("nope"), False),
    "release_attachment": (lambda r: r.release_attachment("nope"), None),
    "end_resume": (lambda r: r.end_resume("nope"), None),
    "settle_lease_generation": (lambda r: r.settle_lease_generation("nope", 3), None),
    "has_attachment": (lambda r: r.has_attachment("nope"), False),
    "is_current_attachment": (lambda r: r.is_current_attachment("nope", 1), False),
    "close": (lambda r: r.close("nope"), None),
}


async def _outcome(registry: AsyncSessionRegistry, call: Callable[[Any], Any]) -> object:
    result = call(registry)
    return await result if isinstance(result, Awaitable) else result


def _check_raised(error: BaseException | None) -> None:
    assert isinstance(error, UnknownSessionError)
    assert isinstance(error, KeyError) and isinstance(error, SessionError)
    assert str(error) == "unknown duplex attachment session: nope"


async def _async_door_answers(registry: AsyncSessionRegistry) -> None:
    for call in RAISING.values():
        with pytest.raises(UnknownSessionError) as caught:
            await _outcome(registry, call)
        _check_raised(caught.value)
    for call, answer in ANSWERING.values():
        assert await _outcome(registry, call) == answer


async def test_trio_door() -> None:
    with trio.fail_after(30):
        async with open_session_registry(**OPTIONS) as registry:
            await _async_door_answers(registry)


def test_asyncio_door() -> None:
    async def scenario() -> None:
        async with open_asyncio_registry(**OPTIONS) as registry:
            await _async_door_answers(registry)

    asyncio.run(asyncio.wait_for(scenario(), 30))


def test_the_drop_in() -> None:
    async def scenario() -> None:
        registry = DuplexSessionAttachmentRegistry(
            replay_ttl_s=60, replay_max_bytes_per_session=1 << 20
        )
        try:
            await _async_door_answers(registry)
        finally:
            await registry.aclose()

    asyncio.run(asyncio.wait_for(scenario(), 30))


def _blocking_resume(registry: ThreadSessionRegistry) -> object:
    return registry.resume(
        "nope",
        resume_token="t",
        last_received_server_event_seq=0,
        send=WIRE.send_blocking,
        close=WIRE.close_blocking,
    )


def test_thread_door() -> None:
    calls = {**RAISING, "resume": _blocking_resume}
    with ThreadSessionRegistry(timeout=30, **OPTIONS) as registry:
        for call in calls.values():
            with pytest.raises(UnknownSessionError) as caught:
                call(registry)
            _check_raised(caught.value)
        for call, answer in ANSWERING.values():
            assert call(registry) == answer
