"""Two gateways sharing one session store (in one process, a MemoryStore):
what each process keeps of a session it opened once another took it over.

* Its place: a session taken over frees the cap it held where it was opened.
* Its identity: a resume elsewhere must come from the identity that opened
  the session (bound in the store), and a wrong one takes nothing over.
* Its inputs: an input it claimed and never finished before losing the
  session is answered once when the session comes back to it.
* Its journal, when the store lost the last writes: a client beyond the
  store's head is answered ``journal_gap`` with reason ``store_lost``.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio

from supervisor._options import RegistryOptions
from supervisor.cli._wire_client import WireClient
from supervisor.gateway._auth import Handshake
from supervisor.gateway._engine import DemoEngine, Engine, EngineConfig, EngineSession
from supervisor.gateway._server import Gateway, GatewayConfig, serve_gateway
from supervisor.stores._memory import MemoryStore
from tests.gateway_support import LIMIT, errors, read_until, read_until_closed, seqs
from tests.test_store_lost_doors import lose_writes_after


def _user(handshake: Handshake) -> object:
    return handshake.headers.get("x-user")


class _HeldEngine:
    """Answers an input with its ``response.done``, or never while ``hold``."""

    def __init__(self) -> None:
        self.hold = True

    async def start(self, session: EngineSession) -> None:
        return None

    async def answer(self, session: EngineSession, client_event_id: str, text: str) -> None:
        if self.hold:
            await trio.sleep_forever()
        await session.send({"type": "response.done", "client_event_id": client_event_id})

    def stop(self, session_id: str) -> None:
        return None


@asynccontextmanager
async def _gateways(
    store: MemoryStore, *, authenticate: bool, engine: Engine | None = None
) -> AsyncIterator[list[Gateway]]:
    options = RegistryOptions(replay_ttl_s=60, replay_max_bytes_per_session=1 << 20, store=store)
    config = GatewayConfig(port=0, max_sessions=1)
    async with trio.open_nursery() as nursery:
        gateways = [
            await nursery.start(
                functools.partial(
                    serve_gateway,
                    config,
                    engine=engine or DemoEngine(EngineConfig(event_rate_hz=50)),
                    registry_options=options,
                    authenticate=_user if authenticate else None,
                )
            )
            for _ in range(2)
        ]
        yield gateways
        nursery.cancel_scope.cancel()


async def _open(url: str, user: str | None = None) -> tuple[WireClient, dict[str, object]]:
    client = await WireClient.connect(url, headers={"x-user": user} if user else None)
    await client.send_json({"type": "session.open"})
    first = await client.receive_json()
    return client, first


async def _resume(url: str, created: dict[str, object], user: str | None = None) -> WireClient:
    client = await WireClient.connect(url, headers={"x-user": user} if user else None)
    await client.send_json(
        {
            "type": "session.resume",
            "session_id": created["session_id"],
            "resume_token": created["resume_token"],
            "last_received_server_event_seq": 0,
        }
    )
    return client


async def _opens_once_free(url: str) -> None:
    """Open sessions at ``url`` until one is created: refused only as ``overloaded``."""
    while True:
        newcomer, answer = await _open(url)
        await newcomer.cut()
        if answer["type"] == "session.created":
            return
        assert answer.get("code") == "overloaded", answer
        await trio.sleep(0.05)


async def test_a_session_taken_over_frees_its_place_where_it_was_opened() -> None:
    with trio.fail_after(LIMIT):
        async with _gateways(MemoryStore(), authenticate=False) as (first, second):
            client, created = await _open(first.url)
            assert created["type"] == "session.created"
            other = await _resume(second.url, created)
            await read_until(other, "session.resumed")
            # The first gateway held its one place; its engine's next send is
            # refused (taken over): the place is free for a new session.
            await _opens_once_free(first.url)
            await other.cut()
            await client.cut()


async def test_a_resume_elsewhere_needs_the_identity_that_opened_the_session() -> None:
    store = MemoryStore()
    with trio.fail_after(LIMIT):
        async with _gateways(store, authenticate=True) as (first, second):
            client, created = await _open(first.url, "alice")
            assert created["type"] == "session.created"
            await read_until(client, "response.output_text.delta")
            intruder = await _resume(second.url, created, "mallory")  # the right token
            refused = await read_until(intruder, "error")
            assert refused[-1]["code"] == "unauthorized", refused
            # Nothing was taken over: the owner's stream goes on, epoch 1.
            await read_until(client, "response.output_text.delta")
            stored = store.load(str(created["session_id"]), events=False)
            assert stored is not None and stored.epoch == 1
            owner = await _resume(second.url, created, "alice")
            resumed = await read_until(owner, "session.resumed")
            assert resumed[-1]["session_id"] == created["session_id"]
            for c in (intruder, owner, client):
                await c.cut()


async def test_a_parked_session_taken_over_frees_its_place_where_it_was_opened() -> None:
    # No stream (answers only): the first gateway's session, its client gone,
    # is parked; another process takes it over; the first learns it at its
    # next lease renewal (a sweep) and must free the place all the same.
    store = MemoryStore()
    options = RegistryOptions(
        replay_ttl_s=60,
        replay_max_bytes_per_session=1 << 20,
        store=store,
        passivate_after_s=0,
        sweep_interval_s=0.05,
    )
    config = GatewayConfig(port=0, max_sessions=1)
    with trio.fail_after(LIMIT):
        async with trio.open_nursery() as nursery:
            first, second = [
                await nursery.start(
                    functools.partial(
                        serve_gateway,
                        config,
                        engine=DemoEngine(EngineConfig(event_rate_hz=0)),
                        registry_options=options,
                    )
                )
                for _ in range(2)
            ]
            client, created = await _open(first.url)
            assert created["type"] == "session.created"
            await client.cut()
            while first.registry.stats().parked < 1:
                await trio.sleep(0.02)
            other = await _resume(second.url, created)
            await read_until(other, "session.resumed")
            await _opens_once_free(first.url)
            await other.cut()
            nursery.cancel_scope.cancel()


async def test_an_input_claimed_here_and_never_finished_is_answered_when_the_session_returns() -> (
    None
):
    store = MemoryStore()
    engine = _HeldEngine()
    with trio.fail_after(LIMIT):
        async with _gateways(store, authenticate=False, engine=engine) as (first, second):
            client, created = await _open(first.url)
            assert created["type"] == "session.created"
            await client.send_json({"type": "input", "client_event_id": "x", "text": "hi"})
            await trio.sleep(0.05)  # the first gateway claims "x" and holds its answer
            await client.cut()
            elsewhere = await _resume(second.url, created)
            resumed = await read_until(elsewhere, "session.resumed")
            # Speaking confirms the resume here (the new token stands); "x" not resent.
            await elsewhere.send_json({"type": "input", "client_event_id": "y", "text": "hi"})
            await trio.sleep(0.05)
            await elsewhere.cut()
            engine.hold = False
            back = await _resume(first.url, resumed[-1])
            await read_until(back, "session.resumed")
            await back.send_json({"type": "input", "client_event_id": "x", "text": "hi"})
            answered = await read_until(back, "response.done", client_event_id="x")
            assert all(f.get("type") != "input.duplicate" for f in answered), answered
            await back.cut()


async def test_a_client_beyond_what_the_store_kept_gets_a_store_lost_gap_on_the_wire() -> None:
    store = MemoryStore()
    options = RegistryOptions(replay_ttl_s=60, replay_max_bytes_per_session=1 << 20, store=store)
    config = GatewayConfig(port=0)
    engine = functools.partial(DemoEngine, EngineConfig(event_rate_hz=50))
    with trio.fail_after(LIMIT):
        async with trio.open_nursery() as outer:
            second = await outer.start(
                functools.partial(serve_gateway, config, engine=engine(), registry_options=options)
            )
            async with trio.open_nursery() as inner:
                first = await inner.start(
                    functools.partial(
                        serve_gateway, config, engine=engine(), registry_options=options
                    )
                )
                client, created = await _open(first.url)
                session_id = str(created["session_id"])
                await read_until(client, "response.output_text.delta")
                lose = lose_writes_after(store, session_id)
                held = store.load(session_id)
                assert held is not None
                kept = held.record.next_sequence - 1
                received: list[int] = []
                while not received or received[-1] < kept + 2:
                    received += seqs([await client.receive_json()])
                await client.cut()
                inner.cancel_scope.cancel()  # the first process is gone
            lose()  # and the store's replica never had its last writes
            last = received[-1]
            again = {**created, "last_received_server_event_seq": last}
            client = await _resume_from(second.url, again)
            frames, closed = await read_until_closed(client)
            await client.cut()
            assert errors(frames) == ["journal_gap"], frames
            assert (closed.code, closed.reason) == (4410, "journal_gap")
            gap = frames[-1]
            assert (gap["reason"], gap["requested"], gap["head"]) == ("store_lost", last, kept)
            assert "lost the events after its head" in str(gap["message"])
            assert second.counters.gap_reasons == {"store_lost": 1}
            # The same resume again carries on past every sequence the client holds.
            client = await _resume_from(second.url, again)
            resumed = await read_until(client, "session.resumed")
            assert resumed[-1]["replayed"] == 0
            following = await read_until(client, "response.output_text.delta")
            assert seqs(following)[0] == last + 1
            await client.cut()
            outer.cancel_scope.cancel()


async def _resume_from(url: str, frame: dict[str, object]) -> WireClient:
    client = await WireClient.connect(url)
    await client.send_json(
        {
            "type": "session.resume",
            "session_id": frame["session_id"],
            "resume_token": frame["resume_token"],
            "last_received_server_event_seq": frame["last_received_server_event_seq"],
        }
    )
    return client
