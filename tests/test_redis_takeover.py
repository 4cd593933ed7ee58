"""One owner at a time: registries with separate session systems sharing one
store, as separate processes share one Redis (these run in one process; the
process-kill tests are in test_redis_faults.py).

A resume on a registry that does not hold the session takes it over from the
store: it proves the token against the stored digest, acquires a new epoch,
replays from the store and carries on; the old owner's next write is refused
and it closes its transport with ``replaced``.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Sequence

import pytest
import trio

from actors._commands import LifecycleEvent
from actors._credential import ResumeToken
from actors._errors import (
    InvalidResumeTokenError,
    SessionReplacedError,
    StoreUnavailableError,
    UnknownSessionError,
)
from actors._store import Commit, SessionStore
from supervisor import open_session_registry
from supervisor.doors._threads import ThreadSessionRegistry
from supervisor.gateway import EngineSession
from supervisor.gateway._sessions import EngineWork
from supervisor.redis_store import RedisStore
from supervisor.stores._memory import MemoryStore
from supervisor.testing import FakeClock
from tests.redis_cluster_support import LocalCluster
from tests.redis_support import RedisServer

WAIT = 10.0


class Transport:
    def __init__(self) -> None:
        self.frames: list[dict[str, object]] = []
        self.closed: list[str] = []
        self._closed = threading.Event()

    def send(self, frame: dict[str, object]) -> None:
        self.frames.append(frame)

    def close(self, reason: str) -> None:
        self.closed.append(reason)
        self._closed.set()

    def wait_closed(self) -> list[str]:
        """The close reasons, once ``close`` ran (it runs on the door's loop)."""
        self._closed.wait(WAIT)
        return self.closed

    def seqs(self) -> list[object]:
        return [frame.get("server_event_seq") for frame in self.frames]


def registry(store: SessionStore, **options: object) -> ThreadSessionRegistry:
    values: dict[str, object] = {
        "replay_ttl_s": 600,
        "replay_max_bytes_per_session": 1 << 20,
        "sweep_interval_s": None,
        "timeout": WAIT,
        "store": store,
    }
    values.update(options)
    return ThreadSessionRegistry(**values)  # type: ignore[arg-type]


@pytest.fixture(params=["memory", "redis", "cluster"])
def stores(request: pytest.FixtureRequest) -> Iterator[tuple[SessionStore, SessionStore]]:
    """Two stores over the same data: one MemoryStore shared, or two Redis
    clients (of one redis-server, or of the shared local Redis Cluster: under
    a prefix of this test's own)."""
    if request.param == "memory":
        shared = MemoryStore()
        yield shared, shared
        return
    if request.param == "cluster":
        cluster: LocalCluster = request.getfixturevalue("redis_cluster")
        prefix = f"{request.node.name}:"
        first = RedisStore(cluster.url, prefix=prefix)
        second = RedisStore(cluster.url, prefix=prefix)
        yield first, second
        first.close()
        second.close()
        return
    server: RedisServer = request.getfixturevalue("redis_server")
    first, second = RedisStore(server.url), RedisStore(server.url)
    yield first, second
    first.close()
    second.close()


def test_a_resume_on_another_registry_takes_the_session_over(
    stores: tuple[SessionStore, SessionStore],
) -> None:
    events: list[LifecycleEvent] = []
    old_wire, new_wire = Transport(), Transport()
    with registry(stores[0]) as a, registry(stores[1], observer=events.append) as b:
        created = a.create("s", send=old_wire.send, close=old_wire.close)
        for n in range(5):
            a.send_event("s", {"n": n})
        result = b.resume(
            "s",
            resume_token=created.resume_token.plaintext,
            last_received_server_event_seq=2,
            send=new_wire.send,
            close=new_wire.close,
        )
        assert [entry.sequence for entry in result.replay_entries] == [3, 4, 5]
        assert [dict(entry.payload)["n"] for entry in result.replay_entries] == [2, 3, 4]
        assert b.send_event("s", {"n": 5}).sequence == 6  # type: ignore[union-attr]
        assert new_wire.seqs() == [6]
        # The old owner learns from its first refused write, and lets go.
        with pytest.raises(SessionReplacedError):
            a.send_event("s", {"n": "stale"})
        assert old_wire.wait_closed() == ["replaced"]
        with pytest.raises(UnknownSessionError):
            a.send_event("s", {"n": "after"})
        # The old token was rotated by the takeover's resume.
        with pytest.raises(InvalidResumeTokenError):
            a.authenticate_resume(
                "s", resume_token=created.resume_token.plaintext, last_received_server_event_seq=0
            )
        again = a.resume(
            "s",
            resume_token=result.resume_token.plaintext,
            last_received_server_event_seq=0,
            send=old_wire.send,
            close=old_wire.close,
        )
        assert [entry.sequence for entry in again.replay_entries] == [1, 2, 3, 4, 5, 6]
    assert "taken_over" in [event.kind for event in events]


def test_a_resume_back_on_an_old_owner_that_never_heard_takes_the_session_back(
    stores: tuple[SessionStore, SessionStore],
) -> None:
    """The old owner has not written since the takeover, so it still holds the
    session with the old token: the new token, refused by its memory, is proven
    against the store, and the old owner lets go and takes the session back."""
    old_wire, new_wire, back_wire = Transport(), Transport(), Transport()
    with registry(stores[0]) as a, registry(stores[1]) as b:
        created = a.create("s", send=old_wire.send, close=old_wire.close)
        a.send_event("s", {"n": 0})
        moved = b.resume(
            "s",
            resume_token=created.resume_token.plaintext,
            last_received_server_event_seq=1,
            send=new_wire.send,
            close=new_wire.close,
        )
        b.send_event("s", {"n": 1})
        assert "s" in a.session_ids()  # a never heard: no write since
        back = a.resume(
            "s",
            resume_token=moved.resume_token.plaintext,
            last_received_server_event_seq=1,
            send=back_wire.send,
            close=back_wire.close,
        )
        assert [entry.sequence for entry in back.replay_entries] == [2]
        assert old_wire.wait_closed() == ["replaced"]
        assert a.send_event("s", {"n": 2}).sequence == 3  # type: ignore[union-attr]
        assert back_wire.seqs() == [3]
        # And a wrong token on a process that does own the session ends nothing.
        with pytest.raises(InvalidResumeTokenError):
            a.authenticate_resume("s", resume_token="wrong", last_received_server_event_seq=0)
        assert a.send_event("s", {"n": 3}).sequence == 4  # type: ignore[union-attr]


def test_a_resume_back_on_an_old_owner_with_the_token_it_knows_takes_the_session_back(
    stores: tuple[SessionStore, SessionStore],
) -> None:
    """Another registry took the session over by proving the token (its lease,
    the same token: the connection there ended before its resume); the client
    comes back to the old owner with that token. Its memory accepts the token,
    the store refuses its write (the lease moved): that is a takeover to make,
    not a session gone (the gateway answered ``unknown_session``)."""
    old_wire, back_wire = Transport(), Transport()
    with registry(stores[0]) as a, registry(stores[1]) as b:
        created = a.create("s", send=old_wire.send, close=old_wire.close)
        a.send_event("s", {"n": 0})
        b.authenticate_resume(
            "s", resume_token=created.resume_token.plaintext, last_received_server_event_seq=1
        )
        back = a.resume(
            "s",
            resume_token=created.resume_token.plaintext,
            last_received_server_event_seq=0,
            send=back_wire.send,
            close=back_wire.close,
        )
        assert [entry.sequence for entry in back.replay_entries] == [1]
        assert old_wire.wait_closed() == ["replaced"]
        assert a.send_event("s", {"n": 1}).sequence == 2  # type: ignore[union-attr]
        assert back_wire.seqs() == [2]
        # The registry that took it over and never wrote lets go at its first write.
        with pytest.raises(SessionReplacedError):
            b.send_event("s", {"n": "stale"})


def test_a_resume_whose_process_died_before_its_activation_is_taken_over_with_the_same_token(
    stores: tuple[SessionStore, SessionStore],
) -> None:
    """The resume on ``a`` is durable (the rotated token is stored) but ``a``
    dies before its activation frame leaves: the client only ever held the
    token it presented, and takes the session over with it elsewhere."""
    old_wire, new_wire = Transport(), Transport()
    activating, dead = threading.Event(), threading.Event()

    def stuck_send(frame: dict[str, object]) -> None:
        activating.set()  # the activation frame, never to reach the client
        dead.wait(WAIT)
        raise ConnectionError("the process is gone")

    with registry(stores[0]) as a, registry(stores[1]) as b:
        created = a.create("s", send=old_wire.send, close=old_wire.close)
        a.send_event("s", {"n": 0})
        presented = created.resume_token.plaintext
        first = threading.Thread(
            target=_resume_quietly,
            args=(a, presented, stuck_send),
        )
        first.start()
        try:
            assert activating.wait(WAIT)
            result = b.resume(
                "s",
                resume_token=presented,
                last_received_server_event_seq=0,
                send=new_wire.send,
                close=new_wire.close,
            )
        finally:
            dead.set()
            first.join(WAIT)
        assert [entry.sequence for entry in result.replay_entries] == [1]
        assert b.send_event("s", {"n": 1}).sequence == 2  # type: ignore[union-attr]
        assert new_wire.seqs() == [2]
        # Once used, the presented token is spent: it takes nothing over again.
        with pytest.raises(InvalidResumeTokenError):
            a.authenticate_resume("s", resume_token=presented, last_received_server_event_seq=0)


def test_a_delivered_activation_leaves_no_second_token_in_the_store(
    stores: tuple[SessionStore, SessionStore],
) -> None:
    wire, again = Transport(), Transport()
    with registry(stores[0]) as a, registry(stores[1]) as b:
        created = a.create("s", send=Transport().send, close=Transport().close)
        presented = created.resume_token.plaintext
        a.resume(
            "s",
            resume_token=presented,
            last_received_server_event_seq=0,
            send=wire.send,
            close=wire.close,
            activation_payload_factory=lambda token, generation: {"type": "session.resumed"},
        )
        assert wire.frames == [{"type": "session.resumed"}]
        a.detach("s")
        with pytest.raises(InvalidResumeTokenError):
            b.resume(
                "s",
                resume_token=presented,
                last_received_server_event_seq=0,
                send=again.send,
                close=again.close,
            )


def _resume_quietly(
    door: ThreadSessionRegistry,
    token: str,
    send: Callable[[dict[str, object]], None],
    activation: Callable[[ResumeToken, int], dict[str, object]] = (
        lambda token, generation: {"type": "session.resumed"}
    ),
) -> None:
    """A resume of ``s`` with an activation frame, its outcome left to the
    test's other checks (an activation whose send raises raises too)."""
    with contextlib.suppress(Exception):
        door.resume(
            "s",
            resume_token=token,
            last_received_server_event_seq=0,
            send=send,
            close=Transport().close,
            activation_payload_factory=activation,
        )


def test_a_wrong_token_never_ends_the_owners_lease(
    stores: tuple[SessionStore, SessionStore],
) -> None:
    wire = Transport()
    with registry(stores[0]) as a, registry(stores[1]) as b:
        a.create("s", send=wire.send, close=wire.close)
        with pytest.raises(InvalidResumeTokenError):
            b.authenticate_resume(
                "s", resume_token="not-the-token", last_received_server_event_seq=0
            )
        assert "s" not in b.session_ids()
        a.send_event("s", {"still": "owner"})
        assert wire.seqs() == [1]
        assert wire.closed == []


def test_a_resume_for_a_session_no_process_holds_is_unknown(
    stores: tuple[SessionStore, SessionStore],
) -> None:
    with registry(stores[1]) as b, pytest.raises(UnknownSessionError):
        b.resume(
            "nobody",
            resume_token="x",
            last_received_server_event_seq=0,
            send=Transport().send,
            close=Transport().close,
        )


def test_a_create_of_an_id_another_registry_holds_is_a_duplicate(
    stores: tuple[SessionStore, SessionStore],
) -> None:
    with registry(stores[0]) as a, registry(stores[1]) as b:
        a.create("s", send=Transport().send, close=Transport().close)
        with pytest.raises(ValueError, match="already exists"):
            b.create("s", send=Transport().send, close=Transport().close)
        with pytest.raises(UnknownSessionError):
            b.send_event("s", {"n": 1})
        assert a.send_event("s", {"n": 1}).sequence == 1  # type: ignore[union-attr]


def test_a_closed_session_leaves_the_store(stores: tuple[SessionStore, SessionStore]) -> None:
    with registry(stores[0]) as a:
        created = a.create("s", send=Transport().send, close=Transport().close)
        a.send_event("s", {"n": 1})
        a.close("s")
    # The delete runs on the registry's committer thread, which may still be
    # writing it after the registry closed (a cluster's first script load is slower).
    deadline = time.monotonic() + WAIT
    while stores[1].load("s") is not None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert stores[1].load("s") is None
    with registry(stores[1]) as b, pytest.raises(UnknownSessionError):
        b.authenticate_resume(
            "s", resume_token=created.resume_token.plaintext, last_received_server_event_seq=0
        )


def test_two_resumes_on_two_registries_have_exactly_one_winner(
    stores: tuple[SessionStore, SessionStore],
) -> None:
    with registry(stores[0]) as a:
        created = a.create("s", send=Transport().send, close=Transport().close)
        a.send_event("s", {"n": 1})
        a.detach("s")
        token = created.resume_token.plaintext
        outcomes: list[str] = []
        start = threading.Barrier(2)
        contenders = [registry(stores[1]), registry(stores[0])]

        def resume(door: ThreadSessionRegistry) -> None:
            start.wait()
            wire = Transport()
            try:
                door.resume(
                    "s",
                    resume_token=token,
                    last_received_server_event_seq=0,
                    send=wire.send,
                    close=wire.close,
                )
            except (InvalidResumeTokenError, SessionReplacedError, UnknownSessionError):
                outcomes.append("lost")
            else:
                outcomes.append("won")

        try:
            threads = [threading.Thread(target=resume, args=(door,)) for door in contenders]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(WAIT)
        finally:
            for door in contenders:
                door.shutdown()
        assert sorted(outcomes) == ["lost", "won"]


def test_redis_unreachable_fails_the_call_and_the_session_recovers(
    redis_server: RedisServer,
) -> None:
    store = RedisStore(redis_server.url, timeout_s=0.5)
    wire = Transport()
    with registry(store) as a:
        created = a.create("s", send=wire.send, close=wire.close)
        a.send_event("s", {"n": 1})
        redis_server.stop()
        with pytest.raises(StoreUnavailableError):
            a.send_event("s", {"n": "while down"})
        assert wire.seqs() == [1]  # nothing of the failed call reached the wire
        redis_server.start()
        assert a.send_event("s", {"n": 2}).sequence == 2  # type: ignore[union-attr]
        assert wire.seqs() == [1, 2]
    other = RedisStore(redis_server.url)
    with registry(other) as b:
        result = b.resume(
            "s",
            resume_token=created.resume_token.plaintext,
            last_received_server_event_seq=0,
            send=Transport().send,
            close=Transport().close,
        )
        assert [dict(e.payload)["n"] for e in result.replay_entries] == [1, 2]
    store.close()
    other.close()


class _OneEventEngine:
    """Sends one event when started, then reports it was journaled."""

    def __init__(self) -> None:
        self.sent = trio.Event()

    async def start(self, session: EngineSession) -> None:
        await session.send({"type": "while Redis is down"})
        self.sent.set()

    async def answer(self, session: EngineSession, client_event_id: str, text: str) -> None:
        return None

    def stop(self, session_id: str) -> None:
        return None


async def test_an_engines_send_waits_for_an_unreachable_store(redis_server: RedisServer) -> None:
    store = RedisStore(redis_server.url, timeout_s=0.5)
    engine = _OneEventEngine()
    wire = Transport()
    with trio.fail_after(60):
        async with (
            open_session_registry(
                replay_ttl_s=600,
                replay_max_bytes_per_session=1 << 20,
                sweep_interval_s=None,
                store=store,
            ) as registry,
            trio.open_nursery() as nursery,
        ):

            async def send(frame: dict[str, object]) -> None:
                wire.send(frame)

            async def close(reason: str) -> None:
                wire.close(reason)

            await registry.create("s", send=send, close=close)
            redis_server.stop()
            work = EngineWork(
                registry, engine, nursery, max_inputs_per_session=10, max_inputs_in_flight=10
            )
            work.start("s", None)
            # The send fails (Redis is down) and is retried, not dropped.
            with trio.move_on_after(1.0):
                await engine.sent.wait()
            assert not engine.sent.is_set()
            assert wire.seqs() == []
            await trio.to_thread.run_sync(redis_server.start)
            await engine.sent.wait()
            assert wire.seqs() == [1]
            work.stop("s")
    store.close()


def test_a_parked_session_expired_by_the_grace_leaves_the_store() -> None:
    clock = FakeClock()
    store = MemoryStore()
    with registry(store, clock=clock, passivate_after_s=0, disconnect_grace_s=5) as door:
        door.create("s", send=Transport().send, close=Transport().close)
        door.detach("s")
        door.sweep()  # proposes parking; the session parks in its own turn, after
        waited = threading.Event()
        for _ in range(int(WAIT / 0.01)):
            if door.stats().parked == 1:
                break
            waited.wait(0.01)
        assert door.stats().parked == 1
        clock.advance(10)
        door.sweep()
        assert door.stats().sessions_expired == 1
    assert store.load("s") is None


class _PartlyAwayStore(MemoryStore):
    """A MemoryStore whose renewals of the sessions in ``away`` are unavailable,
    as a cluster answers for the sessions of a primary that is failing over."""

    def __init__(self) -> None:
        super().__init__()
        self.away: set[str] = set()

    def renew_many(self, leases: Sequence[tuple[str, int]]) -> list[bool | StoreUnavailableError]:
        return [
            StoreUnavailableError("its node is failing over")
            if session_id in self.away
            else self.renew(session_id, epoch)
            for session_id, epoch in leases
        ]


def test_a_sweep_keeps_a_session_whose_renewal_was_unavailable_and_lets_go_of_a_refused_one() -> (
    None
):
    store = _PartlyAwayStore()
    kept_wire, moved_wire = Transport(), Transport()
    with registry(store) as a, registry(store) as b:
        a.create("kept", send=kept_wire.send, close=kept_wire.close)
        moved = a.create("moved", send=moved_wire.send, close=moved_wire.close)
        b.resume(
            "moved",
            resume_token=moved.resume_token.plaintext,
            last_received_server_event_seq=0,
            send=Transport().send,
            close=Transport().close,
        )
        store.away = {"kept"}
        a.sweep()
        assert moved_wire.wait_closed() == ["replaced"]
        assert kept_wire.closed == []
        store.away = set()
        assert a.send_event("kept", {"n": 1}).sequence == 1  # type: ignore[union-attr]


class _CommitsAwayStore(MemoryStore):
    """A MemoryStore whose commits are unavailable while ``away``."""

    def __init__(self) -> None:
        super().__init__()
        self.away = False

    def commit(self, commit: Commit) -> None:
        if self.away:
            raise StoreUnavailableError("away")
        super().commit(commit)


@pytest.mark.parametrize("delivered", [True, False])
def test_an_activation_outcome_whose_write_met_an_outage_leaves_no_resume_waiting(
    delivered: bool,
) -> None:
    """Nobody sends an activation's outcome again: undone, the session would
    hold every later resume behind an activation that never ends."""
    store = _CommitsAwayStore()

    def activation_then_outage(frame: dict[str, object]) -> None:
        store.away = True  # the outcome's write meets it
        if not delivered:
            raise ConnectionError("the connection dropped")

    rotated: list[str] = []

    def activation(token: ResumeToken, generation: int) -> dict[str, object]:
        rotated.append(token.plaintext)
        return {"type": "session.resumed"}

    with registry(store, timeout=2.0) as a, registry(store, timeout=2.0) as b:
        created = a.create("s", send=Transport().send, close=Transport().close)
        a.detach("s")
        presented = created.resume_token.plaintext
        _resume_quietly(a, presented, activation_then_outage, activation)
        store.away = False
        a.detach("s")
        wire = Transport()
        # Delivered: the client holds the rotated token, which the store
        # already has; not delivered: the presented one works once more.
        again = a.resume(
            "s",
            resume_token=rotated[0] if delivered else presented,
            last_received_server_event_seq=0,
            send=wire.send,
            close=wire.close,
        )
        assert again.attachment_generation == 3
        assert a.send_event("s", {"n": 1}).sequence == 1  # type: ignore[union-attr]
        assert wire.seqs() == [1]
        # The writes since cleared the presented token from the store.
        with pytest.raises(InvalidResumeTokenError):
            b.authenticate_resume("s", resume_token=presented, last_received_server_event_seq=0)
