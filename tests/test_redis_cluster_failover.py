"""A primary of the Redis Cluster dies: what the store's clients see.

* ``durability_replicas`` K: a commit is answered only once K replicas of its
  primary acknowledged it (WAIT, same pipeline); a replica that does not
  answer makes the commits of that primary's sessions `StoreUnavailableError`
  and no other session's.
* A primary SIGKILLed while sessions stream: its replica is promoted (the
  test cluster's ``cluster-node-timeout`` is 1 s); the sessions on its slots
  answer `StoreUnavailableError` for the failover's time, then work again; the
  sessions on the other primaries never notice; with ``durability_replicas=1``
  the promoted replica holds every event a client was sent.
* Lease renewals answer per session: a node that cannot be reached makes its
  own sessions' renewals unavailable (tried again at the next sweep), and the
  other sessions' answers, refusals included, still arrive.
* Without it, a replica promoted before the last commits reached it: a client
  holding those events resumes beyond the new primary's head and is answered
  `JournalGapError` with reason ``store_lost``, never a silent rewind.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from actors._commands import LifecycleEvent
from actors._errors import (
    JournalGapError,
    SessionReplacedError,
    StoreUnavailableError,
    UnknownSessionError,
)
from actors._store import Commit
from supervisor.doors._threads import ThreadSessionRegistry
from supervisor.redis_store import RedisStore
from tests.redis_cluster_support import LocalCluster
from tests.redis_support import RedisServer
from tests.test_redis_cluster import created, on_cluster
from tests.test_redis_store import events, record
from tests.test_redis_takeover import Transport, registry

SESSIONS = 18
#: Bounds the whole failover (detection, election, clients retrying); never reached when it works.
FAILOVER_LIMIT_S = 60.0


@pytest.fixture
def own_cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    """A cluster of this test's own: the test kills one of its primaries."""
    cluster = LocalCluster(tmp_path)
    try:
        cluster.start()
        # A primary without a live replica refuses writes up front (NOREPLICAS)
        # instead of applying a commit that WAIT then reports unreplicated.
        for port in cluster.ports:
            with redis.Redis(host="127.0.0.1", port=port) as node:
                node.config_set("min-replicas-to-write", 1)
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def lossy_cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    """A cluster of this test's own, whose primaries write without their replicas."""
    cluster = LocalCluster(tmp_path)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def key_of(store: RedisStore, session_id: str) -> str:
    return f"{store.prefix}{{{session_id}}}:f"


def first_primary(cluster: LocalCluster, store: RedisStore, ids: list[str]) -> tuple[int, set[str]]:
    """The port of the primary serving ``ids[0]``, and the ids it serves."""
    primary = cluster.primary_of(key_of(store, ids[0]))
    return primary, {sid for sid in ids if cluster.primary_of(key_of(store, sid)) == primary}


def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + FAILOVER_LIMIT_S
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def replicated_events(replica: int, key: str) -> int:
    """How many events of the session whose events stream is ``key`` ``replica`` holds."""
    with redis.Redis(host="127.0.0.1", port=replica) as node:
        node.execute_command("READONLY")  # a replica answers its slots' reads, not MOVED
        return int(node.xlen(key))


def cut_replication(replica: int) -> None:
    """The replica stops hearing its primary and cannot reconnect: its link is
    killed, and its reconnections fail at AUTH (as a user its primary does not
    have: a password alone would pass, the default user taking any). A SIGSTOP
    or DEBUG SLEEP would not do: the primary's writes would wait in the
    replica's socket buffer and be applied when it runs again."""
    with redis.Redis(host="127.0.0.1", port=replica) as node:
        node.config_set("masteruser", "nobody")
        node.config_set("masterauth", "not-a-password")
        node.execute_command("CLIENT", "KILL", "TYPE", "master")

        def link_down() -> bool:
            return bool(node.info("replication").get("master_link_status") == "down")

        wait_for(link_down, "the replica still hears its primary")
        time.sleep(1.5)  # past its next reconnection (replicationCron runs every second)
        assert link_down()


