"""Commits written off the loop: many sessions' commits in one round trip.

With the Redis store a session's commit goes to its registry's committer and
the session holds until the answer comes back: nothing of the transition
reaches the wire before Redis has it (a redis-server stopped with SIGSTOP
holds every frame), each session's commits and frames keep their order while
many sessions' commits share a round trip, one session's refusal in a batch
touches no other, and an outage answers `StoreUnavailableError` with the
session usable once Redis is back.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager

import pytest
import redis
import trio

from actors._commands import ResumeResult
from actors._credential import token_digest
from actors._errors import DuplicateSessionError, SessionReplacedError
from actors._store import Commit, StoredSession
from supervisor import InvalidResumeTokenError, SessionCrashedError, StoreUnavailableError
from supervisor.doors._trio import TrioSessionRegistry, open_session_registry
from supervisor.redis_store import RedisStore
from supervisor.stores import _redis_cluster
from supervisor.stores._committer import StoreCommitter
from supervisor.stores._memory import MemoryStore
from supervisor.testing import Wire, registry_options
from tests.redis_support import RedisServer
from tests.test_redis_store import events, record

LIMIT = 60.0
SESSIONS = 12


@asynccontextmanager
async def registry_on(store: RedisStore | MemoryStore) -> AsyncIterator[TrioSessionRegistry]:
    async with open_session_registry(**registry_options(store=store, replay_ttl_s=600)) as reg:
        yield reg


def committer_of(reg: TrioSessionRegistry) -> StoreCommitter:
    committer = reg.system.committer
    assert committer is not None
    return committer


@contextmanager
def stopped(server: RedisServer) -> Iterator[None]:
    """Redis frozen (SIGSTOP): its socket takes commands, nothing answers."""
    assert server.process is not None
    os.kill(server.process.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(server.process.pid, signal.SIGCONT)


async def until_in_flight(committer: StoreCommitter, count: int) -> None:
    while committer.in_flight() < count:
        await trio.sleep(0.01)


def stored_payloads(store: RedisStore, session_id: str) -> list[dict[str, object]]:
    stored = store.load(session_id)
    assert stored is not None
    assert [e.sequence for e in stored.events] == list(range(1, len(stored.events) + 1))
    payloads = [json.loads(e.encoded) for e in stored.events]
    for payload in payloads:
        payload.pop("server_event_seq")
    return payloads


async def open_sessions(reg: TrioSessionRegistry, count: int) -> dict[str, tuple[Wire, str]]:
    sessions = {}
    for n in range(count):
        wire = Wire()
        created = await reg.create(f"s{n}", send=wire.send, close=wire.close)
        sessions[f"s{n}"] = (wire, created.resume_token.plaintext)
    return sessions


async def test_no_frame_reaches_the_wire_before_its_commit_is_durable(
    redis_server: RedisServer,
) -> None:
    store = RedisStore(redis_server.url, timeout_s=30)
    with trio.fail_after(LIMIT):
        async with registry_on(store) as reg:
            sessions = await open_sessions(reg, SESSIONS)
            committer = committer_of(reg)
            with stopped(redis_server):
                for session_id in sessions:
                    reg.send_event_nowait(session_id, {"n": 1})
                await until_in_flight(committer, SESSIONS)
                # Every commit is with Redis, none answered: the loop runs on
                # (this task does), and no session released its frame.
                await trio.sleep(0.2)
                assert [wire.frames for wire, _ in sessions.values()] == [[]] * SESSIONS
            for session_id, (wire, _) in sessions.items():
                await reg.send_event(session_id, {"n": 2})
                assert wire.frames == [
                    {"n": 1, "server_event_seq": 1},
                    {"n": 2, "server_event_seq": 2},
                ]
            # The frozen round trip carried the commits of many sessions at once.
            assert committer.largest_batch >= SESSIONS // 2
    for session_id in sessions:
        assert stored_payloads(store, session_id) == [{"n": 1}, {"n": 2}]
    store.close()


async def test_each_session_keeps_its_order_while_commits_batch_across_sessions(
    redis_server: RedisServer,
) -> None:
    store = RedisStore(redis_server.url, timeout_s=30)
    events = 15

    async def talk(reg: TrioSessionRegistry, session_id: str) -> None:
        for n in range(events):
            if n % 3 == 2:
                reg.send_event_nowait(session_id, {"n": n})
            else:
                await reg.send_event(session_id, {"n": n})

    with trio.fail_after(LIMIT):
        async with registry_on(store) as reg:
            sessions = await open_sessions(reg, SESSIONS)
            async with trio.open_nursery() as nursery:
                for session_id in sessions:
                    nursery.start_soon(talk, reg, session_id)
            for session_id in sessions:
                await reg.send_event(session_id, {"n": events})
            committer = committer_of(reg)
            assert committer.batches < committer.commits
    expected = [{"n": n} for n in range(events + 1)]
    for session_id, (wire, _) in sessions.items():
        assert [{"n": f["n"]} for f in wire.frames] == expected
        assert wire.sequences() == list(range(1, events + 2))
        assert stored_payloads(store, session_id) == expected
    store.close()


async def test_a_refusal_in_a_batch_touches_only_its_session(redis_server: RedisServer) -> None:
    store = RedisStore(redis_server.url, timeout_s=30)
    other_process = RedisStore(redis_server.url)
    with trio.fail_after(LIMIT):
        async with registry_on(store) as reg:
            sessions = await open_sessions(reg, SESSIONS)
            victim_wire, victim_token = sessions["s3"]
            # Another process takes s3 over: this one's epoch is fenced.
            assert other_process.acquire("s3", token_digest(victim_token)) is not None
            committer = committer_of(reg)
            with stopped(redis_server):
                for session_id in sessions:
                    reg.send_event_nowait(session_id, {"n": 1})
                await until_in_flight(committer, SESSIONS)
            for session_id, (wire, _) in sessions.items():
                if session_id != "s3":
                    await reg.send_event(session_id, {"n": 2})
                    assert wire.frames == [
                        {"n": 1, "server_event_seq": 1},
                        {"n": 2, "server_event_seq": 2},
                    ]
            await victim_wire.closed.wait()
            assert victim_wire.closes == ["replaced"]
            assert victim_wire.frames == []
            assert committer.largest_batch >= SESSIONS // 2
    assert stored_payloads(store, "s3") == []
    for session_id in sessions:
        if session_id != "s3":
            assert stored_payloads(store, session_id) == [{"n": 1}, {"n": 2}]
    other_process.close()
    store.close()


async def test_an_outage_answers_unavailable_and_the_session_works_after(
    redis_server: RedisServer,
) -> None:
    store = RedisStore(redis_server.url, timeout_s=2)
    with trio.fail_after(LIMIT):
        async with registry_on(store) as reg:
            sessions = await open_sessions(reg, 3)
            for session_id in sessions:
                await reg.send_event(session_id, {"n": 1})
            await trio.to_thread.run_sync(redis_server.kill)
            for session_id in sessions:
                with pytest.raises(StoreUnavailableError):
                    await reg.send_event(session_id, {"n": "lost"})
            await trio.to_thread.run_sync(redis_server.start)
            for session_id, (wire, _) in sessions.items():
                entry = await reg.send_event(session_id, {"n": 2})
                assert entry is not None and entry.sequence == 2
                assert wire.frames == [
                    {"n": 1, "server_event_seq": 1},
                    {"n": 2, "server_event_seq": 2},
                ]
    for session_id in sessions:
        assert stored_payloads(store, session_id) == [{"n": 1}, {"n": 2}]
    store.close()


async def test_the_memory_store_writes_in_the_sessions_turn_with_no_committer() -> None:
    store = MemoryStore()
    with trio.fail_after(LIMIT):
        async with registry_on(store) as reg:
            assert reg.system.committer is None
            wire = Wire()
            await reg.create("s", send=wire.send, close=wire.close)
            await reg.send_event("s", {"n": 1})
            stored = store.load("s")
            assert stored is not None and len(stored.events) == 1


def test_commit_many_answers_each_commit_alone(redis_server: RedisServer) -> None:
    store = RedisStore(redis_server.url)
    for session_id in ("a", "b", "c"):
        store.create(session_id, record())
    commits = [
        Commit(session_id="a", epoch=1, record=None, appends=events(1, 2)),
        Commit(session_id="b", epoch=2, record=None, appends=events(1, 1)),  # not its epoch
        Commit(session_id="c", epoch=1, record=None, appends=events(1, 1)),
        Commit(session_id="a", epoch=1, record=None, appends=events(3, 3)),
    ]
    outcomes = store.commit_many(commits)
    assert [type(o) for o in outcomes] == [type(None), SessionReplacedError, type(None), type(None)]
    assert [e.sequence for e in loaded(store, "a").events] == [1, 2, 3]
    assert loaded(store, "b").events == ()
    assert [e.sequence for e in loaded(store, "c").events] == [1]
    store.close()


def test_commit_many_loads_its_script_again_after_redis_lost_it(
    redis_server: RedisServer,
) -> None:
    store = RedisStore(redis_server.url)
    store.create("a", record())
    redis.Redis.from_url(redis_server.url).script_flush()
    outcomes = store.commit_many(
        [Commit(session_id="a", epoch=1, record=None, appends=events(1, 1))]
    )
    assert outcomes == [None]
    assert store.renew_many([("a", 1), ("a", 2)]) == [True, False]
    redis.Redis.from_url(redis_server.url).script_flush()
    assert store.renew_many([("a", 1)]) == [True]
    store.close()


def test_commit_many_without_hiredis_packs_with_redis_py(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """redis-py installed without its [hiredis] extra: the batch is packed by
    the connection itself, and the same commits, refusals and scripts hold."""
    monkeypatch.setattr(_redis_cluster, "_hiredis", None)
    store = RedisStore(redis_server.url)
    store.create("a", record())
    redis.Redis.from_url(redis_server.url).script_flush()  # the EVAL path too
    outcomes = store.commit_many(
        [
            Commit(session_id="a", epoch=1, record=None, appends=events(1, 2)),
            Commit(session_id="a", epoch=9, record=None, appends=events(3, 1)),
        ]
    )
    assert outcomes[0] is None
    assert isinstance(outcomes[1], SessionReplacedError)
    assert [e.sequence for e in loaded(store, "a").events] == [1, 2]
    store.close()


def loaded(store: RedisStore, session_id: str) -> StoredSession:
    stored = store.load(session_id)
    assert stored is not None
    return stored


async def test_a_sweep_does_not_wait_for_a_frozen_redis(redis_server: RedisServer) -> None:
    # The lease renewals go to the committer's thread; the loop sweeps on.
    store = RedisStore(redis_server.url, timeout_s=30)
    other_process = RedisStore(redis_server.url)
    with trio.fail_after(LIMIT):
        async with registry_on(store) as reg:
            sessions = await open_sessions(reg, 3)
            _, token = sessions["s1"]
            with stopped(redis_server):
                await reg.sweep()
                await reg.sweep()  # the first one's renewals still out: not sent twice
                assert committer_of(reg).in_flight() == 1
            # Taken over elsewhere: the next sweep's renewal learns it.
            assert other_process.acquire("s1", token_digest(token)) is not None
            wire, _ = sessions["s1"]
            while not wire.closes:
                await reg.sweep()
                await trio.sleep(0.01)
            assert wire.closes == ["replaced"]
            assert [w.closes for sid, (w, _) in sessions.items() if sid != "s1"] == [[], []]
    other_process.close()
    store.close()


async def test_a_create_waits_for_the_store_off_the_loop(redis_server: RedisServer) -> None:
    store = RedisStore(redis_server.url, timeout_s=30)
    with trio.fail_after(LIMIT):
        async with registry_on(store) as reg:
            (existing_wire, _), *_ = (await open_sessions(reg, 1)).values()
            committer = committer_of(reg)
            wire = Wire()
            opened = trio.Event()

            async def create() -> None:
                await reg.create("new", send=wire.send, close=wire.close)
                opened.set()

            async with trio.open_nursery() as nursery:
                with stopped(redis_server):
                    nursery.start_soon(create)
                    await until_in_flight(committer, 1)
                    reg.send_event_nowait("new", {"n": 1})  # held behind the create
                    # The loop is free: an event to a live session is queued too.
                    reg.send_event_nowait("s0", {"n": 1})
                    await trio.sleep(0.2)
                    assert not opened.is_set()
                    assert wire.frames == existing_wire.frames == []
            await reg.send_event("new", {"n": 2})
            assert wire.sequences() == [1, 2]
    assert stored_payloads(store, "new") == [{"n": 1}, {"n": 2}]
    store.close()


async def test_a_refused_create_is_the_callers_error_and_leaves_nothing(
    redis_server: RedisServer,
) -> None:
    store = RedisStore(redis_server.url, timeout_s=2)
    RedisStore(redis_server.url).create("taken", record())
    with trio.fail_after(LIMIT):
        async with registry_on(store) as reg:
            wire = Wire()
            with pytest.raises(DuplicateSessionError):
                await reg.create("taken", send=wire.send, close=wire.close)
            assert "taken" not in reg.session_ids()
            await trio.to_thread.run_sync(redis_server.kill)
            with pytest.raises(StoreUnavailableError):
                await reg.create("later", send=wire.send, close=wire.close)
            await trio.to_thread.run_sync(redis_server.start)
            await reg.create("later", send=wire.send, close=wire.close)
            await reg.send_event("later", {"n": 1})
            assert wire.sequences() == [1]
    store.close()


async def test_a_takeover_waits_for_the_store_off_the_loop(redis_server: RedisServer) -> None:
    owner_store = RedisStore(redis_server.url)
    store = RedisStore(redis_server.url, timeout_s=30)
    with trio.fail_after(LIMIT):
        async with registry_on(owner_store) as owner:
            (_, token), *_ = (await open_sessions(owner, 1)).values()
            await owner.send_event("s0", {"n": 1})
            async with registry_on(store) as reg:
                wires = [Wire(), Wire()]
                results: list[object] = []

                async def resume(wire: Wire) -> None:
                    try:
                        result: object = await reg.resume(
                            "s0",
                            resume_token=token,
                            last_received_server_event_seq=0,
                            send=wire.send,
                            close=wire.close,
                        )
                    except InvalidResumeTokenError as exc:  # the first one rotated it
                        result = exc
                    results.append(result)

                async with trio.open_nursery() as nursery:
                    with stopped(redis_server):
                        for wire in wires:
                            nursery.start_soon(resume, wire)
                        await until_in_flight(committer_of(reg), 1)
                        with trio.fail_after(10):  # the loop is not waiting for Redis
                            await trio.sleep(0.2)
                        assert results == []
                # Two resumes, one takeover: the second found the session here.
                assert len(results) == 2
                assert any(isinstance(r, ResumeResult) for r in results), results
                stored = store.load("s0", events=False)
                assert stored is not None and stored.epoch == 2
                await reg.send_event("s0", {"n": 2})
    assert stored_payloads(store, "s0") == [{"n": 1}, {"n": 2}]
    owner_store.close()
    store.close()


class BuggyStore(RedisStore):
    """A real RedisStore whose batch answers one session's next commit with a bug."""

    buggy: str | None = None

    def commit_many(self, commits: Sequence[Commit]) -> list[BaseException | None]:
        buggy, self.buggy = self.buggy, None
        written = iter(super().commit_many([c for c in commits if c.session_id != buggy]))
        return [RuntimeError("a bug") if c.session_id == buggy else next(written) for c in commits]


