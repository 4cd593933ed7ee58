"""Every door: a session taken over from a store that lost its last writes.

Two registries share one `MemoryStore`, as two processes share one Redis.
The first streams five events to its client; the store then loses the last
two (``lose_writes_after``: what a Redis replica promoted before they
reached it holds). The client resumes on the second registry with its last
sequence, 5: `JournalGapError` with reason ``store_lost`` (requested 5, the
store's head 3), never a replay from 3 nor a silent rewind; a resume with
the same sequence then carries on, and the next event is 6, in memory and in
the store.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable
from typing import Any

import pytest
import trio

from actors._errors import JournalGapError
from supervisor import ThreadSessionRegistry, open_asyncio_registry, open_session_registry
from supervisor.stores._memory import MemoryStore
from supervisor.testing import registry_options

SENT, KEPT = 5, 3


def lose_writes_after(store: MemoryStore, session_id: str) -> Callable[[], None]:
    """A function that puts ``session_id`` back as the store holds it now,
    forgetting every later write (as a promoted replica that missed them)."""
    held = copy.deepcopy(store._sessions[session_id])

    def lose() -> None:
        store._sessions[session_id] = copy.deepcopy(held)

    return lose


def check_gap(gap: JournalGapError) -> None:
    assert (gap.reason, gap.requested, gap.first_retained, gap.head) == (
        "store_lost",
        SENT,
        1,
        KEPT,
    )


def check_store(store: MemoryStore) -> None:
    stored = store.load("s")
    assert stored is not None
    assert [event.sequence for event in stored.events] == [SENT + 1]
    assert (stored.record.next_sequence, stored.record.dropped_through) == (SENT + 2, SENT)


def test_the_thread_door_answers_store_lost() -> None:
    store = MemoryStore()
    wire: list[Any] = []
    with (
        ThreadSessionRegistry(**registry_options(store=store)) as a,
        ThreadSessionRegistry(**registry_options(store=store)) as b,
    ):
        token = a.create("s", send=wire.append, close=print).resume_token.plaintext
        for n in range(SENT):
            a.send_event("s", {"n": n})
            if n + 1 == KEPT:
                lose = lose_writes_after(store, "s")
        assert [frame["server_event_seq"] for frame in wire] == [1, 2, 3, 4, 5]
        lose()
        with pytest.raises(JournalGapError) as raised:
            b.authenticate_resume("s", resume_token=token, last_received_server_event_seq=SENT)
        check_gap(raised.value)
        with pytest.raises(JournalGapError):
            b.resume(
                "s",
                resume_token=token,
                last_received_server_event_seq=SENT - 1,
                send=wire.append,
                close=print,
            )
        resumed = b.resume(
            "s",
            resume_token=token,
            last_received_server_event_seq=SENT,
            send=wire.append,
            close=print,
        )
        assert resumed.replay_entries == ()
        assert b.send_event("s", {"n": "after"}).sequence == SENT + 1  # type: ignore[union-attr]
        assert wire[-1] == {"n": "after", "server_event_seq": SENT + 1}
        check_store(store)


async def _async_doors(a: Any, b: Any, store: MemoryStore) -> None:
    wire: list[Any] = []

    async def send(frame: Any) -> None:
        wire.append(frame)

    async def close(reason: str) -> None:
        pass

    token = (await a.create("s", send=send, close=close)).resume_token.plaintext
    for n in range(SENT):
        await a.send_event("s", {"n": n})
        if n + 1 == KEPT:
            lose = lose_writes_after(store, "s")
    lose()
    with pytest.raises(JournalGapError) as raised:
        await b.resume(
            "s", resume_token=token, last_received_server_event_seq=SENT, send=send, close=close
        )
    check_gap(raised.value)
    resumed = await b.resume(
        "s", resume_token=token, last_received_server_event_seq=SENT, send=send, close=close
    )
    assert resumed.replay_entries == ()
    assert (await b.send_event("s", {"n": "after"})).sequence == SENT + 1
    assert [frame["server_event_seq"] for frame in wire] == [1, 2, 3, 4, 5, 6]
    check_store(store)


async def test_the_trio_door_answers_store_lost() -> None:
    store = MemoryStore()
    with trio.fail_after(30):
        async with (
            open_session_registry(**registry_options(store=store)) as a,
            open_session_registry(**registry_options(store=store)) as b,
        ):
            await _async_doors(a, b, store)


def test_the_asyncio_door_answers_store_lost() -> None:
    async def main() -> None:
        store = MemoryStore()
        async with (
            open_asyncio_registry(**registry_options(store=store)) as a,
            open_asyncio_registry(**registry_options(store=store)) as b,
        ):
            await asyncio.wait_for(_async_doors(a, b, store), 30)

    asyncio.run(main())
