"""A write whose reply is lost is in doubt, never sent again by the client library.

Redis may have applied a script whose reply never came back (the connection
broke after the server ran it: a primary killed mid-batch). Sending it again
is not safe: a commit applied twice is refused the second time (its events
no longer follow the stored head) and was answered "replaced", which closed a
live client 4000 in ``demo --redis cluster-local`` with no other process
holding its session. redis-py's cluster client sends a command again after a
connection error (a pipeline's commands one by one, a single command up to
its retry count); the store must not let it. The reply lost here is injected
at the connection (the server has answered; the client drops it), on a real
local Redis Cluster and on one redis-server. (test_redis_lost_reply.py covers
what a session does with a write in doubt, through a TCP proxy.)
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator

import pytest
import redis
import redis.connection

from actors._errors import StoreOutcomeUnknownError, StoreUnavailableError
from actors._store import Commit
from supervisor.redis_store import RedisStore
from supervisor.stores import _redis_cluster
from tests.redis_cluster_support import LocalCluster
from tests.redis_support import RedisServer
from tests.test_redis_cluster import on_cluster
from tests.test_redis_store import events, record


class LostReplies:
    """Drops the next reply read on any connection, after the server sent it."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.armed = 0
        self.dropped = 0
        read = redis.connection.Connection.read_response

        def read_response(
            connection: redis.connection.Connection, *args: object, **kwargs: object
        ) -> object:
            reply = read(connection, *args, **kwargs)
            if self.armed:
                self.armed -= 1
                self.dropped += 1
                connection.disconnect()  # type: ignore[no-untyped-call]
                raise redis.exceptions.ConnectionError("the reply was lost (injected)")
            return reply

        monkeypatch.setattr(redis.connection.Connection, "read_response", read_response)

    def drop_next(self, count: int = 1) -> None:
        self.armed = count


@pytest.fixture
def lost_replies(monkeypatch: pytest.MonkeyPatch) -> LostReplies:
    return LostReplies(monkeypatch)


@pytest.fixture(params=["cluster", "single"])
def store(request: pytest.FixtureRequest) -> Iterator[RedisStore]:
    """A store on the shared local cluster, or on a redis-server of the test's own."""
    if request.param == "cluster":
        cluster: LocalCluster = request.getfixturevalue("redis_cluster")
        store = on_cluster(cluster, timeout_s=5.0)
    else:
        server: RedisServer = request.getfixturevalue("redis_server")
        store = RedisStore(server.url, timeout_s=5.0)
    yield store
    store.close()


def stored_sequences(store: RedisStore, session_id: str) -> list[int]:
    stored = store.load(session_id)
    assert stored is not None
    return [event.sequence for event in stored.events]


def test_a_commit_whose_reply_was_lost_is_in_doubt_and_applied_once(
    store: RedisStore, lost_replies: LostReplies
) -> None:
    epoch = store.create("s", record())
    assert store.commit_many(
        [Commit(session_id="s", epoch=epoch, record=None, appends=events(1, 1))]
    ) == [None]
    lost_replies.drop_next()
    try:
        [answer] = store.commit_many(
            [Commit(session_id="s", epoch=epoch, record=None, appends=events(2, 2))]
        )
    except StoreOutcomeUnknownError as exc:  # one Redis: the whole batch is in doubt
        answer = exc
    assert lost_replies.dropped == 1
    # Applied by its one send; in doubt for the session, which fences it (not "replaced").
    assert isinstance(answer, StoreOutcomeUnknownError)
    assert stored_sequences(store, "s") == [1, 2]
    fenced = store.fence("s", epoch, "nonce-1")
    assert fenced.record.next_sequence == 3
    # The owner writes on at the fence's epoch.
    assert store.commit_many(
        [Commit(session_id="s", epoch=fenced.epoch, record=None, appends=events(3, 3))]
    ) == [None]
    assert stored_sequences(store, "s") == [1, 2, 3]


def test_a_claim_whose_reply_was_lost_is_still_its_claimants(
    store: RedisStore, lost_replies: LostReplies
) -> None:
    """The gateway tries a claim again while the store is away: a claim Redis
    applied but whose reply was lost is answered the same to the same claimant
    (else its input was answered ``input.duplicate`` and never answered)."""
    store.create("s", record())
    lost_replies.drop_next()
    with pytest.raises(StoreUnavailableError):
        store.claim_input("s", "gw-1/1", "in-1")
    assert lost_replies.dropped == 1
    assert store.claim_input("s", "gw-1/1", "in-1") is True


def test_reading_the_slot_map_again_leaves_idle_connections_open(
    redis_cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store reads the slot map again when a node did not run its calls.
    redis-py's reload closes its nodes' idle connections by default, and a
    thread taking one from its pool at that moment met a socket already gone
    (a ``TypeError`` out of its hiredis parser failed a gateway connection in
    ``demo --redis cluster-local``)."""
    store = on_cluster(redis_cluster)
    client = store._client
    assert isinstance(client, redis.RedisCluster)
    store.create("s", record())
    nodes = list(client.nodes_manager.startup_nodes.values())
    pools = [client.get_redis_connection(node).connection_pool for node in nodes]
    idle = []
    for pool in pools:
        connection = pool.get_connection()
        pool.release(connection)
        idle.append(connection)
    monkeypatch.setattr(_redis_cluster, "_reloaded_at", weakref.WeakKeyDictionary())
    _redis_cluster._reload_slot_map(client)
    assert all(connection._sock is not None for connection in idle)
    store.close()
