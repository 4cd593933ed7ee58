"""``durability_replicas`` K: which writes wait for K replicas (``WAIT K``).

Commits and fences wait (tests/test_redis_cluster_failover.py,
tests/test_redis_lost_reply.py); so do a session's create (lost in a
failover, a client holding its token would be answered ``unknown_session``)
and a takeover's acquire (lost, the lease generation would roll back). A
write Redis applied but the replicas did not acknowledge is an unknown
outcome (`StoreOutcomeUnknownError`), as a commit's is. Renewals and deletes
do not wait (docs/guarantees.md says why).

Against a real primary with a real replica (`tests.redis_support.replicated_pair`),
whose replication the tests cut (`cut_replication`) and restore.
"""

from __future__ import annotations

import functools
import time

import pytest
import redis
import trio

from actors._credential import token_digest
from actors._errors import StoreOutcomeUnknownError, StoreUnavailableError
from actors._store import Commit
from supervisor.redis_store import RedisStore
from supervisor.testing import Wire
from tests.redis_support import RedisServer
from tests.test_redis_cluster_failover import cut_replication, wait_for
from tests.test_redis_committer import registry_on
from tests.test_redis_store import events, record
from tests.test_redis_takeover import Transport, registry

Pair = tuple[RedisServer, RedisServer]
LIMIT = 30.0


def restore_replication(replica: RedisServer) -> None:
    with redis.Redis(host="127.0.0.1", port=replica.port) as node:
        node.config_set("masteruser", "")
        node.config_set("masterauth", "")

        def link_up() -> bool:
            return bool(node.info("replication").get("master_link_status") == "up")

        wait_for(link_up, "the replica did not link to its primary again")


def test_creates_and_acquires_wait_for_the_replica(replicated_redis: Pair) -> None:
    primary, replica = replicated_redis
    store = RedisStore(primary.url, timeout_s=0.4, durability_replicas=1)
    assert store.create("a", record()) == 1
    taken = store.acquire("a", token_digest("token-0"))
    assert taken is not None and taken.epoch == 2
    cut_replication(replica.port)
    with pytest.raises(StoreOutcomeUnknownError, match="replicas"):
        store.create("b", record())
    with pytest.raises(StoreOutcomeUnknownError, match="replicas"):
        store.acquire("a", token_digest("token-0"))
    # Both applied on the primary: unknown, not refused.
    plain = RedisStore(primary.url)
    stored_b, stored_a = plain.load("b"), plain.load("a", events=False)
    assert stored_b is not None and stored_b.epoch == 1
    assert stored_a is not None and stored_a.epoch == 3
    # Renewals and deletes do not wait.
    assert store.renew("a", 3) is True
    assert store.renew_many([("a", 3)]) == [True]
    store.delete("b", 1)
    assert plain.load("b") is None
    # A create sent again once the replica is back answers created (the same record).
    with pytest.raises(StoreOutcomeUnknownError):
        store.create("c", record("token-c"))
    restore_replication(replica)
    assert store.create("c", record("token-c")) == 1
    plain.close()
    store.close()


def test_creates_and_acquires_do_not_wait_without_durability(replicated_redis: Pair) -> None:
    primary, replica = replicated_redis
    cut_replication(replica.port)
    store = RedisStore(primary.url, timeout_s=0.4)
    assert store.create("a", record()) == 1
    taken = store.acquire("a", token_digest("token-0"))
    assert taken is not None and taken.epoch == 2
    store.close()


async def test_a_create_unreplicated_is_held_until_the_replica_is_back(
    replicated_redis: Pair,
) -> None:
    """The registry's create: its first answer unknown, it is sent again
    (until the lease) and answered once the replica acknowledges it."""
    primary, replica = replicated_redis
    store = RedisStore(primary.url, timeout_s=0.4, durability_replicas=1, lease_s=20.0)
    cut_replication(replica.port)
    with trio.fail_after(LIMIT):
        async with registry_on(store) as reg, trio.open_nursery() as nursery:
            wire = Wire()
            created = trio.Event()

            async def create() -> None:
                await reg.create("s", send=wire.send, close=wire.close)
                created.set()

            nursery.start_soon(create)
            with redis.Redis(host="127.0.0.1", port=primary.port) as node:
                while not node.exists("duplex:{s}:f"):  # applied on the primary
                    await trio.sleep(0.01)
            assert not created.is_set()
            await trio.to_thread.run_sync(restore_replication, replica)
            await created.wait()
            await reg.send_event("s", {"n": 1})
    reader = RedisStore(primary.url)
    stored = reader.load("s")
    assert stored is not None and [e.sequence for e in stored.events] == [1]
    reader.close()
    store.close()


async def test_a_create_never_replicated_fails_past_the_lease(replicated_redis: Pair) -> None:
    primary, replica = replicated_redis
    store = RedisStore(primary.url, timeout_s=0.4, durability_replicas=1, lease_s=1.0)
    cut_replication(replica.port)
    with trio.fail_after(LIMIT):
        async with registry_on(store) as reg:
            wire = Wire()
            with pytest.raises(StoreUnavailableError):
                await reg.create("s", send=wire.send, close=wire.close)
            assert "s" not in reg.session_ids()
    store.close()


def test_a_commit_after_an_unreplicated_create_is_its_owners(replicated_redis: Pair) -> None:
    """The create was applied (only its replication is unknown): its epoch
    commits, and the commit's WAIT covers the create before it."""
    primary, replica = replicated_redis
    store = RedisStore(primary.url, timeout_s=0.4, durability_replicas=1)
    cut_replication(replica.port)
    with pytest.raises(StoreOutcomeUnknownError):
        store.create("a", record())
    restore_replication(replica)
    store.commit(Commit(session_id="a", epoch=1, record=None, appends=events(1, 1)))
    deadline = time.monotonic() + 10
    with redis.Redis(host="127.0.0.1", port=replica.port) as node:
        while not node.exists("duplex:{a}:f"):
            assert time.monotonic() < deadline
            time.sleep(0.05)
    store.close()


def test_a_takeover_unreplicated_answers_the_resume_unavailable(replicated_redis: Pair) -> None:
    """Registry b's acquire is applied but not acknowledged: the resume is
    answered `StoreUnavailableError` (nothing taken in, nothing sent); once
    the replica is back the same token resumes there."""
    primary, replica = replicated_redis
    first = RedisStore(primary.url, timeout_s=0.4, durability_replicas=1)
    second = RedisStore(primary.url, timeout_s=0.4, durability_replicas=1)
    old_wire, new_wire = Transport(), Transport()
    with registry(first) as a, registry(second) as b:
        created = a.create("s", send=old_wire.send, close=old_wire.close)
        a.send_event("s", {"n": 1})
        resume = functools.partial(
            b.resume,
            "s",
            resume_token=created.resume_token.plaintext,
            last_received_server_event_seq=0,
            send=new_wire.send,
            close=new_wire.close,
        )
        cut_replication(replica.port)
        with pytest.raises(StoreOutcomeUnknownError):
            resume()
        assert "s" not in b.session_ids() and new_wire.frames == []
        restore_replication(replica)
        result = resume()
        assert [entry.sequence for entry in result.replay_entries] == [1]
    first.close()
    second.close()
