"""The Redis Cluster client behind a ``redis+cluster://`` URL (`RedisStore`),
and the store's pipelined scripts on one Redis or a cluster (`send_scripts`).

``redis+cluster://[user:password@]host:port[,host:port...]`` (or
``rediss+cluster://`` for TLS) names some nodes of one cluster; redis-py's
`redis.cluster.RedisCluster` asks them for the slot map and then talks to
every primary itself. The store's keys carry one hash tag per session
(``<prefix>{<id>}:f``), so each script touches one slot; a batch of many
sessions' scripts is split per node (one round trip each, written to all
nodes before any reply is read).

The store sends its scripts itself (`send_scripts`), one connection per
node, and never lets redis-py send a write again: redis-py's cluster client
does after a connection error (a pipeline's commands one by one, a single
command up to its retry count), and a commit the killed primary had already
run and replicated then ran twice, its second run refused as if another
process held the session. A call is sent again only when its node surely did
not run it: no connection could be had, or the node answered MOVED, ASK or
READONLY (its slot is served elsewhere now); the slot map is read again
first. What still fails is answered per call: the store answers
`StoreUnavailableError` for it (`StoreOutcomeUnknownError` for a write that
may have run), as for a single Redis that cannot be reached. Reads go
through redis-py's client, retries and all.
"""

from __future__ import annotations

import contextlib
import inspect
import math
import time
import weakref
from typing import Any
from urllib.parse import unquote

import redis
import redis.exceptions
from redis.cluster import ClusterNode, NodesManager, RedisCluster

_hiredis: Any
try:
    import hiredis as _hiredis
except ModuleNotFoundError:  # redis-py without its [hiredis] extra
    _hiredis = None

__all__ = [
    "UNREACHABLE",
    "Pool",
    "RedisCluster",
    "close_cluster",
    "cluster_client",
    "is_cluster_url",
    "nothing_sent",
    "refused_for_replicas",
    "run_script",
    "send_scripts",
    "where",
]

_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}

#: What a Redis (or a cluster) that cannot serve a call raises: a node down or
#: timing out, a failover under way (CLUSTERDOWN, TRYAGAIN), a slot no node
#: covers, redirections that never settled, a write sent to a node that is a
#: replica now (READONLY: a failed primary back after the promotion).
UNREACHABLE: tuple[type[BaseException], ...] = (
    redis.exceptions.ConnectionError,
    redis.exceptions.ReadOnlyError,
    redis.exceptions.TimeoutError,
    redis.exceptions.ClusterError,
    redis.exceptions.ClusterDownError,
    redis.exceptions.TryAgainError,
    redis.exceptions.AskError,
    redis.exceptions.RedisClusterException,
)


class Pool(redis.BlockingConnectionPool):
    """redis-py's blocking pool, marking what it raises while it hands out a
    connection (none free, a connect refused, a handshake that failed): no
    command of ours was sent then, so no write can have been applied
    (`nothing_sent`). A failure after that (a reply lost to a broken
    connection, a read timeout) leaves a write's outcome unknown."""

    def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().get_connection(*args, **kwargs)  # type: ignore[no-untyped-call]
        except redis.exceptions.RedisError as exc:
            setattr(exc, _NOTHING_SENT, True)
            raise


_NOTHING_SENT = "_duplex_nothing_sent"


def nothing_sent(error: BaseException) -> bool:
    """Whether ``error`` was raised before a command of ours left (see `Pool`)."""
    return bool(getattr(error, _NOTHING_SENT, False))


def refused_for_replicas(error: BaseException) -> bool:
    """A primary with fewer good replicas than its ``min-replicas-to-write``
    refusing a write (NOREPLICAS), before the write changed anything."""
    return isinstance(error, redis.exceptions.ResponseError) and str(error).startswith("NOREPLICAS")


