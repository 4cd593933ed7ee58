"""The two references every benchmark ratio is taken against, written by us.

* `floor_round_trips`: the bare trip of a trio task to a worker thread
  and back (``queue.SimpleQueue`` + ``TrioToken.run_sync_soon``), no work.
  Any actor design on CPython pays at least this per awaited call.
* `LockRegistry`: the seed's algorithm on trio, a lock per session
  around journal + send, with our `EventJournal` so
  both sides do the same journaling. It implements only what the scenarios
  measure and lives here, not in the library.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass

import trio

from actors._credential import ResumeCredential, ResumeToken
from actors._journal import EventJournal, JournalEntry

__all__ = ["LockRegistry", "floor_round_trips"]

Send = Callable[[dict[str, object]], Awaitable[None]]


async def floor_round_trips(count: int) -> list[float]:
    """Latencies (s) of ``count`` trio -> thread -> trio round trips."""
    inbox: queue.SimpleQueue[Callable[[], object] | None] = queue.SimpleQueue()
    token = trio.lowlevel.current_trio_token()

    def worker() -> None:
        while (callback := inbox.get()) is not None:
            token.run_sync_soon(callback)

    thread = threading.Thread(target=worker, name="bench-floor", daemon=True)
    thread.start()
    latencies = []
    try:
        for _ in range(count):
            done = trio.Event()
            start = time.perf_counter()
            inbox.put(done.set)
            await done.wait()
            latencies.append(time.perf_counter() - start)
    finally:
        inbox.put(None)
        thread.join()
    return latencies


@dataclass(slots=True)
class _LockedSession:
    journal: EventJournal
    credential: ResumeCredential
    send: Send | None
    lock: AbstractAsyncContextManager[object]


class LockRegistry:
    """The seed's locking discipline, for the operations measured: on trio's
    locks by default; ``lock=anyio.Lock`` serves it on asyncio too (the
    gateway benchmark behind uvicorn)."""

    def __init__(
        self,
        *,
        replay_ttl_s: float,
        replay_max_bytes_per_session: int,
        lock: Callable[[], AbstractAsyncContextManager[object]] = trio.Lock,
    ) -> None:
        self._ttl = replay_ttl_s
        self._max_bytes = replay_max_bytes_per_session
        self._sessions: dict[str, _LockedSession] = {}
        self._new_lock = lock
        self._lock = lock()

    async def create(self, session_id: str, *, send: Send) -> ResumeToken:
        async with self._lock:
            token = ResumeToken.generate()
            self._sessions[session_id] = _LockedSession(
                journal=EventJournal(max_bytes=self._max_bytes, ttl_s=self._ttl),
                credential=ResumeCredential.from_token(token),
                send=send,
                lock=self._new_lock(),
            )
            return token

    async def close(self, session_id: str) -> bool:
        async with self._lock:
            return self._sessions.pop(session_id, None) is not None

    async def send_event(self, session_id: str, payload: Mapping[str, object]) -> JournalEntry:
        async with self._lock:
            session = self._sessions[session_id]
        async with session.lock:
            async with self._lock:
                # As the actors do: the live frame is the sequenced payload the
                # journal hands back, not one decoded from the entry.
                entry, frame = session.journal.record_framed(payload)
                send = session.send
            if send is not None:
                await send(dict(frame))
            return entry

    async def acknowledge(self, session_id: str, sequence: int) -> int:
        async with self._lock:
            return self._sessions[session_id].journal.acknowledge(sequence)

    async def resume(
        self, session_id: str, *, resume_token: str, last_seq: int, send: Send
    ) -> tuple[ResumeToken, tuple[JournalEntry, ...]]:
        async with self._lock:
            session = self._sessions[session_id]
        async with session.lock:
            async with self._lock:
                if not session.credential.verify(resume_token):
                    raise RuntimeError("invalid resume token")
                replay = session.journal.replay_after(last_seq)
                token = session.credential.rotate()
                session.send = send
            await send({"type": "session.resumed"})
            for entry in replay:
                await send(entry.fresh_payload())
            return token, replay
