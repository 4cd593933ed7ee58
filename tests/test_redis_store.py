"""The store contract, on MemoryStore and on RedisStore with a real redis-server.

Explicit stream IDs, acks as trims, fencing by epoch, the token's
compare-and-set (exactly one winner among racing takeovers), leases that run
out, key expiry, Redis restarted from its AOF, Redis unreachable.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from collections.abc import Iterator
from dataclasses import replace

import pytest
import redis

from actors._client_seqs import ClientWatermark
from actors._credential import token_digest
from actors._errors import (
    DuplicateSessionError,
    SessionReplacedError,
    StoreOutcomeUnknownError,
    StoreUnavailableError,
    TokenConflictError,
)
from actors._store import (
    Commit,
    SessionRecord,
    SessionStore,
    StoredEvent,
    handled_client_seq,
    proves_token,
)
from supervisor.redis_store import RedisStore
from supervisor.stores._memory import MemoryStore
from tests.redis_support import RedisServer, free_port


def record(
    token: str = "token-0",  # noqa: S107 - a test token
    *,
    next_sequence: int = 1,
    dropped: int = 0,
) -> SessionRecord:
    return SessionRecord(
        token_digest=token_digest(token),
        recovery_token_digest=None,
        attachment_generation=1,
        lease_generation=0,
        orphaned_lease_generation=None,
        last_resume=None,
        detached_at=None,
        next_sequence=next_sequence,
        dropped_through=dropped,
        drop_runs=((dropped, "acknowledged"),) if dropped else (),
        overflowed=False,
    )


def events(first: int, last: int) -> tuple[StoredEvent, ...]:
    return tuple(
        StoredEvent(
            sequence=seq,
            created_at=1000.0 + seq,
            encoded_bytes=len(f'{{"n":{seq},"server_event_seq":{seq}}}'),
            encoded=f'{{"n":{seq},"server_event_seq":{seq}}}'.encode(),
        )
        for seq in range(first, last + 1)
    )


def append(store: SessionStore, session_id: str, epoch: int, first: int, last: int) -> None:
    store.commit(
        Commit(
            session_id=session_id,
            epoch=epoch,
            record=record(next_sequence=last + 1),
            appends=events(first, last),
        )
    )


@pytest.fixture(params=["memory", "redis"])
def store(request: pytest.FixtureRequest) -> Iterator[SessionStore]:
    if request.param == "memory":
        yield MemoryStore()
        return
    server: RedisServer = request.getfixturevalue("redis_server")
    redis_store = RedisStore(server.url)
    yield redis_store
    redis_store.close()


def test_create_then_load_gives_the_record_back(store: SessionStore) -> None:
    assert store.load("s") is None
    assert store.create("s", record()) == 1
    loaded = store.load("s")
    assert loaded is not None
    assert (loaded.epoch, loaded.record, loaded.events) == (1, record(), ())


def test_a_second_create_of_an_id_is_a_duplicate(store: SessionStore) -> None:
    store.create("s", record())
    with pytest.raises(DuplicateSessionError):
        store.create("s", record("other"))
    loaded = store.load("s")
    assert loaded is not None and loaded.record == record()


def test_appends_come_back_in_order_and_an_ack_trims_the_head(store: SessionStore) -> None:
    epoch = store.create("s", record())
    append(store, "s", epoch, 1, 5)
    loaded = store.load("s")
    assert loaded is not None
    assert [e.sequence for e in loaded.events] == [1, 2, 3, 4, 5]
    assert loaded.events == events(1, 5)
    store.commit(
        Commit(
            session_id="s", epoch=epoch, record=record(next_sequence=6, dropped=3), trim_through=3
        )
    )
    loaded = store.load("s")
    assert loaded is not None
    assert [e.sequence for e in loaded.events] == [4, 5]
    assert loaded.record.dropped_through == 3


def test_an_append_at_or_below_the_top_is_refused_whole(store: SessionStore) -> None:
    epoch = store.create("s", record())
    append(store, "s", epoch, 1, 3)
    with pytest.raises(SessionReplacedError):
        append(store, "s", epoch, 3, 4)
    loaded = store.load("s")
    assert loaded is not None
    assert [e.sequence for e in loaded.events] == [1, 2, 3]
    assert loaded.record.next_sequence == 4


def test_an_append_past_a_hole_is_refused_whole(store: SessionStore) -> None:
    """An owner whose store lost its last writes (a replica promoted without
    them) writes on from its own head: refused, or a later owner would load a
    journal with a hole and replay past it silently."""
    epoch = store.create("s", record())
    append(store, "s", epoch, 1, 3)
    with pytest.raises(SessionReplacedError):
        store.commit(Commit(session_id="s", epoch=epoch, record=None, appends=events(6, 6)))
    loaded = store.load("s")
    assert loaded is not None
    assert [e.sequence for e in loaded.events] == [1, 2, 3]
    assert loaded.record.next_sequence == 4
    # A commit that moves the dropped boundary past the hole (a store_lost
    # skip, or acks of everything) may append right after it.
    store.commit(
        Commit(
            session_id="s",
            epoch=epoch,
            record=record(next_sequence=7, dropped=5),
            appends=events(6, 6),
            trim_through=5,
        )
    )
    loaded = store.load("s")
    assert loaded is not None
    assert [e.sequence for e in loaded.events] == [6]
    assert (loaded.record.next_sequence, loaded.record.dropped_through) == (7, 5)


def test_a_stale_owner_is_fenced_after_a_takeover(store: SessionStore) -> None:
    epoch = store.create("s", record())
    append(store, "s", epoch, 1, 2)
    taken = store.acquire("s", token_digest("token-0"))
    assert taken is not None and taken.epoch == epoch + 1
    assert [e.sequence for e in taken.events] == [1, 2]
    with pytest.raises(SessionReplacedError):
        append(store, "s", epoch, 3, 3)
    assert not store.renew("s", epoch)
    store.delete("s", epoch)  # a stale owner's delete is ignored
    append(store, "s", taken.epoch, 3, 3)
    loaded = store.load("s")
    assert loaded is not None
    assert [e.sequence for e in loaded.events] == [1, 2, 3]


def test_acquire_needs_the_digest_the_token_was_proven_against(store: SessionStore) -> None:
    store.create("s", record("right"))
    assert store.acquire("s", token_digest("wrong")) is None
    assert store.acquire("missing", token_digest("right")) is None
    loaded = store.load("s")
    assert loaded is not None and loaded.epoch == 1
    assert proves_token(loaded, "right") == token_digest("right")
    assert proves_token(loaded, "wrong") is None


def test_racing_takeovers_with_one_token_have_exactly_one_winner(store: SessionStore) -> None:
    store.create("s", record("token-0"))
    old = token_digest("token-0")
    results: list[str] = []
    start = threading.Barrier(6)

    def resume(n: int) -> None:
        start.wait()
        taken = store.acquire("s", old)
        if taken is None:
            results.append("token gone")
            return
        rotated = replace(taken.record, token_digest=token_digest(f"token-{n + 1}"))
        try:
            store.commit(
                Commit(session_id="s", epoch=taken.epoch, record=rotated, expect_token_digest=old)
            )
        except (SessionReplacedError, TokenConflictError):
            results.append("lost")
        else:
            results.append("won")

    threads = [threading.Thread(target=resume, args=(n,)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert results.count("won") == 1
    assert len(results) == 6


def test_a_rotation_against_a_changed_digest_is_a_conflict(store: SessionStore) -> None:
    epoch = store.create("s", record("a"))
    with pytest.raises(TokenConflictError):
        store.commit(
            Commit(
                session_id="s",
                epoch=epoch,
                record=record("c"),
                expect_token_digest=token_digest("b"),
            )
        )
    loaded = store.load("s")
    assert loaded is not None and loaded.record.token_digest == token_digest("a")


def test_a_lease_that_ran_out_refuses_writes_until_someone_takes_over() -> None:
    now = [0.0]
    store = MemoryStore(lease_s=10.0, clock=lambda: now[0])
    epoch = store.create("s", record())
    now[0] = 9.0
    assert store.renew("s", epoch)
    now[0] = 30.0
    assert not store.renew("s", epoch)
    with pytest.raises(SessionReplacedError):
        append(store, "s", epoch, 1, 1)
    taken = store.acquire("s", token_digest("token-0"))
    assert taken is not None
    append(store, "s", taken.epoch, 1, 1)


def test_redis_lease_runs_out_on_the_server_clock(redis_server: RedisServer) -> None:
    store = RedisStore(redis_server.url, lease_s=0.2, key_ttl_s=60)
    epoch = store.create("s", record())
    deadline = time.monotonic() + 10
    while store.renew("s", epoch) and time.monotonic() < deadline:
        time.sleep(0.3)  # longer than the lease: the next renewal must be refused
    with pytest.raises(SessionReplacedError):
        append(store, "s", epoch, 1, 1)
    store.close()


def test_redis_keeps_explicit_stream_ids_and_key_expiry(redis_server: RedisServer) -> None:
    store = RedisStore(redis_server.url, prefix="t:", key_ttl_s=600)
    epoch = store.create("s", record())
    append(store, "s", epoch, 1, 3)
    client = redis.Redis.from_url(redis_server.url)
    ids = [entry_id for entry_id, _ in client.xrange("t:{s}:e") or []]
    assert ids == [b"0-1", b"0-2", b"0-3"]
    # Redis itself refuses an ID at or below the top: the second line of the fence.
    with pytest.raises(redis.exceptions.ResponseError):
        client.xadd("t:{s}:e", {"e": "x"}, id="0-3")
    for key in ("t:{s}:e", "t:{s}:f"):
        assert 0 < client.pttl(key) <= 600_000
    client.close()
    store.close()


def test_every_write_survives_a_redis_kill_and_restart_from_its_aof(
    redis_server: RedisServer,
) -> None:
    store = RedisStore(redis_server.url)
    epoch = store.create("s", record())
    for first in range(1, 200, 10):
        append(store, "s", epoch, first, first + 9)
    redis_server.restart()  # SIGKILL: no save on shutdown; appendfsync always
    loaded = store.load("s")
    assert loaded is not None
    assert [e.sequence for e in loaded.events] == list(range(1, 201))
    append(store, "s", epoch, 201, 201)
    store.close()


def test_redis_unreachable_is_a_clear_error_and_recovers(redis_server: RedisServer) -> None:
    store = RedisStore(redis_server.url, timeout_s=0.5)
    epoch = store.create("s", record())
    append(store, "s", epoch, 1, 2)
    redis_server.stop()
    with pytest.raises(StoreUnavailableError) as caught:
        append(store, "s", epoch, 3, 3)
    assert f"127.0.0.1:{redis_server.port}" in str(caught.value)
    redis_server.start()
    append(store, "s", epoch, 3, 3)
    loaded = store.load("s")
    assert loaded is not None
    assert [e.sequence for e in loaded.events] == [1, 2, 3]
    store.close()


def test_an_error_never_shows_the_urls_password() -> None:
    store = RedisStore(f"redis://:hunter2secret@127.0.0.1:{free_port()}/0", timeout_s=0.3)
    with pytest.raises(StoreUnavailableError) as caught:
        store.load("s")
    assert "hunter2secret" not in repr(caught.value) + str(caught.value)
    assert caught.value.__cause__ is None
    store.close()


def test_the_store_works_on_the_server_ci_started() -> None:
    """``.ci/run`` starts a redis-server and exports DUPLEX_REDIS_URL."""
    url = os.environ.get("DUPLEX_REDIS_URL")
    if not url:  # unset or empty
        if os.environ.get("DUPLEX_REQUIRE_REDIS") == "1":
            pytest.fail("DUPLEX_REQUIRE_REDIS=1 but DUPLEX_REDIS_URL is not set")
        pytest.skip(
            "DUPLEX_REDIS_URL not set (or empty): .ci/run starts a redis-server and sets it"
        )
    store = RedisStore(url, prefix=f"ci-{os.getpid()}:")
    epoch = store.create("s", record())
    append(store, "s", epoch, 1, 3)
    loaded = store.load("s")
    assert loaded is not None and [e.sequence for e in loaded.events] == [1, 2, 3]
    store.delete("s", epoch)
    assert store.load("s") is None
    store.close()


def test_a_load_without_events_reads_the_fields_only(store: SessionStore) -> None:
    store.create("s", record())
    append(store, "s", 1, 1, 3)
    loaded = store.load("s", events=False)
    assert loaded is not None
    assert (loaded.epoch, loaded.record, loaded.events) == (1, record(next_sequence=4), ())
    full = store.load("s")
    assert full is not None and [e.sequence for e in full.events] == [1, 2, 3]


def test_many_sessions_writing_at_once_all_get_through(redis_server: RedisServer) -> None:
    # Many threads (registries' loops, the gateway's workers) write through
    # one RedisStore: more at once than redis-py's default pool holds (100)
    # must wait, not fail.
    store = RedisStore(redis_server.url)
    threads_n, commits = 160, 10
    barrier = threading.Barrier(threads_n)
    failures: list[BaseException] = []

    def writer(n: int) -> None:
        session_id = f"s{n}"
        store.create(session_id, record())
        barrier.wait()
        try:
            for seq in range(1, commits + 1):
                append(store, session_id, 1, seq, seq)
        except BaseException as exc:
            failures.append(exc)

    try:
        threads = [threading.Thread(target=writer, args=(n,)) for n in range(threads_n)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert failures == []
        loaded = store.load(f"s{threads_n - 1}")
        assert loaded is not None and len(loaded.events) == commits
    finally:
        store.close()


def test_a_commit_of_appends_alone_moves_next_sequence(store: SessionStore) -> None:
    store.create("s", record())
    store.commit(Commit(session_id="s", epoch=1, record=None, appends=events(1, 2)))
    store.commit(Commit(session_id="s", epoch=1, record=None, appends=events(3, 3)))
    loaded = store.load("s")
    assert loaded is not None
    assert loaded.record == record(next_sequence=4)
    assert [e.sequence for e in loaded.events] == [1, 2, 3]
    with pytest.raises(SessionReplacedError):  # at or below the top: refused whole
        store.commit(Commit(session_id="s", epoch=1, record=None, appends=events(3, 4)))


def test_writes_at_once_are_refused_or_kept_each_alone(
    redis_server: RedisServer,
) -> None:
    # Many sessions write at once: a stale owner's write among them is
    # refused alone, every other one is kept.
    store = RedisStore(redis_server.url)
    count = 60
    barrier = threading.Barrier(count)
    refused: list[int] = []

    def writer(n: int) -> None:
        session_id = f"s{n}"
        store.create(session_id, record())
        epoch = 1
        if n % 3 == 0:
            store.acquire(session_id, record().token_digest)  # epoch 1 is stale now
        barrier.wait()
        try:
            append(store, session_id, epoch, 1, 3)
        except SessionReplacedError:
            refused.append(n)

    try:
        threads = [threading.Thread(target=writer, args=(n,)) for n in range(count)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert sorted(refused) == list(range(0, count, 3))
        for n in range(count):
            loaded = store.load(f"s{n}")
            assert loaded is not None
            kept = [e.sequence for e in loaded.events]
            assert kept == ([] if n % 3 == 0 else [1, 2, 3]), n
    finally:
        store.close()


def test_renewals_sent_together_answer_each_lease(store: SessionStore) -> None:
    for session_id in ("a", "b", "c"):
        store.create(session_id, record())
    assert store.acquire("b", record().token_digest) is not None  # b: epoch 2 now
    leases = [("a", 1), ("b", 1), ("c", 1), ("gone", 1), ("b", 2)]
    assert store.renew_many(leases) == [True, False, True, False, True]
    assert store.renew_many([]) == []


def test_renewals_of_more_sessions_than_one_pipeline_holds(redis_server: RedisServer) -> None:
    from supervisor.stores._redis import RENEW_BATCH

    store = RedisStore(redis_server.url)
    try:
        count = RENEW_BATCH + 7
        for n in range(count):
            store.create(f"s{n}", record())
        leases = [(f"s{n}", 1 if n % 2 else 9) for n in range(count)]
        assert store.renew_many(leases) == [n % 2 == 1 for n in range(count)]
    finally:
        store.close()


def test_the_watermark_stops_below_an_event_not_yet_handled(store: SessionStore) -> None:
    store.record_client_seq("s", 1)  # no such session: nothing kept
    assert store.client_watermark("s") == ClientWatermark()
    epoch = store.create("s", record())
    store.record_client_seq("s", 1)
    # 2 is an input whose answer is in flight; 3, 4 and 6 were handled meanwhile.
    for seq in (3, 4, 6, 4):
        store.record_client_seq("s", seq)
    append(store, "s", epoch, 1, 2)  # a commit leaves it as it is
    assert store.client_watermark("s") == ClientWatermark(
        last_client_seq=1, handled_above=((3, 4), (6, 6))
    )
    store.record_client_seq("s", 2)  # the answer ended
    assert store.client_watermark("s") == ClientWatermark(
        last_client_seq=4, handled_above=((6, 6),)
    )
    store.record_client_seq("s", 1)  # an older writer's: never lowers it
    store.record_client_seq("s", 5)
    assert store.client_watermark("s") == ClientWatermark(last_client_seq=6)


def test_last_client_seq_is_the_watermark_below_every_unhandled_event(
    store: SessionStore,
) -> None:
    # Both stores keep the name the gateway answered with before the watermark
    # had runs (`last_client_seq`): the watermark alone, runs above it left out.
    assert isinstance(store, MemoryStore | RedisStore)
    assert store.last_client_seq("s") == 0  # no such session
    store.create("s", record())
    for seq in (1, 3, 4):
        store.record_client_seq("s", seq)
    assert store.last_client_seq("s") == 1  # 2 is not handled yet
    store.record_client_seq("s", 2)
    assert store.last_client_seq("s") == 4


def test_both_stores_mark_handled_events_as_the_pure_watermark_does(
    store: SessionStore,
) -> None:
    rng = random.Random(7)  # noqa: S311 - a test's order, not a secret
    order = list(range(1, 60))
    rng.shuffle(order)
    store.create("s", record())
    expected = ClientWatermark()
    for seq in order[:45]:
        store.record_client_seq("s", seq)
        expected = expected.with_handled((seq,))
        assert store.client_watermark("s") == expected


def test_a_commit_journaling_an_answer_to_a_client_event_marks_it_handled(
    store: SessionStore,
) -> None:
    epoch = store.create("s", record())
    receipts = [
        f'{{"type":"input_audio.received","client_seq":{n},"server_event_seq":{n}}}'.encode()
        for n in (1, 3)
    ]
    events = tuple(
        StoredEvent(sequence=n, created_at=1.0, encoded_bytes=len(receipt), encoded=receipt)
        for n, receipt in enumerate(receipts, start=1)
    )
    store.commit(
        Commit(session_id="s", epoch=epoch, record=None, appends=events, client_seqs=(1, 3))
    )
    assert store.client_watermark("s") == ClientWatermark(
        last_client_seq=1, handled_above=((3, 3),)
    )
    # A commit fenced off changes nothing, its client_seqs neither.
    with pytest.raises(SessionReplacedError):
        store.commit(Commit(session_id="s", epoch=epoch + 1, record=None, client_seqs=(2,)))
    assert store.client_watermark("s").last_client_seq == 1


def test_the_commit_of_an_event_carrying_client_seq_says_so() -> None:
    assert handled_client_seq(b'{"type":"x","client_seq":3}') == 3
    assert handled_client_seq(b'{"type":"x","client_seq":true}') is None
    assert handled_client_seq(b'{"type":"x"}') is None


def test_an_unreachable_redis_is_one_warning_per_interval_not_one_per_call(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = RedisStore(f"redis://127.0.0.1:{free_port()}/0", timeout_s=0.2)
    caplog.set_level(logging.WARNING, logger="duplex_supervisor")
    threads = [threading.Thread(target=_refused, args=(store, 25)) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    store.close()
    lines = [r for r in caplog.records if "unavailable" in r.getMessage()]
    assert len(lines) == 1  # 100 failed calls from 4 threads, one line


def _refused(store: RedisStore, times: int) -> None:
    for _ in range(times):
        with pytest.raises(StoreUnavailableError):
            store.renew("s", 1)


def test_an_error_reply_answers_its_command_alone_and_the_connection_goes_on(
    redis_server: RedisServer,
) -> None:
    """One pipelined batch on one connection: the commands Redis refused
    (NOREPLICAS) are answered unavailable, the others applied, and the same
    connection serves the next batch in step."""
    store = RedisStore(redis_server.url, max_connections=1)
    store.create("a", record())
    with redis.Redis(host="127.0.0.1", port=redis_server.port) as node:
        node.config_set("min-replicas-to-write", "1")
        outcomes = store.commit_many(
            [Commit(session_id="a", epoch=1, record=None, appends=events(1, 1))]
        )
        assert isinstance(outcomes[0], StoreUnavailableError)
        assert not isinstance(outcomes[0], StoreOutcomeUnknownError)  # refused up front
        node.config_set("min-replicas-to-write", "0")
    applied, stale, next_one = store.commit_many(
        [
            Commit(session_id="a", epoch=1, record=None, appends=events(1, 1)),
            Commit(session_id="a", epoch=7, record=None, appends=events(2, 2)),
            Commit(session_id="a", epoch=1, record=None, appends=events(2, 2)),
        ]
    )
    assert applied is None and next_one is None
    assert isinstance(stale, SessionReplacedError)
    stored = store.load("a")
    assert stored is not None and [e.sequence for e in stored.events] == [1, 2]
    store.close()