def run_script(
    client: redis.Redis | RedisCluster, script: Any, keys: list[str], args: list[Any]
) -> Any:
    """One call of ``script`` (a registered `redis.commands.core.Script`) on
    its keys' node, by EVALSHA. A node that lacks the script (a restart, a
    replica just promoted: Redis does not replicate its script cache) runs it
    by EVAL, routed by the same keys, which also leaves it in that node's
    cache. Not loaded on "every primary" first: redis-py's `Script` does that
    and fails whole while one is down, and during a failover the client's map
    of primaries can miss the promoted one, which then answers NOSCRIPT again.

    On a cluster it goes as a batch does (`send_scripts`), never through
    redis-py's cluster client, which would send it again after a broken
    connection: the error is raised instead (a write in doubt)."""
    if isinstance(client, RedisCluster):
        for command in (("EVALSHA", script.sha), ("EVAL", script.script)):
            (reply,), _ = send_scripts(client, command, [(keys, args)], wait_replicas=0, wait_ms=0)
            if not isinstance(reply, redis.exceptions.NoScriptError):
                break
        if isinstance(reply, BaseException):
            raise reply
        return reply
    try:
        return client.evalsha(script.sha, len(keys), *keys, *args)
    except redis.exceptions.NoScriptError:  # nothing ran
        return client.eval(script.script, len(keys), *keys, *args)


def is_cluster_url(url: str) -> bool:
    return url.partition("://")[0].lower() in _SCHEMES


def _nodes(url: str) -> tuple[str, str, list[tuple[str, int]]]:
    """``(plain scheme, userinfo, [(host, port), ...])`` of a cluster URL."""
    scheme, _, rest = url.partition("://")
    plain = _SCHEMES[scheme.lower()]
    rest, _, query = rest.partition("?")
    if query:
        raise ValueError("a redis+cluster:// URL takes no query options")
    userinfo, _, hosts = rest.rpartition("@")
    hosts, _, database = hosts.partition("/")
    if database not in ("", "0"):
        raise ValueError("a Redis Cluster has only database 0")
    nodes: list[tuple[str, int]] = []
    for part in hosts.split(","):
        host, sep, port = part.strip().rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"a redis+cluster:// node is host:port, not {part.strip()!r}")
        nodes.append((host.strip("[]"), int(port)))
    return plain, userinfo, nodes


def where(url: str) -> str:
    """The nodes of a cluster URL, for messages: never its password."""
    _, _, nodes = _nodes(url)
    return "cluster " + ",".join(f"{host}:{port}" for host, port in nodes)


def cluster_client(url: str, *, max_connections: int, timeout_s: float) -> RedisCluster:
    """A `RedisCluster` on the nodes of ``url``: per node at most
    ``max_connections`` connections, a caller past them waiting up to
    ``timeout_s`` (a blocking pool, as the single-node store has).

    It connects now (redis-py loads the slot map in its constructor): an
    unreachable cluster raises one of `UNREACHABLE` here.
    """
    plain, userinfo, nodes = _nodes(url)
    (first_host, first_port), others = nodes[0], nodes[1:]
    credentials = f"{userinfo}@" if userinfo else ""
    host = f"[{first_host}]" if ":" in first_host else first_host
    # Through url= (not startup_nodes alone) so redis-py builds each node's
    # pool from connection_pool_class with these options.
    return RedisCluster(
        url=f"{plain}://{credentials}{host}:{first_port}/0",
        startup_nodes=[ClusterNode(unquote(h), p) for h, p in others],  # type: ignore[no-untyped-call]
        connection_pool_class=Pool,
        max_connections=max_connections,
        timeout=timeout_s,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
    )


def close_cluster(cluster: RedisCluster) -> None:
    """Close ``cluster`` and its nodes' connections: redis-py's ``close`` leaves
    open the sockets of each node's pool (a pool given to a node's client is
    not closed with it), until the garbage collector finds them."""
    nodes = {id(node): node for node in cluster.nodes_manager.startup_nodes.values()}
    nodes.update((id(node), node) for node in cluster.get_nodes())  # type: ignore[no-untyped-call]
    cluster.close()
    for node in nodes.values():
        if node.redis_connection is not None:
            node.redis_connection.connection_pool.disconnect()