def test_a_durable_commit_without_its_replica_is_unavailable(redis_server: RedisServer) -> None:
    """One redis-server has no replica: WAIT 1 never reaches 1. (Created
    without the flag: a durable create would wait for a replica too.)"""
    store = RedisStore(redis_server.url, timeout_s=0.4, durability_replicas=1)
    plain = RedisStore(redis_server.url)
    plain.create("a", record())
    with pytest.raises(StoreUnavailableError, match="replicas"):
        store.commit(Commit(session_id="a", epoch=1, record=None, appends=events(1, 1)))
    plain.commit(Commit(session_id="a", epoch=1, record=None, appends=events(2, 2)))
    store.close()
    plain.close()


def test_durable_commits_wait_for_each_primarys_replica(redis_cluster: LocalCluster) -> None:
    store = on_cluster(redis_cluster, timeout_s=0.6, durability_replicas=1)
    ids = created(store, "d")
    assert store.commit_many(
        [Commit(session_id=sid, epoch=1, record=None, appends=events(1, 1)) for sid in ids]
    ) == [None] * len(ids)
    primary, on_primary = first_primary(redis_cluster, store, ids)
    (replica,) = redis_cluster.replicas_of(primary)
    redis_cluster.pause(replica)
    try:
        outcomes = store.commit_many(
            [Commit(session_id=sid, epoch=1, record=None, appends=events(2, 2)) for sid in ids]
        )
    finally:
        redis_cluster.resume(replica)
    assert {sid for sid, o in zip(ids, outcomes, strict=True) if o is not None} == on_primary
    assert all(isinstance(o, StoreUnavailableError) for o in outcomes if o is not None)
    store.close()


def test_a_batch_across_nodes_fails_only_on_the_node_that_is_down(
    own_cluster: LocalCluster,
) -> None:
    store = on_cluster(own_cluster, timeout_s=1.0)
    ids = created(store, "b")
    victim, on_victim = first_primary(own_cluster, store, ids)
    own_cluster.kill(victim)
    outcomes = store.commit_many(
        [Commit(session_id=sid, epoch=1, record=None, appends=events(1, 1)) for sid in ids]
    )
    assert {sid for sid, o in zip(ids, outcomes, strict=True) if o is not None} <= on_victim
    # Unless the replica was promoted already (the cluster is quick, the test slow).
    assert all(isinstance(o, StoreUnavailableError) for o in outcomes if o is not None)
    store.close()


class Clients:
    """One client per session on one registry: sends, counts what failed,
    resumes a session its owner lost (a commit applied whose answer was lost
    leaves the store ahead of the owner: the next write is refused)."""

    def __init__(self, reg: ThreadSessionRegistry, ids: list[str]) -> None:
        self.reg = reg
        self.ids = ids
        self.wires = {sid: Transport() for sid in ids}
        self.errors: dict[str, int] = dict.fromkeys(ids, 0)
        self.tokens = {
            sid: reg.create(sid, send=wire.send, close=wire.close).resume_token.plaintext
            for sid, wire in self.wires.items()
        }
        self.n = 0

    def send_to_all(self) -> set[str]:
        """One event to each session; the sessions that took it."""
        took = set()
        for sid in self.ids:
            try:
                self.reg.send_event(sid, {"n": self.n})
                took.add(sid)
            except StoreUnavailableError:
                self.errors[sid] += 1
            except (SessionReplacedError, UnknownSessionError):
                self.errors[sid] += 1
                self.resume(sid)
        self.n += 1
        return took

    def resume(self, sid: str) -> None:
        wire = self.wires[sid]
        seqs = [s for s in wire.seqs() if isinstance(s, int)]
        try:
            resumed = self.reg.resume(
                sid,
                resume_token=self.tokens[sid],
                last_received_server_event_seq=max(seqs, default=0),
                send=wire.send,
                close=wire.close,
            )
        except StoreUnavailableError:
            return  # the next round tries again
        self.tokens[sid] = resumed.resume_token.plaintext
        for entry in resumed.replay_entries:
            wire.send({**dict(entry.payload), "server_event_seq": entry.sequence})


