"""`supervisor.client` against a real gateway, through a proxy of the test's own
that cuts connections at random: every server event once and in order, every
input answered once, every client event received once (both directions),
under trio (in-process gateway) and asyncio (a ``serve`` child); fatal close
codes end ``events()`` with `FatalCloseError`; the backoff is bounded."""

from __future__ import annotations

import contextlib
import json
import random
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio
import pytest
import trio

from supervisor._client_policy import ACKED_WINDOW, Options
from supervisor.client import (
    ClientSession,
    FatalCloseError,
    ReconnectGaveUpError,
    ReconnectPolicy,
    open_session,
)
from supervisor.gateway._engine import EngineConfig
from supervisor.gateway._server import GatewayConfig
from tests.client_support import cutting_proxy, serve_process
from tests.gateway_support import LIMIT, running_gateway
from tests.redis_support import running_server


def _options() -> Options:
    return Options(
        url="ws://127.0.0.1:1/v1",
        secret=None,
        ssl=None,
        policy=ReconnectPolicy(),
        ack_every=10,
        ack_interval_s=0.2,
        heartbeat_interval_s=15,
        heartbeat_timeout_s=10,
        connect_timeout_s=10,
        max_inputs_in_flight=8,
        buffer=16,
        rng=random.Random(0),  # noqa: S311
    )


FAST = ReconnectPolicy(initial_delay_s=0.01, max_delay_s=0.1, give_up_after_s=10)
INPUTS = 12
CHUNKS = 30


async def _stream_and_check(
    session: ClientSession, disturb: Callable[[int], Awaitable[None]]
) -> dict[str, int]:
    """Stream inputs and binary chunks (``disturb(n)`` after the n-th); check both
    directions exactly once; return the client's statistics."""
    seqs: list[int] = []
    answers: dict[str, int] = {}
    received: list[int] = []
    sent_ids: list[str] = []
    chunk_seqs: list[int] = []

    async def produce() -> None:
        for n in range(CHUNKS):
            if n < INPUTS:
                sent_ids.append(await session.input(f"question {n}"))
            chunk_seqs.append(await session.send(bytes(n + 1), type="input_audio.append"))
            await disturb(n)
            await anyio.sleep(0.02)

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(produce)
        async for event in session.events():
            seqs.append(int(event["server_event_seq"]))  # type: ignore[call-overload]
            if event["type"] == "response.done":
                key = str(event["client_event_id"])
                answers[key] = answers.get(key, 0) + 1
            elif event["type"] == "input_audio.received":
                received.append(int(event["client_seq"]))  # type: ignore[call-overload]
                assert event["bytes"] == chunk_seqs.index(received[-1]) + 1
            if len(answers) == len(sent_ids) == INPUTS and len(received) == CHUNKS:
                tasks.cancel_scope.cancel()
    assert seqs == list(range(1, len(seqs) + 1))
    assert sorted(answers) == sorted(sent_ids)
    assert set(answers.values()) == {1}
    assert received == chunk_seqs  # once each, in client_seq order
    return session.statistics()


async def _nothing(n: int) -> None:
    pass


async def _exactly_once_through_cuts(port: int, *, seed: int) -> dict[str, int]:
    """`_stream_and_check` through a proxy cutting at random."""
    async with cutting_proxy(port) as proxy:
        url = f"ws://127.0.0.1:{proxy.port}/v1"
        async with (
            open_session(url, reconnect=FAST, ack_every=5, seed=seed) as session,
            anyio.create_task_group() as cutter,
        ):
            cutter.start_soon(proxy.cut_at_random, random.Random(seed), 0.15)  # noqa: S311
            stats = await _stream_and_check(session, _nothing)
            cutter.cancel_scope.cancel()
        assert proxy.cuts > 0
        return stats


async def test_trio_both_directions_exactly_once_through_random_cuts() -> None:
    with trio.fail_after(LIMIT * 2):
        async with running_gateway(engine=EngineConfig(event_rate_hz=40)) as harness:
            port = int(harness.url.rsplit(":", 1)[1].split("/", 1)[0])
            stats = await _exactly_once_through_cuts(port, seed=1)
    assert stats["resumes"] > 0
    assert stats["reconnect_attempts"] >= stats["resumes"]
    assert stats["inputs_answered"] == INPUTS


def test_asyncio_both_directions_exactly_once_against_serve() -> None:
    async def main() -> dict[str, int]:
        with anyio.fail_after(LIMIT * 3):
            async with serve_process("--event-rate", "40") as (port, _):
                return await _exactly_once_through_cuts(port, seed=2)

    stats = anyio.run(main, backend="asyncio")
    assert stats["resumes"] > 0


async def test_a_resume_the_server_cannot_know_ends_events_with_4404() -> None:
    with trio.fail_after(LIMIT):
        async with running_gateway() as first, cutting_proxy(0) as proxy:
            proxy.upstream = int(first.url.rsplit(":", 1)[1].split("/", 1)[0])
            url = f"ws://127.0.0.1:{proxy.port}/v1"
            async with open_session(url, reconnect=FAST) as session, running_gateway() as second:
                # The session lives in the first process's memory only.
                proxy.upstream = int(second.url.rsplit(":", 1)[1].split("/", 1)[0])
                await proxy.cut_all()
                with pytest.raises(FatalCloseError) as raised:
                    async for _ in session.events():
                        pass
    assert raised.value.code == 4404
    assert "4404" in str(raised.value)
    # One attempt, no retry loop against a fatal answer.
    assert session.statistics()["reconnect_attempts"] == 1


