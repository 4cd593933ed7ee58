"""An unknown session is an UnknownSessionError (a KeyError and a SessionError)
from every door and every method that raised KeyError in the seed, and from
the methods we added that name a session; the others answer False or None."""

from __future__ import annotations

import asyncio

import pytest
import trio

from actors._errors import SessionError, UnknownSessionError
from supervisor import (
    AsyncSessionRegistry,
    ThreadSessionRegistry,
    open_asyncio_registry,
    open_session_registry,
)
from supervisor.compat import DuplexSessionAttachmentRegistry
from supervisor.testing import registry_options
from tests.unknown_calls import ANSWERING, NOWHERE, RAISING, outcome

OPTIONS = registry_options()


def _check_raised(error: BaseException | None) -> None:
    assert isinstance(error, UnknownSessionError)
    assert isinstance(error, KeyError) and isinstance(error, SessionError)
    assert str(error) == "unknown duplex attachment session: nope"


async def _async_door_answers(registry: AsyncSessionRegistry) -> None:
    for call in RAISING.values():
        with pytest.raises(UnknownSessionError) as caught:
            await outcome(registry, call)
        _check_raised(caught.value)
    for call, answer in ANSWERING.values():
        assert await outcome(registry, call) == answer


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
        send=NOWHERE.send_blocking,
        close=NOWHERE.close_blocking,
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