def test_a_primary_killed_while_sessions_stream_fails_over_and_loses_no_sent_event(
    own_cluster: LocalCluster,
) -> None:
    store = on_cluster(own_cluster, timeout_s=1.0, durability_replicas=1)
    ids = [f"k{n}" for n in range(SESSIONS)]
    with registry(store) as reg:
        clients = Clients(reg, ids)
        victim, on_victim = first_primary(own_cluster, store, ids)
        assert 0 < len(on_victim) < SESSIONS
        for _ in range(3):
            assert clients.send_to_all() == set(ids)
        own_cluster.kill(victim)
        deadline = time.monotonic() + FAILOVER_LIMIT_S
        # Streaming on while the cluster notices and promotes the replica.
        while not own_cluster.failed_over(key_of(store, ids[0]), victim):
            clients.send_to_all()
            assert time.monotonic() < deadline, "the replica was not promoted"
        # The promoted replica has no replica of its own: with
        # durability_replicas=1 (and min-replicas-to-write 1) its sessions stay
        # unavailable until one is back. The killed node comes back as its replica.
        clients.send_to_all()
        own_cluster.restart(victim)
        while clients.send_to_all() != set(ids):
            assert time.monotonic() < deadline, "the sessions did not work again"
        for _ in range(3):
            assert clients.send_to_all() == set(ids)
    # Only the sessions on the killed primary noticed.
    assert {sid for sid, count in clients.errors.items() if count} <= on_victim
    assert any(clients.errors[sid] for sid in on_victim)
    # Every event a client was sent is in the store (on the promoted replica).
    for sid in ids:
        stored = store.load(sid)
        assert stored is not None
        in_store = {e.sequence: json.loads(e.encoded) for e in stored.events}
        for frame in clients.wires[sid].frames:
            if "server_event_seq" in frame:
                assert in_store[frame["server_event_seq"]]["n"] == frame["n"]  # type: ignore[index]
    store.close()


def test_a_replica_promoted_without_the_last_commits_answers_store_lost(
    lossy_cluster: LocalCluster,
) -> None:
    first = on_cluster(lossy_cluster, timeout_s=1.0)  # no durability_replicas
    sid = "lost"
    primary = lossy_cluster.primary_of(key_of(first, sid))
    (replica,) = lossy_cluster.replicas_of(primary)
    events_key = f"{first.prefix}{{{sid}}}:e"
    wire = Transport()
    with registry(first) as a:
        token = a.create(sid, send=wire.send, close=wire.close).resume_token.plaintext
        for n in range(3):
            a.send_event(sid, {"n": n})
        wait_for(lambda: replicated_events(replica, events_key) == 3, "3 events replicated")
        cut_replication(replica)
        for n in range(3, 5):
            a.send_event(sid, {"n": n})  # committed on the primary alone
        assert wire.seqs() == [1, 2, 3, 4, 5]
    first.close()
    lossy_cluster.kill(primary)
    with redis.Redis(host="127.0.0.1", port=replica) as node:
        node.execute_command("CLUSTER", "FAILOVER", "TAKEOVER")
    wait_for(lambda: lossy_cluster.failed_over(key_of(first, sid), primary), "no promotion")
    second = RedisStore(lossy_cluster.url, prefix=first.prefix, timeout_s=1.0)
    with registry(second) as b:
        with pytest.raises(JournalGapError) as raised:
            b.resume(
                sid,
                resume_token=token,
                last_received_server_event_seq=5,
                send=wire.send,
                close=wire.close,
            )
        gap = raised.value
        assert (gap.reason, gap.requested, gap.first_retained, gap.head) == ("store_lost", 5, 1, 3)
        # The client may resume from its own last sequence: the session skips
        # the lost sequences and never issues 4 or 5 again.
        resumed = b.resume(
            sid,
            resume_token=token,
            last_received_server_event_seq=5,
            send=wire.send,
            close=wire.close,
        )
        assert resumed.replay_entries == ()
        b.send_event(sid, {"n": "after"})
        assert wire.seqs() == [1, 2, 3, 4, 5, 6]
    stored = second.load(sid)
    assert stored is not None
    assert [event.sequence for event in stored.events] == [6]
    assert (stored.record.next_sequence, stored.record.dropped_through) == (7, 5)
    second.close()