async def test_a_bug_answering_a_commit_crashes_that_call_only(redis_server: RedisServer) -> None:
    store = BuggyStore(redis_server.url, timeout_s=30)
    with trio.fail_after(LIMIT):
        async with registry_on(store) as reg:
            sessions = await open_sessions(reg, 3)
            store.buggy = "s1"
            outcome: list[BaseException] = []

            async def crashing_send() -> None:
                try:
                    await reg.send_event("s1", {"n": 1})
                except SessionCrashedError as exc:
                    outcome.append(exc)

            async with trio.open_nursery() as nursery:
                with stopped(redis_server):  # all three in one batch
                    reg.send_event_nowait("s0", {"n": 1})
                    nursery.start_soon(crashing_send)
                    reg.send_event_nowait("s2", {"n": 1})
                    await until_in_flight(committer_of(reg), 3)
            assert len(outcome) == 1  # the bug is that call's crash, no other's
            for session_id in sessions:
                await reg.send_event(session_id, {"n": 2})
            # The crashed transition was undone: s1's next event is its first.
            assert sessions["s1"][0].sequences() == [1]
            assert sessions["s0"][0].sequences() == sessions["s2"][0].sequences() == [1, 2]
    assert stored_payloads(store, "s1") == [{"n": 2}]
    for session_id in ("s0", "s2"):
        assert stored_payloads(store, session_id) == [{"n": 1}, {"n": 2}]
    store.close()
