"""Shutdown, door by door: what is drained, what is closed, what is reported.

The same contract on every door (docs/shutdown.md): queued
``send_event_nowait`` calls and outboxes drain for up to ``drain_timeout_s``;
what does not drain is logged; then every session stops and no transport's
``close`` is called (nor by ``close(session_id)``); later calls raise
``RegistryClosedError``.
"""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest
import trio

from actors._errors import RegistryClosedError
from supervisor import ThreadSessionRegistry, open_asyncio_registry, open_session_registry
from supervisor.compat import DuplexSessionAttachmentRegistry
from supervisor.testing import Wire, registry_options

LIMIT = 30.0
BURST = 20


def _undrained_logged(caplog: pytest.LogCaptureFixture) -> bool:
    return any("not drained" in record.getMessage() for record in caplog.records)


def _session_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("duplex-session:")]


def _burst() -> list[dict[str, object]]:
    return [{"n": n, "server_event_seq": n} for n in range(1, BURST + 1)]


# -- trio --------------------------------------------------------------------------------


async def test_trio_door_drains_nowait_events_queued_just_before_exit() -> None:
    wire = Wire()
    with trio.fail_after(LIMIT):
        async with open_session_registry(**registry_options()) as registry:
            await registry.create("s1", send=wire.send, close=wire.close)
            for n in range(1, BURST + 1):
                registry.send_event_nowait("s1", {"n": n})
    assert wire.frames == _burst()
    assert wire.closes == []
    with pytest.raises(RegistryClosedError):
        await registry.send_event("s1", {"n": 0})


async def test_trio_door_gives_up_on_a_hung_send_after_the_drain_timeout(
    caplog: pytest.LogCaptureFixture,
) -> None:
    wire = Wire()
    gate = wire.hold(1)
    with trio.fail_after(LIMIT):
        async with open_session_registry(**registry_options(drain_timeout_s=0.05)) as registry:
            await registry.create("s1", send=wire.send, close=wire.close)
            registry.send_event_nowait("s1", {"n": 1})
            await gate.entered.wait()
    assert gate.cancelled  # the hung send was cancelled with the registry's tasks
    assert wire.closes == []  # the transport belongs to its owner
    assert _undrained_logged(caplog)
    assert _session_threads() == []


async def test_trio_door_close_returns_the_attachment_and_closes_no_transport() -> None:
    wire = Wire()
    with trio.fail_after(LIMIT):
        async with open_session_registry(**registry_options()) as registry:
            await registry.create("s1", send=wire.send, close=wire.close)
            attachment = await registry.close("s1")
            assert attachment is not None
            assert attachment.send == wire.send
            assert attachment.generation == 1
    assert wire.closes == []


# -- asyncio -------------------------------------------------------------------------------


def test_asyncio_door_drains_and_closes_no_transport() -> None:
    wire = Wire()

    async def scenario() -> None:
        async with open_asyncio_registry(**registry_options()) as registry:
            await registry.create("s1", send=wire.send, close=wire.close)
            await registry.create("s2", send=wire.send, close=wire.close)
            assert await registry.close("s2") is not None
            for n in range(1, BURST + 1):
                registry.send_event_nowait("s1", {"n": n})
        with pytest.raises(RegistryClosedError):
            await registry.send_event("s1", {"n": 0})

    asyncio.run(asyncio.wait_for(scenario(), LIMIT))
    assert wire.frames == _burst()
    assert wire.closes == []


def test_asyncio_door_gives_up_on_a_hung_send_after_the_drain_timeout(
    caplog: pytest.LogCaptureFixture,
) -> None:
    wire = Wire()
    gate = wire.hold(1)

    async def scenario() -> None:
        async with open_asyncio_registry(**registry_options(drain_timeout_s=0.05)) as registry:
            await registry.create("s1", send=wire.send, close=wire.close)
            registry.send_event_nowait("s1", {"n": 1})
            await gate.entered.wait()

    asyncio.run(asyncio.wait_for(scenario(), LIMIT))
    assert gate.cancelled
    assert wire.closes == []
    assert _undrained_logged(caplog)
    assert _session_threads() == []