def unreachable(cluster: LocalCluster, primary: int) -> Callable[[], None]:
    """SIGKILL a primary and its replica (so no failover ends the outage); the
    function that starts both again (from their append-only files). Not SIGSTOP:
    redis-py sends each command of a stopped node again alone, each waiting out
    its timeouts and retries (minutes for a few sessions)."""
    (replica,) = cluster.replicas_of(primary)
    cluster.kill(replica)
    cluster.kill(primary)

    def back() -> None:
        cluster.restart(primary)
        cluster.restart(replica)

    return back


def test_renewals_are_unavailable_only_for_the_sessions_of_a_node_that_is_down(
    own_cluster: LocalCluster,
) -> None:
    store = on_cluster(own_cluster, timeout_s=1.0)
    ids = created(store, "l")
    victim, on_victim = first_primary(own_cluster, store, ids)
    healthy = next(sid for sid in ids if sid not in on_victim)
    back = unreachable(own_cluster, victim)
    try:
        renewed = store.renew_many([(sid, 1) for sid in ids] + [(healthy, 7)])
        # A script no node ran yet (a takeover's) works on a healthy primary too.
        assert store.acquire(healthy, record().token_digest) is not None
    finally:
        back()
    for sid, answer in zip(ids, renewed, strict=False):
        if sid in on_victim:
            assert isinstance(answer, StoreUnavailableError), (sid, answer)
        else:
            assert answer is True, (sid, answer)
    assert renewed[-1] is False  # another epoch's: refused, even now
    store.close()


def test_a_sweep_lets_go_of_a_session_taken_over_while_another_primary_is_down(
    own_cluster: LocalCluster,
) -> None:
    """The sweep's renewals answer per session: a takeover on a healthy primary
    is noticed (``replaced``) while another primary cannot be reached, and the
    sessions of that primary are kept, their renewals tried again."""
    # A lease that outlasts the outage: the sessions of the node that is down
    # must still be this registry's once it is back.
    first = RedisStore(own_cluster.url, prefix="sweep:", timeout_s=1.0, lease_s=120)
    second = RedisStore(own_cluster.url, prefix="sweep:", timeout_s=1.0)
    ids = [f"w{n}" for n in range(12)]
    victim, on_victim = first_primary(own_cluster, first, ids)
    moved = next(sid for sid in ids if sid not in on_victim)
    heard: list[LifecycleEvent] = []
    with (
        registry(first, sweep_interval_s=0.1, passivate_after_s=0, observer=heard.append) as a,
        registry(second) as b,
    ):
        tokens = {}
        for sid in ids:
            wire = Transport()
            created_session = a.create(sid, send=wire.send, close=wire.close)
            tokens[sid] = created_session.resume_token.plaintext
            a.send_event(sid, {"n": 0})
            a.detach(sid, attachment_generation=created_session.attachment_generation)
        wait_for(lambda: a.stats().parked == len(ids), "every session parked")
        back = unreachable(own_cluster, victim)
        try:
            b.resume(
                moved,
                resume_token=tokens[moved],
                last_received_server_event_seq=1,
                send=Transport().send,
                close=Transport().close,
            )

            def noticed() -> bool:
                return any(e.kind == "replaced" and e.session_id == moved for e in list(heard))

            wait_for(noticed, "the old owner never let go during the outage")
        finally:
            back()
        # The sessions of the primary that was down are still this registry's.
        replaced = {e.session_id for e in list(heard) if e.kind == "replaced"}
        assert replaced == {moved}
        for sid in on_victim:
            deadline = time.monotonic() + FAILOVER_LIMIT_S
            while True:
                try:
                    a.send_event(sid, {"n": 1})
                    break
                except StoreUnavailableError:
                    assert time.monotonic() < deadline, "the primary did not come back"
                    time.sleep(0.1)
    first.close()
    second.close()