async def test_a_wrong_secret_is_4401_at_open() -> None:
    with trio.fail_after(LIMIT):
        async with running_gateway(GatewayConfig(port=0, shared_secret="right")) as harness:
            with pytest.raises(FatalCloseError) as raised:
                async with open_session(harness.url, secret="wrong"):
                    pass
            assert raised.value.code == 4401
            async with open_session(harness.url, secret="right") as session:
                assert session.session_id.startswith("sess_")


async def test_no_server_to_resume_on_gives_up_by_the_deadline() -> None:
    policy = ReconnectPolicy(initial_delay_s=0.01, max_delay_s=0.05, give_up_after_s=0.5)
    with trio.fail_after(LIMIT):
        async with running_gateway() as harness, cutting_proxy(0) as proxy:
            proxy.upstream = int(harness.url.rsplit(":", 1)[1].split("/", 1)[0])
            url = f"ws://127.0.0.1:{proxy.port}/v1"
            async with open_session(url, reconnect=policy, close_on_exit=False) as session:
                proxy.upstream = 1  # nothing listens there
                await proxy.cut_all()
                with pytest.raises(ReconnectGaveUpError):
                    async for _ in session.events():
                        pass
    assert session.statistics()["reconnect_attempts"] >= 2


async def test_the_engine_closing_the_session_ends_events_quietly() -> None:
    with trio.fail_after(LIMIT):
        async with (
            running_gateway(engine=EngineConfig(event_rate_hz=0)) as harness,
            open_session(harness.url) as session,
        ):
            await session.close()
            events = [event async for event in session.events()]
    assert events == []


def test_the_backoff_grows_to_its_ceiling_within_its_jitter() -> None:
    policy = ReconnectPolicy(initial_delay_s=0.1, max_delay_s=1.0, multiplier=2, jitter=0.5)
    rng = random.Random(0)  # noqa: S311
    for attempt, ceiling in [(0, 0.1), (1, 0.2), (3, 0.8), (4, 1.0), (20, 1.0)]:
        delays = [policy.delay(attempt, rng) for _ in range(50)]
        assert all(ceiling / 2 <= d <= ceiling for d in delays)
    with pytest.raises(ValueError):
        ReconnectPolicy(jitter=2)


class _RecordingConnection:
    """What `ClientSession` writes, and one answer to its resume."""

    def __init__(self, answer: dict[str, object]) -> None:
        self.answer = answer
        self.sent: list[object] = []

    async def send_json(self, frame: dict[str, object]) -> None:
        self.sent.append(frame)

    async def send_text(self, text: str) -> None:
        self.sent.append(json.loads(text))

    async def receive(self) -> dict[str, object]:
        return self.answer


def _resumed_at(last_client_seq: int) -> _RecordingConnection:
    """A connection whose server answers ``session.resumed`` with ``last_client_seq``."""
    return _RecordingConnection(
        {
            "type": "session.resumed",
            "session_id": "sess_x",
            "resume_token": "t2",
            "replayed": 0,
            "last_client_seq": last_client_seq,
        }
    )


async def test_acked_events_a_new_process_never_handled_are_resent() -> None:
    # With a session store, client_ack says accepted; a process killed before
    # handling leaves a lower last_client_seq to the process that resumes.
    session = ClientSession(_options())
    session._session_id, session._token = "sess_x", "t1"
    for n in range(6):
        await session.send({"type": "note", "n": n})
    session._drop_pending_through(5)  # client_ack 5, from the process that died
    connection = _resumed_at(3)
    await session._handshake(connection)  # type: ignore[arg-type]
    resent = [f["client_seq"] for f in connection.sent if isinstance(f, dict) and "n" in f]
    assert resent == [4, 5, 6]
    assert session.statistics()["client_events_resent"] == 3
    session._events_in.close()
    session._events_out.close()


async def test_acked_events_from_an_unanswered_input_on_are_kept_to_resend() -> None:
    # With a session store, the stored last_client_seq stays below an input
    # until its answer ends: a process killed mid-answer, however many events
    # later, leaves the next one below it, and the client resends from there.
    session = ClientSession(_options())
    session._session_id, session._token = "sess_x", "t1"
    await session.input("a long answer", client_event_id="q1")
    later = ACKED_WINDOW + 5
    for n in range(later):
        await session.send({"type": "note", "n": n})
    session._drop_pending_through(later + 1)  # all acked by the process that died
    connection = _resumed_at(0)
    await session._handshake(connection)  # type: ignore[arg-type]
    resent = [f["client_seq"] for f in connection.sent if isinstance(f, dict) and "client_seq" in f]
    assert resent == list(range(1, later + 2))
    # Once answered, only the window is kept.
    session._answered("q1")
    session._drop_pending_through(later + 1)
    assert len(session._acked) == ACKED_WINDOW
    session._events_in.close()
    session._events_out.close()


async def test_both_directions_exactly_once_when_the_serving_process_is_killed(
    tmp_path: Path,
) -> None:
    """Two ``serve --redis`` processes; the one serving the session is SIGKILLed
    mid-stream and the client resumes on the other (a takeover)."""
    redis = contextlib.contextmanager(running_server)(tmp_path)
    with redis as server, trio.fail_after(LIMIT * 3):
        flags = ("--redis", server.url, "--event-rate", "40")
        async with (
            serve_process(*flags) as (first, doomed),
            serve_process(*flags) as (second, _),
            cutting_proxy(first) as proxy,
        ):

            async def kill_the_first(n: int) -> None:
                if n == 10:
                    doomed.kill()  # SIGKILL: no goodbye, no flush
                    proxy.upstream = second
                    await proxy.cut_all()

            url = f"ws://127.0.0.1:{proxy.port}/v1"
            async with open_session(url, reconnect=FAST, ack_every=3, seed=3) as session:
                stats = await _stream_and_check(session, kill_the_first)
    assert stats["resumes"] >= 1