def test_the_drop_in_drains_on_aclose_and_closes_no_transport() -> None:
    wire = Wire()

    async def scenario() -> None:
        registry = DuplexSessionAttachmentRegistry(
            replay_ttl_s=60, replay_max_bytes_per_session=1 << 20
        )
        await registry.create("s1", send=wire.send, close=wire.close)
        for n in range(1, BURST + 1):
            registry.send_event_nowait("s1", {"n": n})
        await registry.aclose()

    asyncio.run(asyncio.wait_for(scenario(), LIMIT))
    assert wire.frames == _burst()
    assert wire.closes == []


# -- threads ---------------------------------------------------------------------------------


def test_thread_door_drains_nowait_events_queued_just_before_exit() -> None:
    # The README's example dropped such a frame in about one run of four.
    for _ in range(20):
        wire = Wire()
        with ThreadSessionRegistry(timeout=LIMIT, **registry_options()) as registry:
            registry.create("s1", send=wire.send_blocking, close=wire.close_blocking)
            for n in range(1, BURST + 1):
                registry.send_event_nowait("s1", {"n": n})
        assert wire.frames == _burst()
        assert wire.closes == []
    with pytest.raises(RegistryClosedError):
        registry.send_event("s1", {"n": 0})
    with pytest.raises(RegistryClosedError):
        registry.send_event_nowait("s1", {"n": 0})


def test_thread_door_gives_up_on_a_hung_send_after_the_drain_timeout(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="duplex_supervisor")
    wire = Wire()
    gate = wire.hold(1)
    try:
        with ThreadSessionRegistry(
            timeout=LIMIT, **registry_options(drain_timeout_s=0.05)
        ) as registry:
            registry.create("s1", send=wire.send_blocking, close=wire.close_blocking)
            registry.send_event_nowait("s1", {"n": 1})
            assert gate.entered.wait_blocking(LIMIT)
        assert wire.closes == []
        assert _undrained_logged(caplog)
        assert _session_threads() == []
    finally:
        gate.release()  # the abandoned worker thread ends


def test_thread_door_close_returns_the_callables_as_given() -> None:
    wire = Wire()
    with ThreadSessionRegistry(timeout=LIMIT, **registry_options()) as registry:
        registry.create("s1", send=wire.send_blocking, close=wire.close_blocking)
        attachment = registry.close("s1")
        assert attachment is not None
        # Typed as the async doors' callables; the thread door keeps its own.
        assert (attachment.send, attachment.close) == (  # type: ignore[comparison-overlap]
            wire.send_blocking,
            wire.close_blocking,
        )
    assert wire.closes == []


# -- every door: the figures stay readable -----------------------------------------------


async def test_stats_and_session_ids_answer_after_the_trio_door_ended() -> None:
    wire = Wire()
    with trio.fail_after(LIMIT):
        async with open_session_registry(**registry_options()) as registry:
            await registry.create("s1", send=wire.send, close=wire.close)
            await registry.send_event("s1", {"n": 1})
    assert registry.stats().events_journaled == 1
    assert registry.session_ids() == []


def test_stats_and_session_ids_answer_after_the_asyncio_door_ended() -> None:
    wire = Wire()

    async def scenario() -> None:
        async with open_asyncio_registry(**registry_options()) as registry:
            await registry.create("s1", send=wire.send, close=wire.close)
            await registry.send_event("s1", {"n": 1})
        assert registry.stats().events_journaled == 1
        assert registry.session_ids() == []

    asyncio.run(asyncio.wait_for(scenario(), LIMIT))


def test_stats_and_session_ids_answer_after_the_thread_door_ended() -> None:
    wire = Wire()
    with ThreadSessionRegistry(timeout=LIMIT, **registry_options()) as registry:
        registry.create("s1", send=wire.send_blocking, close=wire.close_blocking)
        registry.send_event("s1", {"n": 1})
    assert registry.stats().events_journaled == 1
    assert registry.session_ids() == []