def send_scripts(
    client: redis.Redis | RedisCluster,
    script: tuple[str, str],
    calls: list[tuple[list[str], list[Any]]],
    *,
    wait_replicas: int,
    wait_ms: int,
) -> tuple[list[Any], list[bool]]:
    """Run ``script``, ``("EVALSHA", sha)`` or ``("EVAL", text)``, once per
    ``(keys, args)`` in one round trip: each reply (or the error answered for
    that call alone), and for each whether ``wait_replicas`` replicas
    acknowledged it (always, when 0).

    A call is never sent twice when it may have run: a connection that broke
    after a node's commands left answers each of them with that error (the
    caller fences a write in doubt). On a cluster, each node's calls go on one
    connection of its own, written to every node before any reply is read; a
    node that is down fails only its own calls (the sessions on the other
    primaries do not notice its failover). Calls a node surely did not run (no
    connection to it could be had; MOVED, ASK or READONLY: the slot is served
    elsewhere now) are sent once more, on a slot map read again.
    """
    wait = (wait_replicas, wait_ms)
    if not isinstance(client, RedisCluster):
        return _send_plain(client, script, calls, wait)
    replies, acked = _send_by_node(client, script, calls, wait)
    again = [i for i, reply in enumerate(replies) if _not_run(reply)]
    if again:
        _reload_slot_map(client)
        resent = _send_by_node(client, script, [calls[i] for i in again], wait)
        for i, reply, acknowledged in zip(again, *resent, strict=True):
            replies[i], acked[i] = reply, acknowledged
    return replies, acked


#: Answers of a node that did not run the command: the slot moved, or the
#: node is a replica now (a failed primary back after its replica's promotion).
_ELSEWHERE = (redis.exceptions.AskError, redis.exceptions.ReadOnlyError)


def _not_run(reply: object) -> bool:
    return isinstance(reply, _ELSEWHERE) or (
        isinstance(reply, BaseException) and nothing_sent(reply)
    )


#: The slot map is read again at most this often per client: each reload asks
#: the nodes for CLUSTER SLOTS, and during a failover every batch meets the
#: dead node.
RELOAD_EVERY_S = 0.1

_reloaded_at: weakref.WeakKeyDictionary[RedisCluster, float] = weakref.WeakKeyDictionary()

#: Whether this redis-py's reload can be told to leave idle connections open.
_RELOAD_KEEPS_POOLS = (
    "disconnect_startup_nodes_pools" in inspect.signature(NodesManager.initialize).parameters
)


def _reload_slot_map(cluster: RedisCluster) -> None:
    """Ask the cluster for its slot map again (a failover moved a primary).

    Without closing the nodes' idle connections where redis-py can be told
    so: it closes them by default, and a thread taking one from its pool at
    that moment met a socket already gone (``TypeError`` from redis-py's
    hiredis parser, seen in ``demo --redis cluster-local``)."""
    now = time.monotonic()
    if now - _reloaded_at.get(cluster, -math.inf) < RELOAD_EVERY_S:
        return
    _reloaded_at[cluster] = now
    manager = cluster.nodes_manager
    with contextlib.suppress(*UNREACHABLE):
        if _RELOAD_KEEPS_POOLS:
            manager.initialize(disconnect_startup_nodes_pools=False)
        else:  # an older redis-py
            manager.initialize()


def _packed(connection: Any, commands: list[tuple[Any, ...]]) -> list[bytes]:
    # hiredis packs str, bytes and int as they are: every argument here is one.
    if _hiredis is not None:
        return [b"".join([_hiredis.pack_command(command) for command in commands])]
    return list(connection.pack_commands(commands))


def _read_replies(connection: Any, count: int) -> list[Any]:
    """``count`` replies; an error reply is that command's answer alone."""
    replies: list[Any] = []
    for _ in range(count):
        try:
            replies.append(connection.read_response())
        except redis.exceptions.ResponseError as exc:
            replies.append(exc)
    return replies


def _commands(
    script: tuple[str, str], calls: list[Any], wait: tuple[int, int]
) -> list[tuple[Any, ...]]:
    commands: list[tuple[Any, ...]] = [(*script, len(keys), *keys, *args) for keys, args in calls]
    if wait[0]:
        commands.append(("WAIT", *wait))
    return commands


