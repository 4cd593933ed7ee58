"""A commit Redis applied whose reply was lost: fenced and read back, never undone blindly.

A real redis-server behind a TCP proxy (tests/redis_proxy.py) that lets a
commit reach Redis and cuts the connection before its reply comes back (or
cuts it before the commit is sent). The session holds until the store says
which happened: an applied commit is kept (its frames go out once, the next
commit follows it), one never applied is undone and answered
`StoreUnavailableError`; a token rotation ends with the client holding the
token the store holds. A fence ends the epoch that wrote the commit, so a
copy of it arriving later is refused. A create whose reply was lost is sent
again and recognised as the session's own.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager

import pytest
import trio

from actors._commands import ResumeResult
from actors._credential import token_digest
from actors._errors import RegistryClosedError, SessionReplacedError, StoreUnavailableError
from actors._store import Commit
from supervisor.doors._trio import TrioSessionRegistry
from supervisor.redis_store import RedisStore
from supervisor.stores import _redis_scripts as redis_scripts
from supervisor.testing import Wire
from tests.redis_proxy import LossyProxy
from tests.redis_support import RedisServer
from tests.test_redis_cluster_failover import cut_replication
from tests.test_redis_committer import committer_of, registry_on, stored_payloads
from tests.test_redis_store import events, record

LIMIT = 60.0
#: What every commit's request holds: the commit script's digest (EVALSHA).
COMMIT = hashlib.sha1(redis_scripts.COMMIT.encode()).hexdigest().encode()  # noqa: S324
#: And every create's.
CREATE = hashlib.sha1(redis_scripts.CREATE.encode()).hexdigest().encode()  # noqa: S324


@pytest.fixture
def proxy(redis_server: RedisServer) -> Iterator[LossyProxy]:
    lossy = LossyProxy(redis_server.port)
    yield lossy
    lossy.close()


@asynccontextmanager
async def one_session(store: RedisStore) -> AsyncIterator[tuple[TrioSessionRegistry, Wire, str]]:
    async with registry_on(store) as reg:
        wire = Wire()
        created = await reg.create("s", send=wire.send, close=wire.close)
        await reg.send_event("s", {"n": 1})
        yield reg, wire, created.resume_token.plaintext


async def test_a_commit_applied_whose_reply_was_lost_is_kept_and_sent_once(
    proxy: LossyProxy,
) -> None:
    store = RedisStore(proxy.url, timeout_s=5)
    with trio.fail_after(LIMIT):
        async with one_session(store) as (reg, wire, _):
            proxy.lose_reply(COMMIT)
            entry = await reg.send_event("s", {"n": 2})
            assert proxy.lost.is_set()
            assert entry is not None and entry.sequence == 2
            third = await reg.send_event("s", {"n": 3})
            assert third is not None and third.sequence == 3
            assert wire.sequences() == [1, 2, 3]
            assert "s" in reg.session_ids()
    assert stored_payloads(store, "s") == [{"n": 1}, {"n": 2}, {"n": 3}]
    store.close()


async def test_a_lost_reply_then_an_ack_leaves_no_store_behind_the_stream(
    proxy: LossyProxy,
) -> None:
    """Undone blindly, the applied commit's event stayed in Redis's stream
    while the ack's commit wrote the session's fields back below it: the next
    event's XADD failed inside the script (a ResponseError), a crash of the
    session, again on every try."""
    store = RedisStore(proxy.url, timeout_s=5)
    with trio.fail_after(LIMIT):
        async with one_session(store) as (reg, wire, _):
            proxy.lose_reply(COMMIT)
            with contextlib.suppress(StoreUnavailableError):
                await reg.send_event("s", {"n": 2})
            await reg.acknowledge("s", 1)
            for n in (3, 4):
                await reg.send_event("s", {"n": n})
            assert len(wire.sequences()) == len(set(wire.sequences()))
            assert reg.stats().crashes == 0
            stored = store.load("s")
            assert stored is not None
            assert stored.record.next_sequence == wire.sequences()[-1] + 1
    store.close()


def _lose_request(proxy: LossyProxy) -> None:
    proxy.lose_request(COMMIT)


def _answer_loading(proxy: LossyProxy) -> None:
    proxy.answer_instead(COMMIT, b"-LOADING Redis is loading the dataset in memory\r\n")


@pytest.mark.parametrize(
    "refuse",
    [
        pytest.param(_lose_request, id="cut-before-it-reached-redis"),
        # redis-py's BusyLoadingError is a ConnectionError: unavailable, not a crash.
        pytest.param(_answer_loading, id="redis-still-loading-its-data"),
    ],
)
async def test_a_commit_redis_never_applied_is_undone(
    proxy: LossyProxy, refuse: Callable[[LossyProxy], None]
) -> None:
    store = RedisStore(proxy.url, timeout_s=5)
    with trio.fail_after(LIMIT):
        async with one_session(store) as (reg, wire, _):
            refuse(proxy)
            with pytest.raises(StoreUnavailableError):
                await reg.send_event("s", {"n": "lost"})
            assert proxy.lost.is_set()
            entry = await reg.send_event("s", {"n": 2})
            assert entry is not None and entry.sequence == 2
            assert wire.sequences() == [1, 2]
            assert reg.stats().crashes == 0
    assert stored_payloads(store, "s") == [{"n": 1}, {"n": 2}]
    store.close()


async def test_a_rotation_whose_reply_was_lost_leaves_client_and_store_agreeing(
    proxy: LossyProxy,
) -> None:
    store = RedisStore(proxy.url, timeout_s=5)
    with trio.fail_after(LIMIT):
        async with one_session(store) as (reg, _, token):
            proxy.lose_reply(COMMIT)
            wire = Wire()
            try:
                resumed = await reg.resume(
                    "s",
                    resume_token=token,
                    last_received_server_event_seq=1,
                    send=wire.send,
                    close=wire.close,
                )
            except StoreUnavailableError:
                held = token  # told so: the client keeps its token
            else:
                held = resumed.resume_token.plaintext
            assert proxy.lost.is_set()
            stored = store.load("s", events=False)
            assert stored is not None
            assert stored.record.token_digest == token_digest(held)
            again = await reg.resume(
                "s",
                resume_token=held,
                last_received_server_event_seq=1,
                send=wire.send,
                close=wire.close,
            )
            assert isinstance(again, ResumeResult)
            await reg.send_event("s", {"n": 2})
            assert wire.sequences()[-1] == 2
    store.close()


async def test_a_lost_reply_while_redis_is_down_waits_for_it_to_come_back(
    redis_server: RedisServer, proxy: LossyProxy
) -> None:
    """The demo's outage: Redis applied the commit (appendfsync always), was
    SIGKILLed before its reply left, and came back from its append-only file."""
    store = RedisStore(proxy.url, timeout_s=5)
    with trio.fail_after(LIMIT):
        async with one_session(store) as (reg, wire, _):
            proxy.lose_reply(COMMIT)
            sent: list[object] = []

            async def send() -> None:
                sent.append(await reg.send_event("s", {"n": 2}))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(send)
                await trio.to_thread.run_sync(proxy.lost.wait)
                await trio.to_thread.run_sync(redis_server.kill)
                # The fence meets the outage: tried again on the committer's timer.
                committer = committer_of(reg)
                while committer.in_flight() < 1:
                    await trio.sleep(0.01)
                assert sent == [] and wire.sequences() == [1]
                await trio.to_thread.run_sync(redis_server.start)
            (entry,) = sent
            assert getattr(entry, "sequence", None) == 2
            await reg.send_event("s", {"n": 3})
            assert wire.sequences() == [1, 2, 3]
    assert stored_payloads(store, "s") == [{"n": 1}, {"n": 2}, {"n": 3}]
    store.close()


@pytest.mark.parametrize("write", ["commit", "create"])
async def test_a_shutdown_does_not_wait_out_an_unknown_write(
    redis_server: RedisServer, proxy: LossyProxy, write: str
) -> None:
    """Redis down for good while a write's outcome is unknown: its fence (or
    the create sent again) could wait up to the lease (here 10 min), a
    shutdown does not."""
    store = RedisStore(proxy.url, timeout_s=5, lease_s=600)
    outcome: list[BaseException] = []

    async def write_it(reg: TrioSessionRegistry) -> None:
        try:
            if write == "commit":
                await reg.send_event("s", {"n": 2})
            else:
                await reg.create("new", send=Wire().send, close=Wire().close)
        except RegistryClosedError as exc:
            outcome.append(exc)

    with trio.fail_after(LIMIT):
        # Leaving the registry's block shuts it down while the write meets the outage.
        async with trio.open_nursery() as nursery, one_session(store) as (reg, wire, _):
            proxy.lose_reply(COMMIT if write == "commit" else CREATE)
            nursery.start_soon(write_it, reg)
            await trio.to_thread.run_sync(proxy.lost.wait)
            await trio.to_thread.run_sync(redis_server.kill)
            committer = committer_of(reg)
            while committer.in_flight() < 1:
                await trio.sleep(0.01)
    assert len(outcome) == 1 and wire.sequences() == [1]
    store.close()


async def test_a_create_applied_whose_reply_was_lost_is_the_sessions_own(
    proxy: LossyProxy,
) -> None:
    """Answered unavailable, the create Redis applied stayed there: the same id
    created again was a duplicate for a day (the keys' TTL)."""
    store = RedisStore(proxy.url, timeout_s=5)
    with trio.fail_after(LIMIT):
        async with registry_on(store) as reg:
            proxy.lose_reply(CREATE)
            wire = Wire()
            await reg.create("new", send=wire.send, close=wire.close)
            assert proxy.lost.is_set()
            await reg.send_event("new", {"n": 1})
            assert wire.sequences() == [1]
    stored = store.load("new")
    assert stored is not None and stored.epoch == 1
    store.close()


def test_a_fence_ends_the_epoch_that_wrote_and_can_be_sent_again(
    redis_server: RedisServer,
) -> None:
    store = RedisStore(redis_server.url)
    store.create("a", record())
    store.commit(Commit(session_id="a", epoch=1, record=None, appends=events(1, 1)))
    fenced = store.fence("a", 1, "n1")
    assert fenced.epoch == 2 and fenced.record.next_sequence == 2
    # A copy of epoch 1's next commit arriving late is refused.
    with pytest.raises(SessionReplacedError):
        store.commit(Commit(session_id="a", epoch=1, record=None, appends=events(2, 2)))
    # Sent again (its answer lost), the same fence answers the same.
    assert store.fence("a", 1, "n1").epoch == 2
    # Another fence of epoch 1 finds it ended.
    with pytest.raises(SessionReplacedError):
        store.fence("a", 1, "n2")
    store.commit(Commit(session_id="a", epoch=2, record=None, appends=events(2, 2)))
    stored = store.load("a")
    assert stored is not None and [e.sequence for e in stored.events] == [1, 2]
    store.close()


async def test_a_write_still_unknown_past_the_lease_lets_the_session_go(
    replicated_redis: tuple[RedisServer, RedisServer],
) -> None:
    """The replica cut off once the session is created: WAIT 1 never reaches
    1, so neither the commit nor any fence of it is ever known durable. The
    session sends nothing, and past its lease lets go (``replaced``): the
    stored copy stands, for a resume to take over."""
    primary, replica = replicated_redis
    # A lease longer than cutting the replica takes: the commit is applied, not late.
    store = RedisStore(primary.url, timeout_s=0.4, durability_replicas=1, lease_s=4.0)
    with trio.fail_after(LIMIT):
        async with registry_on(store) as reg:
            wire = Wire()
            await reg.create("s", send=wire.send, close=wire.close)
            await trio.to_thread.run_sync(cut_replication, replica.port)
            with pytest.raises(SessionReplacedError):
                await reg.send_event("s", {"n": 1})
            assert "s" not in reg.session_ids()
            await wire.closed.wait()
            assert wire.frames == [] and wire.closes == ["replaced"]
    reader = RedisStore(primary.url)
    stored = reader.load("s")
    assert stored is not None and [e.sequence for e in stored.events] == [1]
    reader.close()
    store.close()
