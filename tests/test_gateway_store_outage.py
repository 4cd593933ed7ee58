"""The session store away while clients leave: nothing stays behind.

A real redis-server is killed while the gateway's clients leave, and brought
back: every session ends up detached with its disconnect grace running (then
expired, its place given back), the leave is retried on a timer, not in a
busy loop, and no handler fails with a traceback. A takeover while a
connection leaves is a normal path: logged at INFO, never a traceback, and the
old owner is told 4000 ``replaced``.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import pytest
import trio

from actors._store import Commit
from supervisor._faults import FaultPlan
from supervisor._options import RegistryOptions
from supervisor.cli._wire_client import WireClient
from supervisor.gateway._auth import Authenticate, Handshake
from supervisor.gateway._engine import EngineConfig
from supervisor.gateway._server import Gateway, GatewayConfig, serve_gateway
from supervisor.redis_store import RedisStore
from tests.gateway_support import read_until, read_until_closed
from tests.redis_support import RedisServer

GRACE_S = 1.0


@asynccontextmanager
async def gateway_on(
    store: RedisStore, authenticate: Authenticate | None = None, faults: FaultPlan | None = None
) -> AsyncIterator[Gateway]:
    options = RegistryOptions(
        replay_ttl_s=600,
        replay_max_bytes_per_session=1 << 20,
        disconnect_grace_s=GRACE_S,
        sweep_interval_s=0.1,
        passivate_after_s=None,
        store=store,
    )
    async with trio.open_nursery() as nursery:
        gateway: Gateway = await nursery.start(
            lambda task_status: serve_gateway(
                GatewayConfig(port=0),
                engine_config=EngineConfig(event_rate_hz=0),
                registry_options=options,
                authenticate=authenticate,
                faults=faults,
                task_status=task_status,
            )
        )
        yield gateway
        nursery.cancel_scope.cancel()


async def _open(gateway: Gateway) -> tuple[WireClient, str, str]:
    client = await WireClient.connect(gateway.url, answer_pings=True)
    await client.send_json({"type": "session.open"})
    created = await client.receive_json()
    assert created["type"] == "session.created", created
    return client, str(created["session_id"]), str(created["resume_token"])


def _handler_failures(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]


class CountingStore(RedisStore):
    """A real RedisStore that counts its commits (a busy loop would be thousands),
    written alone or many at once (a registry's committer)."""

    commits = 0

    def commit(self, commit: Commit) -> None:
        self.commits += 1
        super().commit(commit)

    def commit_many(self, commits: Sequence[Commit]) -> list[BaseException | None]:
        self.commits += len(commits)
        return super().commit_many(commits)


async def test_leaving_while_the_store_is_down_detaches_once_it_is_back(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="duplex_supervisor")
    store = CountingStore(redis_server.url, timeout_s=0.3)
    with trio.fail_after(60):
        async with gateway_on(store) as gateway:
            opened = [await _open(gateway) for _ in range(5)]
            registry = gateway.service.registry
            assert registry.stats().attached == 5
            await trio.to_thread.run_sync(redis_server.kill)
            before = store.commits
            for client, _, _ in opened:
                await client.cut()
            # The leaves meet the outage: they wait on a timer, still attached.
            await trio.sleep(1.5)
            assert registry.stats().attached == 5
            during = store.commits - before
            await trio.to_thread.run_sync(redis_server.start)
            while registry.stats().attached:
                await trio.sleep(0.05)
            # Each leave retries on its own timer: the first detached may have
            # expired already (its grace is 1 s) before the last one detached.
            stats = registry.stats()
            assert stats.detached + stats.sessions_expired == 5
            # The grace runs from the detach: the sessions expire, their
            # places come back.
            while registry.session_ids():
                await trio.sleep(0.05)
            assert gateway.service.admission.sessions.total == 0
            assert gateway.service.connections_open() == 0
    store.close()
    assert _handler_failures(caplog) == []
    # A timer, not a busy loop: a few tries per session in 1.5 s of outage.
    assert 5 <= during <= 5 * 6


async def _resume(gateway: Gateway, session_id: str, token: str) -> WireClient:
    client = await WireClient.connect(gateway.url, answer_pings=True)
    await client.send_json(
        {
            "type": "session.resume",
            "session_id": session_id,
            "resume_token": token,
            "last_received_server_event_seq": 0,
        }
    )
    return client


async def _takeover(a: Gateway, b: Gateway) -> tuple[WireClient, WireClient, int]:
    """A session opened on ``a``, answered once there, then resumed on ``b``
    (which takes it over through the store; ``a`` has not heard yet)."""
    old, session_id, token = await _open(a)
    await old.send_json({"type": "input", "client_event_id": "i1", "text": "hi"})
    seq = 0
    while True:
        frame = await old.receive_json()
        if frame.get("type") == "response.done":
            seq = int(frame["server_event_seq"])  # type: ignore[call-overload]
            break
    new = await _resume(b, session_id, token)
    resumed = await new.receive_json()
    assert resumed["type"] == "session.resumed", resumed
    return old, new, seq


async def test_a_takeover_while_leaving_is_info_without_a_traceback(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="duplex_supervisor")
    store_a, store_b = RedisStore(redis_server.url), RedisStore(redis_server.url)
    with trio.fail_after(60):
        async with gateway_on(store_a) as a, gateway_on(store_b) as b:
            old, new, _ = await _takeover(a, b)
            await old.cut()  # a's detach meets the takeover
            while a.service.registry.session_ids():
                await trio.sleep(0.05)
            assert b.service.registry.stats().attached == 1
            await new.cut()
    store_a.close()
    store_b.close()
    assert _handler_failures(caplog) == []
    assert any("taken over" in r.getMessage() for r in caplog.records)


async def test_the_old_owner_is_told_replaced_whichever_call_learns_it(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    store_a, store_b = RedisStore(redis_server.url), RedisStore(redis_server.url)
    with trio.fail_after(60):
        async with gateway_on(store_a) as a, gateway_on(store_b) as b:
            old, new, seq = await _takeover(a, b)
            # The old client acknowledges: a's write is refused (another epoch).
            await old.send_json({"type": "ack", "server_event_seq": seq})
            frames, closed = await read_until_closed(old)
            await old.cut()
            assert (closed.code, closed.reason) == (4000, "replaced"), frames
            await new.cut()
    store_a.close()
    store_b.close()
    assert _handler_failures(caplog) == []


class DyingStore(RedisStore):
    """A real RedisStore whose Redis is killed as an open binds its identity:
    the open fails after its session was created, and its rollback close meets
    the outage too."""

    def __init__(self, server: RedisServer) -> None:
        super().__init__(server.url, timeout_s=0.3)
        self.server = server

    def bind_identity(self, session_id: str, fingerprint: str) -> None:
        self.server.kill()
        super().bind_identity(session_id, fingerprint)


def _a_user(handshake: Handshake) -> object:
    return "a-user"


async def test_an_open_rolled_back_while_the_store_is_down_leaves_no_session(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    # The open fails after its create (the store died as it bound the
    # identity); its rollback close crashes once: like a leave's close, it is
    # tried again, not given up with the session left routed to a dead socket.
    caplog.set_level(logging.INFO, logger="duplex_supervisor")
    store = DyingStore(redis_server)
    faults = FaultPlan()
    faults.crash("close.enter", times=1)
    with trio.fail_after(60):
        async with gateway_on(store, authenticate=_a_user, faults=faults) as gateway:
            client = await WireClient.connect(gateway.url, answer_pings=True)
            await client.send_json({"type": "session.open"})
            frames, _ = await read_until_closed(client)
            assert [f.get("type") for f in frames] == ["error"], frames
            await client.cut()
            await trio.to_thread.run_sync(redis_server.start)
            registry = gateway.service.registry
            with trio.move_on_after(5):
                while registry.session_ids():
                    await trio.sleep(0.05)
            assert registry.session_ids() == []
            assert registry.stats().attached == 0
            assert gateway.service.admission.sessions.total == 0
    store.close()
    assert _handler_failures(caplog) == []


async def test_an_ack_the_store_cannot_take_keeps_the_connection(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    # Acks are cumulative: one the store could not take is covered by the
    # next; the connection and its session go on.
    store = RedisStore(redis_server.url, timeout_s=0.3)
    with trio.fail_after(60):
        async with gateway_on(store) as gateway:
            client, _, _ = await _open(gateway)
            await client.send_json({"type": "input", "client_event_id": "i1", "text": "hi"})
            done = await read_until(client, "response.done")
            seq = done[-1]["server_event_seq"]
            await trio.to_thread.run_sync(redis_server.kill)
            await client.send_json({"type": "ack", "server_event_seq": seq})
            await trio.sleep(1)
            await trio.to_thread.run_sync(redis_server.start)
            await client.send_json({"type": "input", "client_event_id": "i2", "text": "hi"})
            frames = await read_until(client, "response.done")
            assert frames[-1]["client_event_id"] == "i2", frames
            await client.send_json(
                {"type": "ack", "server_event_seq": frames[-1]["server_event_seq"]}
            )
            await client.cut()
    store.close()
    assert _handler_failures(caplog) == []


async def test_opens_and_resumes_the_store_cannot_take_are_answered_store_unavailable(
    redis_server: RedisServer,
) -> None:
    # Answered at once (not held until the store returns), with a code a
    # client retries; nothing changed: once the store is back the same token
    # resumes the session.
    store = RedisStore(redis_server.url, timeout_s=0.3)
    with trio.fail_after(60):
        async with gateway_on(store) as gateway:
            client, session_id, token = await _open(gateway)
            await trio.to_thread.run_sync(redis_server.kill)
            await client.cut()
            refused = await _resume(gateway, session_id, token)
            frames, closed = await read_until_closed(refused)
            assert [f.get("code") for f in frames] == ["store_unavailable"], frames
            assert (closed.code, closed.reason) == (4503, "store_unavailable")
            await refused.cut()
            opener = await WireClient.connect(gateway.url)
            await opener.send_json({"type": "session.open"})
            frames, closed = await read_until_closed(opener)
            await opener.cut()
            assert [f.get("code") for f in frames] == ["store_unavailable"], frames
            assert gateway.service.admission.sessions.total == 1
            await trio.to_thread.run_sync(redis_server.start)
            back = await _resume(gateway, session_id, token)
            resumed = await back.receive_json()
            assert resumed["type"] == "session.resumed", resumed
            await back.cut()
    store.close()
