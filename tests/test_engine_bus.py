"""The engine bus on a real redis-server and on the real local Redis Cluster
(3 primaries, 3 replicas: the ``bus`` fixture runs each test on both):
delivery, redelivery, dedupe, fencing."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator

import pytest
import trio

from supervisor.engine_bus import Delivery, LeaseFence, RedisEngineBus
from supervisor.messages import EngineClose, EngineEvents, InputMessage, SessionNotice
from tests.redis_cluster_support import LocalCluster
from tests.redis_support import RedisServer

#: Short, so that a test waits a fraction of a second for a claim.
VISIBILITY_S = 0.05


#: A visibility timeout a stalled test process does not outlive between two calls.
LONG_VISIBILITY_S = 0.5


def _place(request: pytest.FixtureRequest) -> tuple[str, str]:
    """A redis-server of the test's own, or the shared cluster under a pool
    of its own (tests share the cluster): the URL and the pool."""
    if request.param == "cluster":
        cluster: LocalCluster = request.getfixturevalue("redis_cluster")
        return cluster.url, f"p-{uuid.uuid4().hex[:8]}"
    server: RedisServer = request.getfixturevalue("redis_server")
    return server.url, "p"


@pytest.fixture(params=["redis", "cluster"])
def bus(request: pytest.FixtureRequest) -> Iterator[RedisEngineBus]:
    """A bus whose entries are claimable by another worker after `VISIBILITY_S`."""
    url, pool = _place(request)
    bus = RedisEngineBus(url, pool=pool, visibility_s=VISIBILITY_S)
    yield bus
    bus.close()


@pytest.fixture(params=["redis", "cluster"])
def slow_bus(request: pytest.FixtureRequest) -> Iterator[RedisEngineBus]:
    """`bus` with `LONG_VISIBILITY_S`: for a test that must not lose an entry
    to a stall of its own process (a loaded machine stalls one for 50 ms)."""
    url, pool = _place(request)
    bus = RedisEngineBus(url, pool=pool, visibility_s=LONG_VISIBILITY_S)
    yield bus
    bus.close()


def _events(session_id: str, generation: int, key: str) -> EngineEvents:
    return EngineEvents(
        session_id=session_id,
        lease_generation=generation,
        message_id=key,
        payloads=({"type": "response.done", "client_event_id": key},),
    )


def _receive_until(bus: RedisEngineBus, consumer: str) -> list[Delivery]:
    """Deliveries for ``consumer``, polling while the visibility timeout runs."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        found = bus.receive(consumer, block_s=0.05)
        if found:
            return found
    raise AssertionError(f"nothing reached {consumer}")


def test_an_input_reaches_one_worker_and_its_answer_the_owning_gateway(
    bus: RedisEngineBus,
) -> None:
    generation = bus.claim_session("s1", "gw-a")
    bus.claim_session("s2", "gw-b")
    bus.submit(
        InputMessage(session_id="s1", lease_generation=generation, client_event_id="c1", text="hi")
    )
    [delivery] = bus.receive("w1", block_s=0.5)
    assert delivery.message == InputMessage(
        session_id="s1", lease_generation=generation, client_event_id="c1", text="hi"
    )
    assert not delivery.redelivered
    assert bus.receive("w2", block_s=0.05) == []  # a group: one worker has it
    assert bus.publish("w1", delivery.entry_id, _events("s1", generation, "k1")) == "sent"
    assert bus.acknowledge("w1", [delivery.entry_id]) == 1
    [(_entry, message)] = bus.read_events("gw-a", "0-0", block_s=0.1)
    assert message == _events("s1", generation, "k1")
    assert bus.read_events("gw-b", "0-0", block_s=0.05) == []


def test_a_dead_workers_input_is_claimed_by_another_and_journaled_once(
    bus: RedisEngineBus,
) -> None:
    generation = bus.claim_session("s1", "gw")
    bus.submit(
        InputMessage(session_id="s1", lease_generation=generation, client_event_id="c1", text="hi")
    )
    [first] = bus.receive("dead", block_s=0.5)
    # The dead worker answered but died before acknowledging.
    assert bus.publish("dead", first.entry_id, _events("s1", generation, "c1:0")) == "sent"
    [again] = _receive_until(bus, "alive")
    assert again.redelivered and again.entry_id == first.entry_id
    assert bus.publish("alive", again.entry_id, _events("s1", generation, "c1:0")) == "duplicate"
    assert bus.acknowledge("alive", [again.entry_id]) == 1
    assert len(bus.read_events("gw", "0-0", block_s=0.1)) == 1
    assert bus.counts() == {"redelivered": 1, "fenced": 0, "duplicates": 1}