def _acknowledged(replies: list[Any], wait: tuple[int, int]) -> tuple[list[Any], bool]:
    """The scripts' replies, and whether WAIT (the last reply) says enough replicas
    hold them (always, with no WAIT)."""
    if not wait[0]:
        return replies, True
    waited = replies.pop()
    return replies, not isinstance(waited, Exception) and int(waited) >= wait[0]


def _send_plain(
    client: redis.Redis, script: tuple[str, str], calls: list[Any], wait: tuple[int, int]
) -> tuple[list[Any], list[bool]]:
    """`send_scripts` on one Redis: the commands packed and written at once on
    one connection of the pool, then each reply read. Not redis-py's
    `Pipeline`: its per-command objects, callbacks, retry wrapper and
    argument checks (a generator per command) cost more than the round trip's
    own work at the hundreds of batches a second a committer sends, and it
    would send a batch again after a broken connection, where a write's
    outcome must be unknown instead (the caller fences it)."""
    commands = _commands(script, calls, wait)
    pool = client.connection_pool
    connection: Any = pool.get_connection()
    try:
        connection.send_packed_command(_packed(connection, commands), check_health=False)
        replies = _read_replies(connection, len(commands))
    except BaseException:
        connection.disconnect()
        raise
    finally:
        pool.release(connection)
    replies, acked = _acknowledged(replies, wait)
    return replies, [acked] * len(calls)


def _send_by_node(
    cluster: RedisCluster, script: tuple[str, str], calls: list[Any], wait: tuple[int, int]
) -> tuple[list[Any], list[bool]]:
    """`send_scripts` on a cluster, one pass: each call routed by our slot map
    to its node; with ``wait``, a ``WAIT`` after each node's scripts on the
    same connection (it counts that connection's writes).

    Not redis-py's cluster pipeline: after a connection error it sends the
    node's commands again one by one (and its single commands up to its retry
    count), so a commit the failed primary had run and replicated ran twice,
    its second run refused as if the session had moved (read in its
    ``cluster.py``, ``_send_cluster_commands``)."""
    replies: list[Any] = [None] * len(calls)
    acked = [False] * len(calls)
    by_node: dict[str, tuple[Any, list[int]]] = {}
    for i, (keys, _) in enumerate(calls):
        try:
            node = cluster.get_node_from_key(keys[0])  # type: ignore[no-untyped-call]
        except UNREACHABLE as exc:  # no node serves its slot (yet): not sent
            setattr(exc, _NOTHING_SENT, True)
            replies[i] = exc
            continue
        by_node.setdefault(node.name, (node, []))[1].append(i)
    sent: list[tuple[Any, Any, list[int], int]] = []
    try:
        for node, indexes in by_node.values():
            pool = cluster.get_redis_connection(node).connection_pool
            commands = _commands(script, [calls[i] for i in indexes], wait)
            try:
                connection: Any = pool.get_connection()  # marked nothing_sent if it fails
            except UNREACHABLE as exc:
                for i in indexes:
                    replies[i] = exc
                continue
            try:
                connection.send_packed_command(_packed(connection, commands), check_health=False)
            except BaseException as exc:
                connection.disconnect()
                pool.release(connection)
                if not isinstance(exc, UNREACHABLE):
                    raise
                for i in indexes:  # some of it may have left: each in doubt
                    replies[i] = exc
                continue
            sent.append((pool, connection, indexes, len(commands)))
    except BaseException:
        for pool, connection, _, _ in sent:
            connection.disconnect()
            pool.release(connection)
        raise
    for pool, connection, indexes, count in sent:
        try:
            node_replies, node_acked = _acknowledged(_read_replies(connection, count), wait)
        except UNREACHABLE as exc:  # after its commands left: each in doubt
            connection.disconnect()
            node_replies, node_acked = [exc] * len(indexes), False
        except BaseException:
            connection.disconnect()
            raise
        finally:
            pool.release(connection)
        for i, reply in zip(indexes, node_replies, strict=True):
            replies[i], acked[i] = reply, node_acked
    return replies, acked
