"""The engine bus on Redis Streams: gateways feed engine workers in other processes.

Keys, all under one hash tag per engine pool (``<prefix>{<pool>}``), so every
script touches one slot:

* ``:in``, a stream: what gateways say to the pool's engines
  (`supervisor.messages.GatewayMessage`), read by the workers as one
  consumer group, ``workers``. An entry stays pending under the worker that
  read it until that worker acknowledges it (an input once answered, an
  ``open`` once ``engine.start`` returned). A worker heartbeats what it
  holds; an entry idle past the visibility timeout (its worker died or
  stopped) is claimed by another worker (``XAUTOCLAIM``) and done again.
* ``:out:<gateway>``, a stream per gateway process: the engine messages for
  the sessions it owns.
* ``:owner`` and ``:lease``, hashes: per session, the gateway that owns it
  and its lease generation (grows at each `claim_session`: an open, or a
  takeover by another process).
* ``:seen:<session>``, a set: the idempotency keys published for it.
* ``:types``, a set: the client event types the workers' engine takes.
* ``:counts``, a hash: ``redelivered``, ``fenced``, ``duplicates``.

A worker's `publish` is one Lua script (`supervisor._engine_bus_scripts`
holds them all), so it is atomic: it refuses (and counts as fenced) a
message for an entry that is no longer pending under that worker (another
worker claimed it: this one is late) or from a lease generation older than
the session's; it drops (and counts) a ``message_id`` already published;
else it appends the message to the owner's stream. So a redelivered input
answered twice is journaled once, and a late worker never writes into a
session that moved on.

Every script declares every key it touches (``KEYS``), as Redis requires of
a script that runs on a cluster: the owner's stream is named by the caller,
from the owner it last saw for the session (remembered per session, or read
first), and the script refuses (``moved``, changing nothing) when the
session's owner is another by then; the caller sends it again to the owner
the script answered. So the bus runs on one Redis (or Valkey) node or on a
Redis Cluster (``redis+cluster://host:port[,host:port...]``, the URL forms
`supervisor.redis_store.RedisStore` takes, through the same
`supervisor.stores._redis_cluster` client): a pool's keys share one hash tag,
so they are all on one slot, served by one primary; different pools may land
on different primaries. A node that cannot serve a call (down, failing over,
``CLUSTERDOWN``, MOVED while the slot map settles) is `StoreUnavailableError`,
which the gateway and the workers call again (`call_until_reachable`).

Nothing waits for replicas (the store's ``durability_replicas`` is not the
bus's): a failover of the pool's primary can lose the writes its replica had
not received yet (see the README's "Engines in other processes").
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Literal, cast

from actors._errors import StoreUnavailableError
from supervisor._engine_bus_callers import (
    RETRY_S,  # noqa: F401 - importable from here, as before
    Delivery,
    LeaseFence,
    T,  # noqa: F401 - importable from here, as before
    call_until_reachable,
)
from supervisor._engine_bus_scripts import CLAIM as _CLAIM
from supervisor._engine_bus_scripts import HOLD as _HOLD
from supervisor._engine_bus_scripts import PUBLISH as _PUBLISH
from supervisor._engine_bus_scripts import RELEASE as _RELEASE
from supervisor.messages import (
    EngineMessage,
    GatewayMessage,
    MessageError,
    decode,
    encode,
)

try:
    import redis
    import redis.crc
    import redis.exceptions

    from supervisor.stores import _redis_cluster
except ModuleNotFoundError:  # pragma: no cover - the redis extra is not installed
    redis = None  # type: ignore[assignment]

__all__ = [
    "DEFAULT_VISIBILITY_S",
    "Delivery",
    "LeaseFence",
    "PublishVerdict",
    "RedisEngineBus",
    "call_until_reachable",
]

logger = logging.getLogger("duplex_supervisor.supervisor")

#: How long an entry a worker holds may go without a heartbeat before
#: another worker claims it: what a dead worker's inputs wait, at most.
DEFAULT_VISIBILITY_S = 5.0

GROUP = "workers"
PublishVerdict = Literal["sent", "fenced", "stale", "duplicate", "orphaned"]

#: How many times `publish` follows a session's owner that changed between
#: its guess and its script (a takeover each time) before it says so.
OWNER_CHASES = 8

#: Sessions whose owner a bus remembers for `publish` (the oldest forgotten).
OWNERS_REMEMBERED = 4096


def _stream_entries(answer: Any) -> list[Any]:
    """The entries of an ``XREAD``/``XREADGROUP`` answer (RESP2 list or RESP3 map)."""
    streams = answer.values() if isinstance(answer, dict) else [s[1] for s in answer or ()]
    return [entry for entries in streams for entry in entries]


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class RedisEngineBus:
    """The bus of one engine pool on one Redis or a Redis Cluster; safe to
    share between threads.

    ``url``: ``redis://`` (redis-py's URL), or ``redis+cluster://`` (the
    store's: `supervisor.stores._redis_cluster`, at most ``max_connections``
    per node, a caller past them waiting up to ``timeout_s``)."""

    def __init__(
        self,
        url: str,
        *,
        pool: str = "default",
        prefix: str = "duplex:bus:",
        visibility_s: float = DEFAULT_VISIBILITY_S,
        seen_ttl_s: float = 24 * 3600.0,
        timeout_s: float = 5.0,
        max_connections: int = 64,
    ) -> None:
        if redis is None:  # pragma: no cover
            raise StoreUnavailableError("redis-py is not installed")
        if visibility_s <= 0:
            raise ValueError("visibility_s must be > 0")
        self.visibility_s = visibility_s
        self._visibility_ms = int(visibility_s * 1000)
        self._seen_ttl_ms = int(seen_ttl_s * 1000)
        self._timeout_s = timeout_s
        self._base = f"{prefix}{{{pool}}}"
        if redis.crc.key_slot(f"{self._base}:in".encode()) != redis.crc.key_slot(
            f"{self._base}:out:x".encode()
        ):
            raise ValueError(
                f"the engine bus's keys {self._base!r}...: prefix and pool must give them "
                "one hash tag (a non-empty pool, no '{' or '}' in the prefix)"
            )
        self._in = f"{self._base}:in"
        self._lease = f"{self._base}:lease"
        self._owner = f"{self._base}:owner"
        self._counts = f"{self._base}:counts"
        self._types = f"{self._base}:types"
        self._client: redis.Redis | _redis_cluster.RedisCluster
        if _redis_cluster.is_cluster_url(url):
            self.where = _redis_cluster.where(url)  # never the password
            with self._reachable():
                self._client = _redis_cluster.cluster_client(
                    url, max_connections=max_connections, timeout_s=timeout_s
                )
        else:
            self.where = url.rsplit("@", 1)[-1]  # never the password
            self._client = redis.Redis.from_url(
                url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s
            )
        self._publish = self._client.register_script(_PUBLISH)
        self._hold = self._client.register_script(_HOLD)
        self._claim = self._client.register_script(_CLAIM)
        self._release = self._client.register_script(_RELEASE)
        self._group_ready = False
        # Per session, the owner `publish` last found: its guess of the stream.
        self._owners: OrderedDict[str, str] = OrderedDict()
        self._owners_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(where={self.where!r}, base={self._base!r})"

    def close(self) -> None:
        if isinstance(self._client, _redis_cluster.RedisCluster):
            _redis_cluster.close_cluster(self._client)  # its nodes' pools too
        else:
            self._client.close()

    @contextlib.contextmanager
    def _reachable(self) -> Iterator[None]:
        """Redis (or the pool's node of a cluster) unreachable, timing out or
        failing over, as `StoreUnavailableError`."""
        try:
            yield
        except _redis_cluster.UNREACHABLE as exc:
            self._group_ready = False  # a restarted Redis may have lost the group
            raise StoreUnavailableError(
                f"Redis at {self.where} is unavailable ({type(exc).__name__})"
            ) from None
        except redis.exceptions.ResponseError as exc:
            if not _redis_cluster.refused_for_replicas(exc):
                raise
            raise StoreUnavailableError(
                f"Redis at {self.where} is unavailable (too few replicas)"
            ) from None

    def _script(self, script: Any, keys: list[str], args: list[Any]) -> Any:
        return _redis_cluster.run_script(self._client, script, keys, args)

    def _read(self, key: str, *command: Any) -> Any:
        """``command`` (an XREAD or XREADGROUP of ``key`` alone) on ``key``'s
        node: redis-py's cluster client would first ask a server which keys
        such a command names (COMMAND GETKEYS, a round trip each time)."""
        if isinstance(self._client, _redis_cluster.RedisCluster):
            node = self._client.get_node_from_key(key)  # type: ignore[no-untyped-call]
            return self._client.execute_command(*command, target_nodes=node)  # type: ignore[no-untyped-call]
        return self._client.execute_command(*command)  # type: ignore[no-untyped-call]

    def _seen(self, session_id: str) -> str:
        return f"{self._base}:seen:{session_id}"

    def out_stream(self, gateway: str) -> str:
        return f"{self._base}:out:{gateway}"

    # -- the gateway's side ------------------------------------------------

    def claim_session(self, session_id: str, gateway: str) -> int:
        """Make ``gateway`` the session's owner; its new lease generation."""
        with self._reachable():
            return int(self._script(self._claim, [self._lease, self._owner], [session_id, gateway]))

    def release_session(self, session_id: str, gateway: str) -> bool:
        """The session ended here: engine messages for it are dropped from now on."""
        with self._reachable():
            keys = [self._lease, self._owner, self._seen(session_id)]
            return bool(self._script(self._release, keys, [session_id, gateway]))

    def submit(self, message: GatewayMessage) -> str:
        """Put ``message`` on the pool's input stream; its entry id."""
        with self._reachable():
            return _text(self._client.xadd(self._in, {"m": encode(message)}))

    def read_events(
        self, gateway: str, after: str, *, count: int = 256, block_s: float = 1.0
    ) -> list[tuple[str, EngineMessage]]:
        """Engine messages on ``gateway``'s stream after entry ``after`` (waits
        up to ``block_s`` for the first); undecodable entries are logged and skipped."""
        stream = self.out_stream(gateway)
        with self._reachable():
            block = max(1, int(block_s * 1000))
            answer: Any = self._read(
                stream, "XREAD", "COUNT", count, "BLOCK", block, "STREAMS", stream, after
            )
        found: list[tuple[str, EngineMessage]] = []
        for entry_id, fields in _stream_entries(answer):
            message = self._decoded(fields)
            if message is not None:
                found.append((_text(entry_id), cast(EngineMessage, message)))
        return found

    def trim_events(self, gateway: str, through: str) -> None:
        """Forget ``gateway``'s engine messages through entry ``through`` (applied)."""
        with self._reachable():
            self._client.xtrim(self.out_stream(gateway), minid=through, approximate=False)
            self._client.xdel(self.out_stream(gateway), through)

    # -- the worker's side -------------------------------------------------

    def _ensure_group(self) -> None:
        if self._group_ready:
            return
        try:
            self._client.xgroup_create(self._in, GROUP, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        self._group_ready = True

    def _decoded(self, fields: dict[Any, Any]) -> object:
        raw = fields.get(b"m", fields.get("m"))
        try:
            return decode(raw if raw is not None else b"")
        except MessageError as exc:
            logger.warning("engine bus: skipping a message that is not one: %s", exc)
            return None

    def receive(self, consumer: str, *, count: int = 16, block_s: float = 1.0) -> list[Delivery]:
        """What ``consumer`` should do next: entries another worker left idle past
        the visibility timeout first (claimed now), else new ones (waits up to
        ``block_s``). An entry that is not a message is acknowledged and skipped."""
        with self._reachable():
            self._ensure_group()
            claimed = self._client.xautoclaim(
                self._in, GROUP, consumer, self._visibility_ms, "0-0", count=count
            )
            entries = claimed[1] if claimed else []
            redelivered = bool(entries)
            if redelivered:
                self._client.hincrby(self._counts, "redelivered", len(entries))
            else:
                block = max(1, int(block_s * 1000))
                answer: Any = self._read(
                    self._in,
                    *("XREADGROUP", "GROUP", GROUP, consumer, "COUNT", count, "BLOCK", block),
                    *("STREAMS", self._in, ">"),
                )
                entries = _stream_entries(answer)
        deliveries: list[Delivery] = []
        for entry_id, fields in entries:
            message = self._decoded(fields or {})
            if message is None:
                self.acknowledge(consumer, [_text(entry_id)])
                continue
            deliveries.append(
                Delivery(
                    entry_id=_text(entry_id),
                    message=cast(GatewayMessage, message),
                    redelivered=redelivered,
                )
            )
        return deliveries

    def publish(self, consumer: str, entry_id: str, message: EngineMessage) -> PublishVerdict:
        """Send ``message``, produced by ``consumer`` for input entry ``entry_id``."""
        session_id = message.session_id
        keys = [self._in, self._lease, self._owner, self._counts, self._seen(session_id)]
        args: list[str | int | bytes] = [
            GROUP,
            consumer,
            entry_id,
            session_id,
            message.lease_generation,
            message.message_id,
            encode(message),
        ]
        with self._owners_lock:
            owner = self._owners.get(session_id, "")
        with self._reachable():
            self._ensure_group()
            for _ in range(OWNER_CHASES):
                # The script declares the stream it may write: the owner's, as guessed.
                out = self.out_stream(owner) if owner else f"{self._base}:out:"
                reply = self._script(self._publish, [*keys, out], [*args, owner, self._seen_ttl_ms])
                if not isinstance(reply, list):
                    self._remember_owner(session_id, owner)
                    return cast(PublishVerdict, _text(reply))
                owner = _text(reply[1])  # ['moved', the owner now]
        raise StoreUnavailableError(
            f"engine bus: session {session_id!r} changed owners {OWNER_CHASES} times "
            "during one publish"
        )

    def _remember_owner(self, session_id: str, owner: str) -> None:
        with self._owners_lock:
            if not owner:
                self._owners.pop(session_id, None)
                return
            self._owners[session_id] = owner
            self._owners.move_to_end(session_id)
            while len(self._owners) > OWNERS_REMEMBERED:
                self._owners.popitem(last=False)

    def heartbeat(self, consumer: str, entry_ids: Iterable[str]) -> int:
        """Keep what ``consumer`` holds from being claimed; how many it still holds."""
        return self._held(consumer, entry_ids, acknowledge=False)

    def acknowledge(self, consumer: str, entry_ids: Sequence[str]) -> int:
        """Done with ``entry_ids`` (only those ``consumer`` still holds)."""
        return self._held(consumer, entry_ids, acknowledge=True)

    def _held(self, consumer: str, entry_ids: Iterable[str], *, acknowledge: bool) -> int:
        ids = list(entry_ids)
        if not ids:
            return 0
        with self._reachable():
            self._ensure_group()
            args = [GROUP, consumer, "1" if acknowledge else "0", *ids]
            return int(self._script(self._hold, [self._in], args))

    def declare_event_types(self, types: Iterable[str]) -> None:
        """A worker says which client event types its engine takes."""
        names = sorted(types)
        if names:
            with self._reachable():
                self._client.sadd(self._types, *names)

    def workers_have_read(self) -> bool:
        """Whether a worker of the pool has read its input stream yet (its
        consumer group exists; the group starts at the stream's first entry,
        so what gateways sent before reaches the first worker)."""
        with self._reachable():
            try:
                groups = self._client.xinfo_groups(self._in)
            except redis.ResponseError:  # no stream yet
                return False
        return any(_text(g["name"]) == GROUP for g in groups)

    def declared_event_types(self) -> frozenset[str]:
        """What the pool's workers declared (`declare_event_types`)."""
        with self._reachable():
            return frozenset(_text(name) for name in self._client.smembers(self._types))

    # -- what happened -----------------------------------------------------

    def workers(self) -> dict[str, int]:
        """The pool's workers (each consumer that read the input stream) and how
        many entries each holds now; empty before the first worker read."""
        with self._reachable():
            try:
                found = self._client.xinfo_consumers(self._in, GROUP)
            except redis.ResponseError:  # no stream or no group yet
                return {}
        return {_text(c["name"]): int(c["pending"]) for c in found}

    def counts(self) -> dict[str, int]:
        """``redelivered``, ``fenced`` (by lease or a late worker), ``duplicates``."""
        with self._reachable():
            raw = self._client.hgetall(self._counts)
        counts = {"redelivered": 0, "fenced": 0, "duplicates": 0}
        counts.update({_text(k): int(v) for k, v in raw.items()})
        return counts
