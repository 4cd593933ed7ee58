"""RedisStore: sessions in Redis (>= 7, or Valkey), shared by many processes.

Per session two keys, with one hash tag so a cluster keeps them on one slot:

* ``<prefix>{<id>}:f``, a hash: the `SessionRecord`
  fields, plus ``epoch`` (the fencing counter), ``lease_until`` (the
  owner's lease, in the Redis server's milliseconds) and ``idn`` (the
  fingerprint of the identity that opened it, if bound);
* ``<prefix>{<id>}:e``, a stream: one entry per retained journal event, with
  the explicit ID ``0-<sequence>``, so Redis itself refuses an append at or
  below the stream's top. An acknowledgement (or a TTL prune) is one
  ``XTRIM MINID``;
* ``<prefix>{<id>}:i``, a hash: the session's inputs (`input_key` ->
  the claiming process, or ``""`` once a commit journaled the answer's end).

Every write is one Lua script, so it is atomic: it checks the epoch, the
lease (by the server's clock) and, for a token rotation, the stored digest
(compare-and-set), then appends, trims and updates the hash, renews the lease
and the keys' expiry (``key_ttl_s``: how long a session nobody writes or
renews is kept). A refused write changes nothing.

What Redis keeps across its own restart depends on its persistence settings:
with ``appendonly yes`` and ``appendfsync always`` every acknowledged write
is on disk; with ``everysec`` (Redis's default for AOF) an OS crash or power
loss can lose up to the last second of writes; without AOF, whatever came
after the last RDB snapshot.

One module over 400 lines: `RedisStore` is the whole `SessionStore` protocol
(and `BatchingStore`) in one class, each method one script call or one
pipeline with its error mapping, and what is not the protocol already lives
outside it (the scripts: `_redis_scripts`; the codec: `_redis_codec`; the
cluster client: `_redis_cluster`).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator, Sequence
from typing import Any, cast

from supervisor._extras import MissingExtraError

try:
    import redis
    import redis.exceptions
    from redis.exceptions import NoScriptError
except ModuleNotFoundError:
    raise MissingExtraError("redis", "supervisor.redis_store") from None

from actors._client_seqs import ClientWatermark, parse_runs
from actors._errors import (
    DuplicateSessionError,
    StoreOutcomeUnknownError,
    StoreUnavailableError,
)
from actors._store import DEFAULT_LEASE_S, Commit, SessionRecord, StoredSession
from supervisor._log_limit import LogLimiter
from supervisor.stores import _redis_cluster
from supervisor.stores._redis_codec import (
    commit_refusal,
    record_fields,
    script_events,
    session_record,
    stream_events,
    written,
)
from supervisor.stores._redis_scripts import (
    ACQUIRE,
    BIND_IDENTITY,
    CLAIM_INPUT,
    COMMIT,
    CREATE,
    DELETE,
    FENCE,
    RECORD_CLIENT_SEQ,
    RENEW,
)

__all__ = ["DEFAULT_KEY_TTL_S", "RedisStore"]

logger = logging.getLogger("duplex_supervisor.supervisor")

#: Lease renewals sent in one pipeline by `RedisStore.renew_many`.
RENEW_BATCH = 500

#: A session that nobody writes or renews for this long is dropped by Redis.
DEFAULT_KEY_TTL_S = 24 * 3600.0

#: A pipelined reply that says the connection broke or timed out under it.
_LOST = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)


class RedisStore:
    """A `SessionStore` on one Redis (see the module).

    ``url`` is a redis-py URL (``redis://host:port/db``), or
    ``redis+cluster://host:port[,host:port...]`` for a Redis Cluster
    (`supervisor.stores._redis_cluster`: redis-py's cluster client, at most
    ``max_connections`` per node); it may hold a
    password, so errors name only the hosts and ports. At most
    ``max_connections`` connections, shared by every thread of the process
    that calls it (a registry calls it from its committer's thread, never
    its loop: `supervisor.stores._committer`; a write borrows one for its round
    trip; more at once wait, up to ``timeout_s``). Its methods block: a
    program of its own may call them from any thread.
    While Redis is unreachable every failed call raises, but the warning is
    logged at most once per ``log_interval_s`` (the lines held back are
    counted into the next one): an outage is not a log storm.

    ``durability_replicas`` K > 0: each commit is also acknowledged by K
    replicas of its primary (``WAIT K``, in the same pipeline, on the same
    connection, after the commits), so a replica promoted after its primary
    died holds every event a client was sent. A commit Redis applied but
    fewer than K replicas acknowledged (within half of ``timeout_s``) is
    answered `StoreOutcomeUnknownError`, as a write whose answer was lost:
    the session sends none of its events until a fence (`fence`, which waits
    for K replicas too) says whether the primary that answers then holds it.
    A create and a takeover's acquire wait the same way (an applied one not
    acknowledged: `StoreOutcomeUnknownError`); renewals and deletes do not.

    A commit whose answer was lost (the connection broke or timed out after
    the pipeline left) is `StoreOutcomeUnknownError` too; one that never left
    (no connection could be had) is `StoreUnavailableError`.
    """

    def __init__(
        self,
        url: str,
        *,
        prefix: str = "duplex:",
        lease_s: float = DEFAULT_LEASE_S,
        key_ttl_s: float = DEFAULT_KEY_TTL_S,
        timeout_s: float = 2.0,
        max_connections: int = 32,
        log_interval_s: float = 10.0,
        durability_replicas: int = 0,
    ) -> None:
        if durability_replicas < 0:
            raise ValueError("durability_replicas must be >= 0")
        if lease_s <= 0 or key_ttl_s < lease_s:
            raise ValueError("lease_s must be positive and key_ttl_s at least lease_s")
        if max_connections < 1:
            raise ValueError("max_connections must be >= 1")
        self._log = LogLimiter(logger, log_interval_s)
        self._pool: _redis_cluster.Pool | None = None
        self._client: redis.Redis | _redis_cluster.RedisCluster
        if _redis_cluster.is_cluster_url(url):
            self.where = _redis_cluster.where(url)
            with self._reachable():
                self._client = _redis_cluster.cluster_client(
                    url, max_connections=max_connections, timeout_s=timeout_s
                )
        else:
            # Blocking: each caller (a registry's committer, the gateway's worker
            # threads) borrows a connection per write; past max_connections a
            # thread waits its turn (up to timeout_s)
            # instead of failing, as redis-py's default pool (100) would.
            self._pool = _redis_cluster.Pool.from_url(
                url,
                max_connections=max_connections,
                timeout=timeout_s,
                socket_timeout=timeout_s,
                socket_connect_timeout=timeout_s,
            )
            self._client = redis.Redis(connection_pool=self._pool)
            kwargs = self._pool.connection_kwargs
            self.where = f"{kwargs.get('host', '?')}:{kwargs.get('port', '?')}"
        self.prefix = prefix
        self.durability_replicas = durability_replicas
        # WAIT's own timeout, under the socket's (which would drop the connection).
        self._wait_ms = max(1, int(timeout_s * 500))
        self.lease_s = lease_s
        self._lease_ms = max(1, int(lease_s * 1000))
        self._ttl_ms = max(1, int(key_ttl_s * 1000))
        self._create = self._client.register_script(CREATE)
        self._commit = self._client.register_script(COMMIT)
        self._acquire = self._client.register_script(ACQUIRE)
        self._renew = self._client.register_script(RENEW)
        self._fence = self._client.register_script(FENCE)
        self._delete = self._client.register_script(DELETE)
        self._claim_input = self._client.register_script(CLAIM_INPUT)
        self._bind_identity = self._client.register_script(BIND_IDENTITY)
        self._record_client_seq = self._client.register_script(RECORD_CLIENT_SEQ)

    def _keys(self, session_id: str) -> list[str]:
        base = f"{self.prefix}{{{session_id}}}"
        return [f"{base}:f", f"{base}:e", f"{base}:i"]

    def _unavailable(self, exc: BaseException, *, wrote: bool = False) -> StoreUnavailableError:
        """``wrote``: ``exc`` ended a write; unless it was raised before the
        write left (`_redis_cluster.nothing_sent`), Redis may have applied it:
        `StoreOutcomeUnknownError`."""
        unknown = wrote and not _redis_cluster.nothing_sent(exc)
        kind = StoreOutcomeUnknownError if unknown else StoreUnavailableError
        error = kind(f"Redis at {self.where} is unavailable ({type(exc).__name__})")
        self._log.log(
            logging.WARNING,
            "unavailable",
            "session store: Redis at %s unavailable: %s",
            self.where,
            exc,
            now=time.monotonic(),
        )
        return error

    @contextlib.contextmanager
    def _reachable(self, *, wrote: bool = False) -> Iterator[None]:
        """Redis unreachable or timing out (a cluster: also failing over), as
        `StoreUnavailableError` (``wrote``: see `_unavailable`)."""
        try:
            yield
        except _redis_cluster.UNREACHABLE as exc:
            raise self._unavailable(exc, wrote=wrote) from None
        except redis.exceptions.ResponseError as exc:
            if _redis_cluster.refused_for_replicas(exc):
                raise self._unavailable(exc) from None
            raise

    def _unreplicated(self) -> StoreOutcomeUnknownError:
        self._log.log(
            logging.WARNING,
            "unreplicated",
            "session store: Redis at %s: a commit not acknowledged by %d replicas",
            self.where,
            self.durability_replicas,
            now=time.monotonic(),
        )
        # Applied on the primary, maybe not on the replica a failover promotes:
        # its outcome is unknown until a fence (with its own WAIT) says.
        return StoreOutcomeUnknownError(
            f"Redis at {self.where}: fewer than {self.durability_replicas} replicas "
            "acknowledged the commit"
        )

    def _reply(self, reply: Any, *, wrote: bool) -> Any:
        """One pipelined reply; one that says its node cannot serve it (a
        cluster pipeline answers these per command) or that its primary lacks the
        replicas it requires (NOREPLICAS), as `StoreUnavailableError`. A
        connection lost or timing out for that command (``wrote``: a write):
        `StoreOutcomeUnknownError`, unless nothing was sent."""
        if isinstance(reply, _redis_cluster.UNREACHABLE) or (
            isinstance(reply, BaseException) and _redis_cluster.refused_for_replicas(reply)
        ):
            return self._unavailable(reply, wrote=wrote and isinstance(reply, _LOST))
        return reply

    def _run(self, script: Any, keys: list[str], args: list[Any], *, wrote: bool = False) -> Any:
        """One script call on its session's node (`_redis_cluster.run_script`;
        on a cluster never sent twice)."""
        with self._reachable(wrote=wrote):
            return _redis_cluster.run_script(self._client, script, keys, args)

    def create(self, session_id: str, record: SessionRecord) -> int:
        """See `SessionStore.create`. Its answer lost (`StoreOutcomeUnknownError`),
        the same ``record`` sent again answers 1 if the first was applied."""
        fields = record_fields(record)
        assert fields[0] == "td"  # noqa: S101 - the script reads the digest at ARGV[4]
        created = self._durable_write(
            self._create, self._keys(session_id), [self._lease_ms, self._ttl_ms, *fields]
        )
        if created != 1:
            raise DuplicateSessionError(session_id)
        return 1

    def _durable_write(self, script: Any, keys: list[str], args: list[Any]) -> Any:
        """One script that writes (a create, an acquire): its reply, or the
        error it raised. With `durability_replicas`, in a pipeline with its
        ``WAIT`` as a commit is: applied but not acknowledged by the replicas,
        `StoreOutcomeUnknownError` (a promotion may lose it)."""
        if not self.durability_replicas:
            return self._run(script, keys, args, wrote=True)
        with self._reachable(wrote=True):
            (reply,) = self._pipelined(script, [(keys, args)], durable=True)
        if isinstance(reply, BaseException):
            raise reply
        return reply

    def commit(self, commit: Commit) -> None:
        refusal = self.commit_many([commit])[0]  # its WAIT, if any, on its connection
        if refusal is not None:
            raise refusal

    def commit_many(self, commits: Sequence[Commit]) -> list[BaseException | None]:
        """`commit` for each of ``commits``, all in one pipelined round trip.

        Each is its own script, atomic alone (not a transaction across them);
        for each, ``None`` (applied) or its refusal, so one session's refusal
        touches no other. Redis unreachable: `StoreUnavailableError` for all
        (`StoreOutcomeUnknownError` if the pipeline had left: any of them may
        have been applied before the connection broke; `fence` tells). A
        registry writes its sessions' commits through this from a committer
        thread (`supervisor.stores._committer`), never on its loop.
        """
        calls = [(self._keys(c.session_id), self._commit_args(c)) for c in commits]
        with self._reachable(wrote=True):
            outcomes = self._pipelined(self._commit, calls, durable=True)
        return [
            outcome if isinstance(outcome, Exception) else commit_refusal(outcome, c.session_id)
            for c, outcome in zip(commits, outcomes, strict=True)
        ]

    def _pipelined(
        self,
        script: Any,
        calls: list[tuple[list[str], list[Any]]],
        *,
        durable: bool = False,
    ) -> list[Any]:
        """Run ``script`` once per ``(keys, args)`` in one round trip; each reply,
        or the error Redis answered for that call alone.

        By its digest (EVALSHA), not redis-py's pipelined scripts, which ask
        ``SCRIPT EXISTS`` first: a second round trip per batch. A node that
        lost its scripts (a restart, a replica just promoted) answers NOSCRIPT
        without running them: those calls are sent again by EVAL, as in `_run`.
        """
        if not calls:
            return []
        replies = self._send(script, calls, durable=durable)
        missing = [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
        if missing:
            again = [calls[i] for i in missing]
            by_body = self._send(script, again, durable=durable, by_body=True)
            for i, reply in zip(missing, by_body, strict=True):
                replies[i] = reply
        return replies

    def _send(
        self,
        script: Any,
        calls: list[tuple[list[str], list[Any]]],
        *,
        durable: bool = False,
        by_body: bool = False,
    ) -> list[Any]:
        """One pipeline (`_redis_cluster.send_scripts`; ``by_body``: EVAL with
        the script's text, not EVALSHA); ``durable`` with
        `durability_replicas`: an applied script (reply 1) whose replicas did
        not all acknowledge it is answered `StoreOutcomeUnknownError`."""
        replies, acknowledged = _redis_cluster.send_scripts(
            self._client,
            ("EVAL", script.script) if by_body else ("EVALSHA", script.sha),
            calls,
            wait_replicas=self.durability_replicas if durable else 0,
            wait_ms=self._wait_ms,
        )
        return [
            self._unreplicated()
            if written(reply) and not acked
            else self._reply(reply, wrote=durable)
            for reply, acked in zip(replies, acknowledged, strict=True)
        ]

    def _commit_args(self, commit: Commit) -> list[Any]:
        fields = record_fields(commit.record) if commit.record is not None else []
        args: list[Any] = [
            commit.epoch,
            self._lease_ms,
            self._ttl_ms,
            "" if commit.expect_token_digest is None else commit.expect_token_digest.hex(),
            "" if commit.trim_through is None else commit.trim_through,
            len(fields),
            *fields,
            len(commit.settles),
            *commit.settles,
            len(commit.client_seqs),
            *commit.client_seqs,
        ]
        for event in commit.appends:
            args += [event.sequence, event.encoded, repr(event.created_at), event.encoded_bytes]
        return args

    def load(self, session_id: str, *, events: bool = True) -> StoredSession | None:
        fields_key, events_key, _ = self._keys(session_id)
        with self._reachable():
            if events:
                with self._client.pipeline(transaction=True) as pipe:
                    pipe.hgetall(fields_key)
                    pipe.xrange(events_key)
                    raw_fields, raw_events = pipe.execute()
            else:
                raw_fields, raw_events = self._client.hgetall(fields_key), []
        if not raw_fields:
            return None
        return StoredSession(
            session_id=session_id,
            epoch=int(raw_fields[b"epoch"]),
            record=session_record(raw_fields),
            # redis-py's cluster transaction leaves XRANGE's reply as Redis
            # sent it (a script's shape); its single-node pipeline parses it.
            events=script_events(raw_events)
            if raw_events and isinstance(raw_events[0][1], list)
            else stream_events(raw_events),
        )

    def acquire(self, session_id: str, expect_token_digest: bytes) -> StoredSession | None:
        args = [self._lease_ms, self._ttl_ms, expect_token_digest.hex()]
        if self.durability_replicas:
            taken = self._durable_write(self._acquire, self._keys(session_id), args)
        else:
            taken = self._run(self._acquire, self._keys(session_id), args)
        if not taken:
            return None
        flat, raw_events = taken
        raw_fields = dict(zip(flat[::2], flat[1::2], strict=True))
        return StoredSession(
            session_id=session_id,
            epoch=int(raw_fields[b"epoch"]),
            record=session_record(raw_fields),
            events=script_events(raw_events),
        )

    def renew(self, session_id: str, epoch: int) -> bool:
        renewed = self._run(
            self._renew, self._keys(session_id), [epoch, self._lease_ms, self._ttl_ms]
        )
        return bool(renewed == 1)

    def renew_many(self, leases: Sequence[tuple[str, int]]) -> list[bool | StoreUnavailableError]:
        """`renew` for each ``(session_id, epoch)``: pipelines of `RENEW_BATCH`
        scripts (one round trip each), not one round trip per session.

        Each lease is answered alone: ``True`` (renewed), ``False`` (another
        epoch owns it, or its lease ran out) or `StoreUnavailableError` (its
        node could not be reached: on a cluster, only the sessions of a node
        that is down or failing over; a single Redis that is down, all of that
        pipeline's). An unavailable answer costs no other session its answer,
        refusals included; the next sweep tries that lease again.
        """
        renewed: list[bool | StoreUnavailableError] = []
        for first in range(0, len(leases), RENEW_BATCH):
            batch = leases[first : first + RENEW_BATCH]
            calls = [
                (self._keys(session_id), [epoch, self._lease_ms, self._ttl_ms])
                for session_id, epoch in batch
            ]
            try:
                with self._reachable():
                    results: list[Any] = self._pipelined(self._renew, calls)
            except StoreUnavailableError as unavailable:
                results = [unavailable] * len(calls)
            for result in results:
                if isinstance(result, StoreUnavailableError):
                    renewed.append(result)
                elif isinstance(result, Exception):
                    raise result  # not an outage: a bug, loud
                else:
                    renewed.append(result == 1)
        return renewed

    def fence(self, session_id: str, epoch: int, nonce: str) -> StoredSession:
        """See `BatchingStore.fence`: one script, the owner's next epoch, the
        fields as they are (``nonce``: the same for each try of one fence).

        With `durability_replicas` it waits for them as a commit does: a
        commit found applied is answered only once replicas hold it."""
        keys = self._keys(session_id)
        with self._reachable(wrote=True):
            (reply,) = self._pipelined(
                self._fence, [(keys, [epoch, self._lease_ms, self._ttl_ms, nonce])], durable=True
            )
        if isinstance(reply, BaseException):
            raise reply
        if not isinstance(reply, list):
            raise commit_refusal(reply, session_id) or RuntimeError("a fence answered 1")
        raw_fields = dict(zip(reply[::2], reply[1::2], strict=True))
        return StoredSession(
            session_id=session_id,
            epoch=int(raw_fields[b"epoch"]),
            record=session_record(raw_fields),
            events=(),
        )

    def delete(self, session_id: str, epoch: int) -> None:
        self._run(self._delete, self._keys(session_id), [epoch])

    def bind_identity(self, session_id: str, fingerprint: str) -> None:
        """See `SessionStore.bind_identity` (a field ``idn`` of the session's hash)."""
        self._run(self._bind_identity, self._keys(session_id), [fingerprint])

    def bound_identity(self, session_id: str) -> str | None:
        """See `SessionStore.bound_identity`."""
        with self._reachable():
            value = self._client.hget(self._keys(session_id)[0], "idn")
        return None if value is None else bytes(cast(bytes, value)).decode()

    def claim_input(self, session_id: str, claimant: str, key: str) -> bool | None:
        """See `SessionStore.claim_input` (one script, atomic)."""
        if not claimant:
            raise ValueError("a claimant is a non-empty name")
        claimed = self._run(
            self._claim_input, self._keys(session_id), [claimant, key, self._ttl_ms]
        )
        return None if claimed == -1 else claimed == 1

    def record_client_seq(self, session_id: str, client_seq: int) -> None:
        """See `SessionStore.record_client_seq` (fields ``cs`` and ``ch`` of the
        session's hash)."""
        self._run(self._record_client_seq, self._keys(session_id)[:1], [client_seq])

    def client_watermark(self, session_id: str) -> ClientWatermark:
        """See `SessionStore.client_watermark` (one HMGET: both fields at once)."""
        with self._reachable():
            last, runs = cast(
                list[bytes | None], self._client.hmget(self._keys(session_id)[0], ["cs", "ch"])
            )
        return ClientWatermark(
            last_client_seq=0 if last is None else int(last),
            handled_above=parse_runs("" if runs is None else runs.decode()),
        )

    def last_client_seq(self, session_id: str) -> int:
        """The stored watermark alone: every client event through it was handled
        (`client_watermark` also gives the handled runs above it)."""
        return self.client_watermark(session_id).last_client_seq

    def ping(self) -> None:
        """Raise `StoreUnavailableError` unless Redis answers."""
        with self._reachable():
            self._client.ping()

    def close(self) -> None:
        if isinstance(self._client, _redis_cluster.RedisCluster):
            _redis_cluster.close_cluster(self._client)
            return
        self._client.close()
        if self._pool is not None:
            self._pool.disconnect()  # a pool given to redis.Redis is not closed with it