def test_a_late_worker_can_neither_publish_nor_acknowledge_what_was_claimed_from_it(
    bus: RedisEngineBus,
) -> None:
    generation = bus.claim_session("s1", "gw")
    bus.submit(SessionNotice(session_id="s1", lease_generation=generation, kind="open"))
    [first] = bus.receive("stopped", block_s=0.5)
    [again] = _receive_until(bus, "alive")
    assert bus.heartbeat("stopped", [first.entry_id]) == 0  # no stealing it back
    assert bus.publish("stopped", first.entry_id, _events("s1", generation, "late")) == "stale"
    assert bus.acknowledge("stopped", [first.entry_id]) == 0
    assert bus.heartbeat("alive", [again.entry_id]) == 1
    assert bus.publish("alive", again.entry_id, _events("s1", generation, "new")) == "sent"
    [(_entry, message)] = bus.read_events("gw", "0-0", block_s=0.1)
    assert message.message_id == "new"
    assert bus.counts()["fenced"] == 1


def test_a_heartbeat_keeps_a_live_workers_entry_its_own(slow_bus: RedisEngineBus) -> None:
    # Held for twice the visibility timeout, by heartbeats at half of it (Redis's
    # own clock: nothing here can move it).
    bus = slow_bus
    generation = bus.claim_session("s1", "gw")
    bus.submit(SessionNotice(session_id="s1", lease_generation=generation, kind="open"))
    [held] = bus.receive("busy", block_s=0.5)
    for _ in range(4):
        time.sleep(LONG_VISIBILITY_S / 2)
        assert bus.heartbeat("busy", [held.entry_id]) == 1
        assert bus.receive("idle", block_s=0.001) == []


def test_a_message_from_an_older_lease_generation_is_fenced(bus: RedisEngineBus) -> None:
    old = bus.claim_session("s1", "gw-a")
    bus.submit(InputMessage(session_id="s1", lease_generation=old, client_event_id="c1", text="x"))
    [delivery] = bus.receive("w", block_s=0.5)
    new = bus.claim_session("s1", "gw-b")  # taken over by another gateway process
    assert new == old + 1
    assert bus.publish("w", delivery.entry_id, _events("s1", old, "k")) == "fenced"
    assert bus.publish("w", delivery.entry_id, _events("s1", new, "k")) == "sent"
    assert bus.read_events("gw-a", "0-0", block_s=0.05) == []
    [(_entry, message)] = bus.read_events("gw-b", "0-0", block_s=0.1)  # the new owner's stream
    assert message.lease_generation == new
    assert bus.counts()["fenced"] == 1


def test_a_released_session_takes_no_more_engine_messages(bus: RedisEngineBus) -> None:
    generation = bus.claim_session("s1", "gw")
    bus.submit(SessionNotice(session_id="s1", lease_generation=generation, kind="open"))
    [delivery] = bus.receive("w", block_s=0.5)
    assert not bus.release_session("s1", "other-gw")
    assert bus.release_session("s1", "gw")
    close = EngineClose(session_id="s1", lease_generation=generation, message_id="c", reason="r")
    assert bus.publish("w", delivery.entry_id, close) == "orphaned"
    assert bus.read_events("gw", "0-0", block_s=0.05) == []


def test_the_gateways_fence_refuses_and_counts_older_generations() -> None:
    fence = LeaseFence()
    assert not fence.admit(_events("s1", 1, "k"))  # not held here
    fence.hold("s1", 2)
    fence.hold("s1", 1)  # generations only move forward
    assert fence.generation("s1") == 2
    assert not fence.admit(_events("s1", 1, "k"))
    assert fence.admit(_events("s1", 2, "k"))
    assert fence.admit(_events("s1", 3, "k"))
    fence.drop("s1")
    assert not fence.admit(_events("s1", 2, "k"))
    assert fence.fenced == 3


