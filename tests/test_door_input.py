"""Every door refuses a bad argument before anything is queued, with the
documented error: session ids, transports, generations, and an unjournaled
payload's own ``server_event_seq``. The thread door never blocks on a refusal;
the supervisor survives it."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import trio

from actors._errors import InvalidInputError, InvalidPayloadError, InvalidSessionIdError
from supervisor import (
    AsyncSessionRegistry,
    ThreadSessionRegistry,
    open_asyncio_registry,
    open_session_registry,
)
from supervisor.compat import DuplexSessionAttachmentRegistry
from supervisor.testing import registry_options

OPTIONS = registry_options()

BAD_IDS: list[object] = [["a"], "", 7, None]
BAD_GENERATIONS: list[object] = [True, -1, 1.0, "1"]


async def _send(frame: object) -> None:
    pass


async def _close(reason: str) -> None:
    pass


def _plain_send(frame: object) -> None:
    pass


Call = Callable[[AsyncSessionRegistry, Any], Awaitable[object]]

#: Every door method that names a session, called with ``sid``.
SESSION_CALLS: dict[str, Call] = {
    "create": lambda r, sid: r.create(sid, send=_send, close=_close),
    "send_event": lambda r, sid: r.send_event(sid, {"type": "x"}),
    "send_events": lambda r, sid: r.send_events(sid, [{"type": "x"}]),
    "acknowledge": lambda r, sid: r.acknowledge(sid, 0),
    "detach": lambda r, sid: r.detach(sid),
    "release_attachment": lambda r, sid: r.release_attachment(sid),
    "begin_resume": lambda r, sid: r.begin_resume(sid),
    "end_resume": lambda r, sid: r.end_resume(sid),
    "settle_lease_generation": lambda r, sid: r.settle_lease_generation(sid, 1),
    "has_attachment": lambda r, sid: r.has_attachment(sid),
    "is_current_attachment": lambda r, sid: r.is_current_attachment(sid, 1),
    "authenticate_resume": lambda r, sid: r.authenticate_resume(
        sid, resume_token="t", last_received_server_event_seq=0
    ),
    "resume": lambda r, sid: r.resume(
        sid, resume_token="t", last_received_server_event_seq=0, send=_send, close=_close
    ),
    "abandon_resume": lambda r, sid: r.abandon_resume(sid, attachment_generation=1),
    "close": lambda r, sid: r.close(sid),
}

#: Calls on the existing session "s" with a bad generation ``g``.
GENERATION_CALLS: dict[str, Call] = {
    "create": lambda r, g: r.create("new", send=_send, close=_close, lease_generation=g),
    "detach": lambda r, g: r.detach("s", attachment_generation=g),
    "release_attachment": lambda r, g: r.release_attachment("s", attachment_generation=g),
    "settle_lease_generation": lambda r, g: r.settle_lease_generation("s", g),
    "is_current_attachment": lambda r, g: r.is_current_attachment("s", g),
    "abandon_resume": lambda r, g: r.abandon_resume("s", attachment_generation=g),
    "resume": lambda r, g: r.resume(
        "s",
        resume_token="t",
        last_received_server_event_seq=0,
        send=_send,
        close=_close,
        lease_generation=g,
    ),
}

BAD_TRANSPORTS: list[tuple[object, object]] = [
    (None, _close),
    (_send, None),
    (_plain_send, _close),  # not async: every later send would fail
]


async def _refuses_everything(registry: AsyncSessionRegistry) -> None:
    created = await registry.create("s", send=_send, close=_close)
    for name, call in SESSION_CALLS.items():
        for sid in BAD_IDS:
            with pytest.raises(InvalidSessionIdError):
                await call(registry, sid)
            assert registry.stats().sessions == 1, name
    with pytest.raises(InvalidSessionIdError):
        registry.send_event_nowait(["a"], {"type": "x"})  # type: ignore[arg-type]
    for name, call in GENERATION_CALLS.items():
        for generation in BAD_GENERATIONS:
            with pytest.raises(InvalidInputError, match="generation"):
                await call(registry, generation)
            assert registry.session_ids() == ["s"], name
    for send, close in BAD_TRANSPORTS:
        with pytest.raises(InvalidInputError):
            await registry.create("t", send=send, close=close)  # type: ignore[arg-type]
        with pytest.raises(InvalidInputError):
            await registry.resume(
                "s",
                resume_token=created.resume_token.plaintext,
                last_received_server_event_seq=0,
                send=send,  # type: ignore[arg-type]
                close=close,  # type: ignore[arg-type]
            )
    with pytest.raises(InvalidPayloadError, match="server_event_seq"):
        await registry.send_event("s", {"server_event_seq": 9}, journal=False)
    with pytest.raises(InvalidPayloadError, match="server_event_seq"):
        await registry.send_events("s", [{"type": "x"}, {"server_event_seq": 9}], journal=False)
    with pytest.raises(InvalidPayloadError, match="server_event_seq"):
        registry.send_event_nowait("s", {"server_event_seq": 9}, journal=False)
    # Nothing was queued: the session (and the supervisor) are as they were.
    assert registry.session_ids() == ["s"]
    assert await registry.is_current_attachment("s", 1)
    entry = await registry.send_event("s", {"type": "x", "server_event_seq": 9})
    assert entry is not None and entry.sequence == 1
    await registry.close("s")
    assert registry.session_ids() == []


async def test_trio_door() -> None:
    with trio.fail_after(30):
        async with open_session_registry(**OPTIONS) as registry:
            await _refuses_everything(registry)


def test_asyncio_door() -> None:
    async def scenario() -> None:
        async with open_asyncio_registry(**OPTIONS) as registry:
            await _refuses_everything(registry)

    asyncio.run(asyncio.wait_for(scenario(), 30))


def test_the_drop_in_refuses_only_what_the_seed_refused() -> None:
    """The seed's dict refused an unhashable id (``TypeError``); it took any
    transport, generation and unjournaled payload, and so does the drop-in."""

    async def scenario() -> None:
        registry = DuplexSessionAttachmentRegistry(
            replay_ttl_s=60, replay_max_bytes_per_session=1 << 20
        )
        try:
            await registry.create("s", send=_send, close=_close)
            for name, call in SESSION_CALLS.items():
                with pytest.raises(TypeError):
                    await call(registry, ["a"])
                assert registry.session_ids() == ["s"], name
            created = await registry.create(
                7,  # type: ignore[arg-type]
                send=_send,
                close=_close,
                lease_generation=-1,
            )
            assert created.attachment_generation == 1
            assert await registry.send_event("s", {"server_event_seq": 9}, journal=False) is None
            # The supervisor survived: the sessions still answer.
            assert sorted(map(str, registry.session_ids())) == ["7", "s"]
            assert await registry.close("s") is not None
        finally:
            await registry.aclose()

    asyncio.run(asyncio.wait_for(scenario(), 30))


def test_thread_door_never_blocks_on_a_refusal() -> None:
    with ThreadSessionRegistry(timeout=None, **OPTIONS) as registry:
        registry.create("s", send=_plain_send, close=lambda reason: None)
        blocking: dict[str, Callable[[Any], object]] = {
            "send_event": lambda sid: registry.send_event(sid, {"type": "x"}),
            "send_events": lambda sid: registry.send_events(sid, [{"type": "x"}]),
            "acknowledge": lambda sid: registry.acknowledge(sid, 0),
            "send_event_nowait": lambda sid: registry.send_event_nowait(sid, {"type": "x"}),
            "close": registry.close,
            "detach": registry.detach,
        }
        for name, call in blocking.items():
            with pytest.raises(InvalidSessionIdError):
                call(["a"])
            assert registry.session_ids() == ["s"], name
        with pytest.raises(InvalidInputError, match="generation"):
            registry.is_current_attachment("s", True)
        with pytest.raises(InvalidInputError):
            registry.create("t", send=None, close=lambda reason: None)  # type: ignore[arg-type]
        with pytest.raises(InvalidPayloadError):
            registry.send_event("s", {"server_event_seq": 3}, journal=False)
        # A blocking transport is right here: the thread door runs it on a thread.
        assert registry.is_current_attachment("s", 1)
        assert registry.send_event("s", {"type": "x"}) is not None
