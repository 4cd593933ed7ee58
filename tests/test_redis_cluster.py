"""The Redis store on a real local Redis Cluster (3 primaries, 3 replicas; the
``redis_cluster`` fixture, tests/redis_cluster_support.py): sessions on many
slots, scripts each on its session's slot, pipelines (commits, renewals) that
span every primary in one call, a registry's committer batching across nodes.

The takeover tests (two registries on one store) run on the cluster too: the
``cluster`` parameter of tests/test_redis_takeover.py.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Sequence

import pytest
import redis
import trio

from actors._errors import SessionReplacedError, StoreUnavailableError
from actors._store import Commit
from supervisor.engine_bus import RedisEngineBus
from supervisor.redis_store import RedisStore
from supervisor.stores._redis_cluster import where
from supervisor.testing import Wire
from tests.redis_cluster_support import LocalCluster
from tests.test_redis_committer import committer_of, registry_on
from tests.test_redis_store import events, record

SESSIONS = 30
LIMIT = 60.0


def on_cluster(
    cluster: LocalCluster, *, timeout_s: float = 10.0, durability_replicas: int = 0
) -> RedisStore:
    """A store on ``cluster`` under a prefix of its own (tests share a cluster)."""
    return RedisStore(
        cluster.url,
        prefix=f"t{uuid.uuid4().hex[:8]}:",
        timeout_s=timeout_s,
        durability_replicas=durability_replicas,
    )


def created(store: RedisStore, name: str) -> list[str]:
    """`SESSIONS` sessions created in ``store``: ``<name>0``, ``<name>1``, ..."""
    ids = [f"{name}{n}" for n in range(SESSIONS)]
    for sid in ids:
        store.create(sid, record())
    return ids


def primaries_of(cluster: LocalCluster, store: RedisStore, session_ids: Sequence[str]) -> set[int]:
    return {cluster.primary_of(f"{store.prefix}{{{sid}}}:f") for sid in session_ids}


def test_a_cluster_url_names_its_nodes_and_never_its_password() -> None:
    url = "redis+cluster://user:secret@10.0.0.1:7000,10.0.0.2:7001/0"
    assert where(url) == "cluster 10.0.0.1:7000,10.0.0.2:7001"
    for bad in (
        "redis+cluster://10.0.0.1:7000/1",  # a cluster has database 0 only
        "redis+cluster://10.0.0.1",  # no port
        "redis+cluster://10.0.0.1:7000?db=0",
    ):
        with pytest.raises(ValueError, match=r"(?i)cluster"):
            RedisStore(bad)


def test_an_unreachable_cluster_is_store_unavailable_without_its_password() -> None:
    with pytest.raises(StoreUnavailableError) as caught:
        RedisStore("redis+cluster://user:secret@127.0.0.1:1", timeout_s=0.5)
    assert "secret" not in str(caught.value)
    assert "127.0.0.1:1" in str(caught.value)


def test_the_engine_bus_takes_the_stores_cluster_urls(redis_cluster: LocalCluster) -> None:
    """The same URL forms as the store (the bus's own tests run on the cluster:
    tests/test_engine_bus.py), the same refusals, never the password."""
    bus = RedisEngineBus(redis_cluster.url, pool=f"u{uuid.uuid4().hex[:8]}")
    assert bus.where == where(redis_cluster.url)
    assert bus.claim_session("s1", "gw") == 1
    bus.close()
    with pytest.raises(ValueError, match=r"(?i)cluster"):
        RedisEngineBus("redis+cluster://10.0.0.1:7000/1")
    with pytest.raises(StoreUnavailableError) as caught:
        RedisEngineBus("redis+cluster://user:secret@127.0.0.1:1", timeout_s=0.5)
    assert "secret" not in str(caught.value)
    assert "127.0.0.1:1" in str(caught.value)


def test_sessions_on_every_primary_commit_in_one_pipelined_call(
    redis_cluster: LocalCluster,
) -> None:
    store = on_cluster(redis_cluster)
    ids = created(store, "s")
    assert len(primaries_of(redis_cluster, store, ids)) == 3
    commits = [Commit(session_id=sid, epoch=1, record=None, appends=events(1, 2)) for sid in ids]
    commits[7] = Commit(session_id=ids[7], epoch=2, record=None, appends=events(1, 2))
    outcomes = store.commit_many(commits)
    assert [type(o) for o in outcomes] == [
        SessionReplacedError if n == 7 else type(None) for n in range(SESSIONS)
    ]
    # A second batch on every node, after the first: each session's top grows
    # (the refused one's from where it was: an append never leaves a hole).
    following = [events(1, 1) if n == 7 else events(3, 3) for n in range(SESSIONS)]
    assert (
        store.commit_many(
            [
                Commit(session_id=sid, epoch=1, record=None, appends=appends)
                for sid, appends in zip(ids, following, strict=True)
            ]
        )
        == [None] * SESSIONS
    )
    for n, sid in enumerate(ids):
        stored = store.load(sid)
        assert stored is not None
        assert [e.sequence for e in stored.events] == ([1] if n == 7 else [1, 2, 3])
        assert stored.events[-1].encoded == following[n][0].encoded
    # A takeover's acquire (one script, three keys of one slot) on each node.
    for sid in ids[:6]:
        taken = store.acquire(sid, record().token_digest)
        assert taken is not None
        assert taken.epoch == 2
        assert [e.sequence for e in taken.events] == [1, 2, 3]
    store.close()


def test_renew_many_renews_leases_on_every_node(redis_cluster: LocalCluster) -> None:
    store = on_cluster(redis_cluster)
    ids = created(store, "r")
    assert len(primaries_of(redis_cluster, store, ids)) == 3
    leases = [(sid, 1) for sid in ids] + [(ids[0], 5), ("nobody", 1)]
    assert store.renew_many(leases) == [True] * SESSIONS + [False, False]
    store.close()


def test_a_primary_that_lost_the_scripts_gets_them_again(redis_cluster: LocalCluster) -> None:
    """A promoted replica may not hold the scripts its old primary had."""
    store = on_cluster(redis_cluster)
    ids = created(store, "f")
    for port in redis_cluster.ports:
        with redis.Redis(host="127.0.0.1", port=port) as node:
            node.script_flush()
    commits = [Commit(session_id=sid, epoch=1, record=None, appends=events(1, 1)) for sid in ids]
    assert store.commit_many(commits) == [None] * SESSIONS
    assert store.renew_many([(sid, 1) for sid in ids]) == [True] * SESSIONS
    store.close()


def test_a_node_the_script_broadcast_missed_still_runs_every_call(
    redis_cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """During a failover the client's map of primaries can be stale, so loading
    a script on "every primary" misses the promoted replica that then answers
    NOSCRIPT (seen in ``demo --redis cluster-local``: an input's claim raised
    NoScriptError and the input was never answered). Each call must still run,
    whichever node serves its slot."""
    store = on_cluster(redis_cluster)
    ids = created(store, "m")
    for port in redis_cluster.ports:
        with redis.Redis(host="127.0.0.1", port=port) as node:
            node.script_flush()
    # The client's stale map: no primary to load a script on.
    monkeypatch.setattr(store._client, "get_primaries", lambda: [])
    assert [store.claim_input(sid, "gw-1", "in-1") for sid in ids] == [True] * SESSIONS
    for sid in ids:
        store.record_client_seq(sid, 1)
    commits = [Commit(session_id=sid, epoch=1, record=None, appends=events(1, 1)) for sid in ids]
    assert store.commit_many(commits) == [None] * SESSIONS
    assert store.renew_many([(sid, 1) for sid in ids]) == [True] * SESSIONS
    assert [store.client_watermark(sid).last_client_seq for sid in ids] == [1] * SESSIONS
    store.close()


class BatchRecordingStore(RedisStore):
    """Records, for each `commit_many`, the primaries its commits went to."""

    nodes_per_batch: list[set[str]]

    def commit_many(self, commits: Sequence[Commit]) -> list[BaseException | None]:
        client = self._client
        assert isinstance(client, redis.RedisCluster)
        keys = [self._keys(c.session_id)[0] for c in commits]
        nodes = {client.get_node_from_key(key).name for key in keys}  # type: ignore[no-untyped-call]
        self.nodes_per_batch.append(nodes)
        return super().commit_many(commits)


async def test_the_committers_batches_span_nodes_and_keep_each_sessions_order(
    redis_cluster: LocalCluster,
) -> None:
    store = BatchRecordingStore(redis_cluster.url, prefix=f"t{uuid.uuid4().hex[:8]}:")
    store.nodes_per_batch = []
    rounds = 6
    with trio.fail_after(LIMIT):
        async with registry_on(store) as reg:
            wires: dict[str, Wire] = {}
            for n in range(SESSIONS):
                wires[f"c{n}"] = wire = Wire()
                await reg.create(f"c{n}", send=wire.send, close=wire.close)
            for n in range(rounds):
                for sid in wires:
                    reg.send_event_nowait(sid, {"n": n})
            for sid in wires:
                await reg.send_event(sid, {"n": rounds})
            committer = committer_of(reg)
            assert committer.batches < committer.commits
    assert max(len(nodes) for nodes in store.nodes_per_batch) == 3
    expected = [{"n": n} for n in range(rounds + 1)]
    for sid, wire in wires.items():
        assert [{"n": f["n"]} for f in wire.frames] == expected
        stored = store.load(sid)
        assert stored is not None
        assert [json.loads(e.encoded)["n"] for e in stored.events] == list(range(rounds + 1))
    store.close()


def open_sockets(client: object) -> Callable[[], int]:
    """How many connections of ``client``'s nodes' pools are open, when called."""
    assert isinstance(client, redis.RedisCluster)
    nodes = client.get_nodes()  # type: ignore[no-untyped-call]
    pools = [node.redis_connection.connection_pool for node in nodes if node.redis_connection]
    return lambda: sum(c._sock is not None for pool in pools for c in pool._connections)


def test_a_closed_store_leaves_no_connection_to_any_node_open(redis_cluster: LocalCluster) -> None:
    """redis-py's cluster ``close`` leaves each node's pool connected (a pool
    given to a node's client is not closed with it)."""
    store = on_cluster(redis_cluster)
    ids = created(store, "c")
    store.commit_many(
        [Commit(session_id=sid, epoch=1, record=None, appends=events(1, 1)) for sid in ids]
    )
    counted = open_sockets(store._client)
    assert counted() > 0
    store.close()
    assert counted() == 0


def test_a_closed_engine_bus_leaves_no_connection_to_any_node_open(
    redis_cluster: LocalCluster,
) -> None:
    bus = RedisEngineBus(redis_cluster.url, prefix=f"t{uuid.uuid4().hex[:8]}:")
    assert bus.claim_session("s", "gw-1") == 1
    counted = open_sockets(bus._client)
    assert counted() > 0
    bus.close()
    assert counted() == 0