def test_a_restarted_redis_keeps_pending_inputs_and_the_seen_keys(
    redis_server: RedisServer,
) -> None:
    bus = RedisEngineBus(redis_server.url, pool="p", visibility_s=VISIBILITY_S)
    generation = bus.claim_session("s1", "gw")
    bus.submit(
        InputMessage(session_id="s1", lease_generation=generation, client_event_id="c1", text="x")
    )
    [first] = bus.receive("dead", block_s=0.5)
    assert bus.publish("dead", first.entry_id, _events("s1", generation, "c1:0")) == "sent"
    redis_server.restart()
    [again] = _receive_until_reachable(bus, "alive")
    assert again.entry_id == first.entry_id
    assert bus.publish("alive", again.entry_id, _events("s1", generation, "c1:0")) == "duplicate"
    assert len(bus.read_events("gw", "0-0", block_s=0.1)) == 1
    bus.close()


def _receive_until_reachable(bus: RedisEngineBus, consumer: str) -> list[Delivery]:
    from actors._errors import StoreUnavailableError

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            found = bus.receive(consumer, block_s=0.05)
        except StoreUnavailableError:
            time.sleep(0.05)
            continue
        if found:
            return found
    raise AssertionError(f"nothing reached {consumer}")


def test_a_workers_batch_is_what_one_read_takes(redis_server: RedisServer) -> None:
    from supervisor.gateway._engine import EngineSession
    from supervisor.worker import EngineWorker

    class Idle:
        async def start(self, session: EngineSession) -> None:
            return

        async def answer(self, session: EngineSession, client_event_id: str, text: str) -> None:
            return

        def stop(self, session_id: str) -> None:
            return

    asked: list[int] = []

    class OneReadIsEnoughError(Exception):
        pass

    class CountingBus(RedisEngineBus):
        def receive(
            self, consumer: str, *, count: int = 16, block_s: float = 1.0
        ) -> list[Delivery]:
            asked.append(count)
            raise OneReadIsEnoughError

    bus = CountingBus(redis_server.url, pool="p")
    worker = EngineWorker(Idle(), bus, batch=3)
    with pytest.raises(ExceptionGroup) as raised:
        trio.run(worker.run)
    assert raised.group_contains(OneReadIsEnoughError)
    bus.close()
    assert asked == [3]


def test_what_a_gateway_sent_before_any_worker_started_reaches_the_first_one(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    from supervisor.gateway._bus_engine import BusEngine

    bus = RedisEngineBus(redis_server.url, pool="late", visibility_s=VISIBILITY_S)
    with caplog.at_level(logging.WARNING, logger="duplex_supervisor.gateway"):
        early = BusEngine(bus)
    # Its client event types are unknown: said, since it refuses them until restarted.
    assert "no engine worker of this pool has started" in caplog.text
    assert early.client_event_types == {"response.cancel"}
    generation = bus.claim_session("s1", "gw")
    notice = SessionNotice(session_id="s1", lease_generation=generation, kind="open")
    bus.submit(notice)
    bus.declare_event_types({"input_audio.append"})
    [delivery] = bus.receive("w1", block_s=0.5)  # the group starts at the stream's first entry
    assert delivery.message == notice
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="duplex_supervisor.gateway"):
        later = BusEngine(bus)
    assert caplog.text == ""
    assert later.client_event_types == {"input_audio.append", "response.cancel"}
    bus.close()


def test_a_publish_follows_a_session_that_moved_to_another_gateway(bus: RedisEngineBus) -> None:
    """The script writes only the stream it declared (the owner it guessed):
    a session taken over since, its message goes to the new owner's stream."""
    first = bus.claim_session("s1", "gw-a")
    bus.submit(InputMessage(session_id="s1", lease_generation=first, client_event_id="c", text="x"))
    [delivery] = bus.receive("w", block_s=0.5)
    assert bus.publish("w", delivery.entry_id, _events("s1", first, "k1")) == "sent"
    second = bus.claim_session("s1", "gw-b")  # this bus still guesses gw-a
    assert bus.publish("w", delivery.entry_id, _events("s1", second, "k2")) == "sent"
    [(_entry, old)] = bus.read_events("gw-a", "0-0", block_s=0.05)
    [(_entry, new)] = bus.read_events("gw-b", "0-0", block_s=0.1)
    assert (old.message_id, new.message_id) == ("k1", "k2")
    assert bus.counts() == {"redelivered": 0, "fenced": 0, "duplicates": 0}


def test_a_pool_whose_keys_would_span_slots_is_refused() -> None:
    """An empty pool makes an empty hash tag, which Redis ignores: each key
    would hash whole, to slots of its own (refused before connecting)."""
    with pytest.raises(ValueError, match="one hash tag"):
        RedisEngineBus("redis://127.0.0.1:1/0", pool="")
