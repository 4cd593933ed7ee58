"""The engine bus on a Redis Cluster whose pool's primary dies (a cluster of the
test's own: 3 primaries, 3 replicas, ``cluster-node-timeout`` 1 s).

All of a pool's keys are on one slot, so one primary serves the pool: while it
fails over every call of the bus answers `StoreUnavailableError` (the gateway
and the workers call again), and after the promotion the bus works on what
the replica held: pending entries (redelivered and answered once), the
idempotency keys, the lease generations (a late or older message still
fenced). The bus waits for no replica: what the primary acknowledged and its
replica had not received when it died is lost (here an input).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import pytest
import redis

from actors._errors import StoreUnavailableError
from supervisor.engine_bus import Delivery, RedisEngineBus
from supervisor.messages import EngineEvents, InputMessage
from tests.redis_cluster_support import LocalCluster
from tests.test_redis_cluster_failover import (  # noqa: F401 - lossy_cluster: a fixture
    FAILOVER_LIMIT_S,
    cut_replication,
    lossy_cluster,
    wait_for,
)

T = TypeVar("T")

POOL = "fo"
#: Any key of the pool: they all share its hash tag.
POOL_KEY = f"duplex:bus:{{{POOL}}}:in"
VISIBILITY_S = 0.05


def own_cluster(request: pytest.FixtureRequest) -> LocalCluster:
    """A cluster of the test's own (its pool's primary is killed), whose
    primaries write without their replicas."""
    cluster: LocalCluster = request.getfixturevalue("lossy_cluster")
    return cluster


def retried(call: Callable[..., T], *args: object, until: Callable[[T], bool] = bool) -> T:
    """``call(*args)`` again while the bus is unavailable (the failover) or
    its answer does not satisfy ``until``, as a worker's loop would."""
    deadline = time.monotonic() + FAILOVER_LIMIT_S
    while True:
        assert time.monotonic() < deadline, f"{call} never answered"
        try:
            answer = call(*args)
        except StoreUnavailableError:
            time.sleep(0.05)
            continue
        if until(answer):
            return answer
        time.sleep(0.01)


def caught_up(primary: int, replica: int) -> bool:
    """The replica has applied every write its primary has."""
    with redis.Redis(host="127.0.0.1", port=primary) as node:
        head = int(node.info("replication")["master_repl_offset"])
    with redis.Redis(host="127.0.0.1", port=replica) as node:
        return int(node.info("replication").get("slave_repl_offset", -1)) >= head


def fail_over(cluster: LocalCluster, primary: int, replica: int) -> None:
    cluster.kill(primary)
    with redis.Redis(host="127.0.0.1", port=replica) as node:
        node.execute_command("CLUSTER", "FAILOVER", "TAKEOVER")
    wait_for(lambda: cluster.failed_over(POOL_KEY, primary), "the replica was not promoted")


def _input(generation: int, key: str) -> InputMessage:
    return InputMessage(session_id="s1", lease_generation=generation, client_event_id=key, text="x")


def _events(generation: int, key: str) -> EngineEvents:
    return EngineEvents(
        session_id="s1", lease_generation=generation, message_id=key, payloads=({"k": key},)
    )


def test_after_a_failover_a_held_input_is_answered_once_and_fencing_holds(
    request: pytest.FixtureRequest,
) -> None:
    cluster = own_cluster(request)
    bus = RedisEngineBus(cluster.url, pool=POOL, visibility_s=VISIBILITY_S, timeout_s=1.0)
    primary = cluster.primary_of(POOL_KEY)
    (replica,) = cluster.replicas_of(primary)
    generation = bus.claim_session("s1", "gw")
    bus.submit(_input(generation, "c1"))
    [held] = bus.receive("dead", block_s=0.5)
    # Answered, not acknowledged: the worker dies with the primary.
    assert bus.publish("dead", held.entry_id, _events(generation, "c1:0")) == "sent"
    bus.submit(_input(generation, "c2"))
    wait_for(lambda: caught_up(primary, replica), "the replica did not catch up")
    fail_over(cluster, primary, replica)

    again: list[Delivery] = retried(bus.receive, "alive")
    assert [(d.entry_id, d.redelivered) for d in again] == [(held.entry_id, True)]
    assert bus.publish("alive", held.entry_id, _events(generation, "c1:0")) == "duplicate"
    assert bus.publish("dead", held.entry_id, _events(generation, "late")) == "stale"
    assert bus.acknowledge("alive", [held.entry_id]) == 1
    [second] = retried(bus.receive, "alive")
    assert second.message == _input(generation, "c2") and not second.redelivered
    taken = bus.claim_session("s1", "gw-b")  # the lease generation survived
    assert taken == generation + 1
    assert bus.publish("alive", second.entry_id, _events(generation, "c2:0")) == "fenced"
    assert bus.publish("alive", second.entry_id, _events(taken, "c2:0")) == "sent"
    assert [m.message_id for _, m in bus.read_events("gw", "0-0", block_s=0.05)] == ["c1:0"]
    assert [m.message_id for _, m in bus.read_events("gw-b", "0-0", block_s=0.1)] == ["c2:0"]
    assert bus.counts() == {"redelivered": 1, "fenced": 2, "duplicates": 1}
    bus.close()


def test_an_input_its_replica_never_received_is_lost_in_a_failover(
    request: pytest.FixtureRequest,
) -> None:
    cluster = own_cluster(request)
    """What the bus does not promise: it waits for no replica (unlike the
    store with ``durability_replicas``)."""
    bus = RedisEngineBus(cluster.url, pool=POOL, visibility_s=VISIBILITY_S, timeout_s=1.0)
    primary = cluster.primary_of(POOL_KEY)
    (replica,) = cluster.replicas_of(primary)
    generation = bus.claim_session("s1", "gw")
    bus.submit(_input(generation, "c1"))
    wait_for(lambda: caught_up(primary, replica), "the replica did not catch up")
    cut_replication(replica)
    bus.submit(_input(generation, "c2"))  # acknowledged by the primary alone
    fail_over(cluster, primary, replica)
    retried(bus.submit, _input(generation, "c3"))
    # Both were on the stream before this read: one read takes them in order.
    delivered = retried(bus.receive, "w")
    keys = [d.message.client_event_id for d in delivered]  # type: ignore[union-attr]
    assert keys == ["c1", "c3"]
    bus.close()
