"""Client events against a real gateway: sequenced exactly once across a cut,
binary audio, the demo engine's ``input_audio.received``, and the engine API
for realtime (events by type, barge-in, attached state, acks, close)."""

from __future__ import annotations

import base64
import functools
import json
from collections.abc import Callable
from pathlib import Path

import trio
import trio.testing

from supervisor._options import RegistryOptions
from supervisor.cli._wire_client import WireClient
from supervisor.gateway._engine import ClientEvent, DemoEngine, EngineConfig, EngineSession
from supervisor.gateway._protocol import binary_event
from supervisor.gateway._server import Gateway, GatewayConfig, serve_gateway
from supervisor.gateway._sessions import _Inbox
from supervisor.stores._memory import MemoryStore
from tests.gateway_support import (
    LIMIT,
    read_until,
    read_until_closed,
    resume_elsewhere,
    running_gateway,
)

QUIET = EngineConfig(event_rate_hz=0)


def _chunk(seq: int, size: int) -> bytes:
    return binary_event({"type": "input_audio.append", "client_seq": seq}, bytes(size))


async def _until(condition: Callable[[], bool]) -> None:
    while not condition():
        await trio.sleep(0.01)


def _received(frames: list[dict[str, object]]) -> list[tuple[object, object]]:
    return [
        (f["client_seq"], f["bytes"]) for f in frames if f.get("type") == "input_audio.received"
    ]


async def test_binary_audio_is_received_once_each_across_a_cut_and_resume() -> None:
    with trio.fail_after(LIMIT):
        async with running_gateway(GatewayConfig(port=0), engine=QUIET) as harness:
            opened = await harness.open()
            client = opened.client
            for seq in range(1, 6):
                await client.send_bytes(_chunk(seq, 100 * seq))
            frames = await read_until(client, "input_audio.received", client_seq=5)
            assert _received(frames) == [(n, 100 * n) for n in range(1, 6)]
            await read_until(client, "client_ack", client_seq=5)
            await client.cut()
            await harness.wait_detached(opened.session_id)

            # The quiet engine journaled only the five receipts.
            again = await harness.resume(opened.session_id, opened.token, 5)
            resumed = await again.receive_json()
            assert resumed["type"] == "session.resumed"
            assert resumed["last_client_seq"] == 5
            # 4 and 5 again (the client did not know they arrived), then 6.
            for seq in (4, 5, 6):
                await again.send_bytes(_chunk(seq, 7))
            frames = await read_until(again, "input_audio.received", client_seq=6)
            assert _received(frames) == [(6, 7)]
            counters = harness.gateway.service.counters
            assert counters.client_events_repeated == 2
            assert counters.client_events_accepted == 6
            metrics = harness.gateway.service.metrics.render().decode()
            assert 'duplex_client_events_total{outcome="repeated"} 2.0' in metrics

            await again.send_bytes(_chunk(8, 1))
            frames = await read_until(again, "error")
            assert frames[-1]["code"] == "bad_request"
            assert (frames[-1]["client_seq"], frames[-1]["last_client_seq"]) == (8, 6)
            # The connection stays open: 7 is still next.
            await again.send_bytes(_chunk(7, 3))
            frames = await read_until(again, "input_audio.received", client_seq=7)
            assert _received(frames) == [(7, 3)]


async def test_a_json_audio_chunk_counts_its_decoded_bytes() -> None:
    with trio.fail_after(LIMIT):
        async with running_gateway(GatewayConfig(port=0), engine=QUIET) as harness:
            opened = await harness.open()
            audio = base64.b64encode(bytes(333)).decode()
            await opened.client.send_json(
                {"type": "input_audio.append", "client_seq": 1, "audio": audio}
            )
            frames = await read_until(opened.client, "input_audio.received")
            assert _received(frames) == [(1, 333)]


async def test_a_sequenced_input_is_answered_and_its_repeat_dropped() -> None:
    with trio.fail_after(LIMIT):
        async with running_gateway(GatewayConfig(port=0), engine=QUIET) as harness:
            opened = await harness.open()
            frame = {"type": "input", "client_event_id": "i1", "text": "hi", "client_seq": 1}
            await opened.client.send_text(json.dumps(frame))
            await opened.client.send_text(json.dumps(frame))
            await opened.client.send_json({"type": "input_audio.append", "client_seq": 2})
            frames = await read_until(opened.client, "input_audio.received", client_seq=2)
            done = [f for f in frames if f.get("type") == "response.done"]
            assert [f["client_event_id"] for f in done] == ["i1"]
            assert harness.gateway.service.counters.client_events_repeated == 1


class _Realtime:
    """An engine that records what the engine API tells it."""

    client_event_types = frozenset({"response.create"})

    def __init__(self) -> None:
        self.log: list[str] = []
        self.stopped: list[str] = []

    async def start(self, session: EngineSession) -> None:
        await session.wait_attached()
        self.log.append("attached")
        await session.wait_detached()
        self.log.append("detached")
        await session.wait_attached()
        self.log.append("attached again")

    async def answer(self, session: EngineSession, client_event_id: str, text: str) -> None:
        self.log.append(f"answering {client_event_id}")
        try:
            await trio.sleep_forever()
        except trio.Cancelled:
            self.log.append(f"cancelled {client_event_id}")
            raise

    async def on_client_event(self, session: EngineSession, event: ClientEvent) -> None:
        if event.fields.get("close"):
            await session.close("bye")
            return
        with session.cancellable(f"resp-{event.client_seq}"):
            if event.fields.get("slow"):
                self.log.append(f"generating resp-{event.client_seq}")
                await trio.sleep_forever()
            await session.send(
                {
                    "type": "seen",
                    "client_seq": event.client_seq,
                    "acked": session.acked_server_event_seq,
                    "last_client_seq": session.last_client_seq,
                }
            )
        self.log.append(f"done resp-{event.client_seq}")

    def stop(self, session_id: str) -> None:
        self.stopped.append(session_id)


async def test_the_engine_sees_its_event_types_the_acked_and_last_client_seq() -> None:
    engine = _Realtime()
    with trio.fail_after(LIMIT):
        async with running_gateway(GatewayConfig(port=0), custom_engine=engine) as harness:
            client = (await harness.open()).client
            await client.send_json({"type": "response.create", "client_seq": 1})
            frames = await read_until(client, "seen", client_seq=1)
            assert (frames[-1]["acked"], frames[-1]["last_client_seq"]) == (0, 1)
            await client.send_json({"type": "ack", "server_event_seq": 1})
            await client.send_json({"type": "response.create", "client_seq": 2})
            frames = await read_until(client, "seen", client_seq=2)
            assert (frames[-1]["acked"], frames[-1]["last_client_seq"]) == (1, 2)
            # A type the engine did not declare is refused, the connection stays.
            await client.send_json({"type": "tool.call", "client_seq": 3})
            frames = await read_until(client, "error")
            assert (frames[-1]["code"], frames[-1]["client_seq"]) == ("bad_request", 3)


async def test_response_cancel_cancels_an_answer_and_an_engine_response() -> None:
    engine = _Realtime()
    with trio.fail_after(LIMIT):
        async with running_gateway(GatewayConfig(port=0), custom_engine=engine) as harness:
            client = (await harness.open()).client
            await client.send_json({"type": "input", "client_event_id": "i1", "text": "hi"})
            await _until(lambda: "answering i1" in engine.log)
            await client.send_json(
                {"type": "response.cancel", "client_seq": 1, "response_id": "i1"}
            )
            await _until(lambda: "cancelled i1" in engine.log)

            await client.send_json({"type": "response.create", "client_seq": 2, "slow": True})
            await _until(lambda: "generating resp-2" in engine.log)
            await client.send_json(
                {"type": "response.cancel", "client_seq": 3, "response_id": "resp-2"}
            )
            await _until(lambda: "done resp-2" in engine.log)
            # The engine takes its next event: the cancelled one no longer holds it.
            await client.send_json({"type": "response.create", "client_seq": 4})
            await read_until(client, "seen", client_seq=4)


async def test_the_engine_can_wait_for_a_client_to_leave_and_come_back() -> None:
    engine = _Realtime()
    with trio.fail_after(LIMIT):
        async with running_gateway(GatewayConfig(port=0), custom_engine=engine) as harness:
            opened = await harness.open()
            await _until(lambda: engine.log == ["attached"])
            await opened.client.cut()
            await _until(lambda: engine.log == ["attached", "detached"])
            again = await harness.resume(opened.session_id, opened.token, 0)
            assert (await again.receive_json())["type"] == "session.resumed"
            await _until(lambda: engine.log == ["attached", "detached", "attached again"])


async def test_the_engine_closes_its_session_with_a_reason() -> None:
    engine = _Realtime()
    with trio.fail_after(LIMIT):
        async with running_gateway(GatewayConfig(port=0), custom_engine=engine) as harness:
            opened = await harness.open()
            await opened.client.send_json({"type": "response.create", "client_seq": 1, "close": 1})
            frames, closed = await read_until_closed(opened.client)
            assert {"type": "session.closed", "reason": "bye"} in frames
            assert (closed.code, closed.reason) == (1000, "session_closed")
            await _until(lambda: engine.stopped == [opened.session_id])
            assert not await harness.gateway.registry.has_attachment(opened.session_id)


async def _serve_two(store: MemoryStore, nursery: trio.Nursery) -> list[Gateway]:
    options = RegistryOptions(replay_ttl_s=60, replay_max_bytes_per_session=1 << 20, store=store)
    return [
        await nursery.start(
            functools.partial(
                serve_gateway,
                GatewayConfig(port=0),
                engine=DemoEngine(QUIET),
                registry_options=options,
            )
        )
        for _ in range(2)
    ]


async def test_a_resume_on_another_process_agrees_on_last_client_seq() -> None:
    with trio.fail_after(LIMIT):
        async with trio.open_nursery() as nursery:
            first, second = await _serve_two(MemoryStore(), nursery)
            client = await WireClient.connect(first.url)
            try:
                await client.send_json({"type": "session.open"})
                created = await client.receive_json()
                assert created["last_client_seq"] == 0
                for seq in (1, 2, 3):
                    await client.send_bytes(_chunk(seq, 10))
                frames = await read_until(client, "input_audio.received", client_seq=3)
            finally:
                await client.cut()
            other = await resume_elsewhere(second.url, created, frames)
            try:
                resumed = await other.receive_json()
                assert (resumed["type"], resumed["last_client_seq"]) == ("session.resumed", 3)
                await other.send_bytes(_chunk(3, 10))  # a repeat: dropped
                await other.send_bytes(_chunk(4, 10))
                frames = await read_until(other, "input_audio.received", client_seq=4)
                assert _received(frames) == [(4, 10)]
                assert second.service.counters.client_events_repeated == 1
            finally:
                await other.cut()
            nursery.cancel_scope.cancel()


def _api_doc_engine() -> object:
    """The realtime engine example of docs/api.md, as written there."""
    text = (Path(__file__).resolve().parent.parent / "docs" / "api.md").read_text()
    section = text.split("### A realtime engine", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    namespace: dict[str, object] = {}
    exec(compile(code, "docs/api.md", "exec"), namespace)  # noqa: S102 - our own doc
    return namespace["VoiceEngine"]()  # type: ignore[operator]


async def test_the_api_docs_realtime_engine_runs_as_written() -> None:
    engine = _api_doc_engine()
    with trio.fail_after(LIMIT):
        async with running_gateway(GatewayConfig(port=0), custom_engine=engine) as harness:  # type: ignore[arg-type]
            client = (await harness.open()).client
            await read_until(client, "status")
            await client.send_bytes(
                binary_event({"type": "input_audio.append", "client_seq": 1}, bytes(320))
            )
            frames = await read_until(client, "heard", client_seq=1)
            assert frames[-1]["bytes"] == 320
            await client.send_json({"type": "input_audio.commit", "client_seq": 2})
            await read_until(client, "delta", response_id="r2")
            await client.send_json(
                {"type": "response.cancel", "client_seq": 3, "response_id": "r2"}
            )
            await client.send_json({"type": "hang_up", "client_seq": 4})
            frames, closed = await read_until_closed(client)
            # Barged in after the first word: the second never came.
            assert [f for f in frames if f.get("type") == "delta"] == []
            assert {"type": "session.closed", "reason": "caller hung up"} in frames
            assert closed.code == 1000


async def test_a_sessions_inbox_holds_back_its_producer_when_full_and_ends_on_close() -> None:
    inbox = _Inbox(2)
    events = [ClientEvent(type="e", client_seq=n, fields={}) for n in (1, 2, 3)]
    put_third = trio.Event()

    async def producer() -> None:
        for event in events:
            await inbox.put(event)
        put_third.set()

    with trio.fail_after(LIMIT):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(producer)
            await trio.testing.wait_all_tasks_blocked()
            assert not put_third.is_set()  # two held, the third waits
            assert await inbox.get() == events[0]
            await put_third.wait()
            assert [await inbox.get(), await inbox.get()] == events[1:]
            nursery.start_soon(inbox.get)
            await trio.testing.wait_all_tasks_blocked()
            inbox.close()  # the waiting reader ends
        assert await inbox.get() is None


async def _resume_on(url: str, created: dict[str, object], token: str, last: int) -> WireClient:
    client = await WireClient.connect(url)
    await client.send_json(
        {
            "type": "session.resume",
            "session_id": created["session_id"],
            "resume_token": token,
            "last_received_server_event_seq": last,
        }
    )
    return client


async def test_a_session_back_on_its_first_process_continues_from_the_last_client_seq() -> None:
    with trio.fail_after(LIMIT):
        async with trio.open_nursery() as nursery:
            first, second = await _serve_two(MemoryStore(), nursery)
            client = await WireClient.connect(first.url)
            await client.send_json({"type": "session.open"})
            created = await client.receive_json()
            for seq in (1, 2, 3):
                await client.send_bytes(_chunk(seq, 10))
            await read_until(client, "input_audio.received", client_seq=3)
            await client.cut()
            token = str(created["resume_token"])
            # To the second process: chunks 4 and 5.
            other = await _resume_on(second.url, created, token, 3)
            resumed = await other.receive_json()
            token = str(resumed["resume_token"])
            for seq in (4, 5):
                await other.send_bytes(_chunk(seq, 10))
            await read_until(other, "input_audio.received", client_seq=5)
            await other.cut()
            # Back to the first, whose engine work may not have heard it lost the session.
            back = await _resume_on(first.url, created, token, 5)
            try:
                resumed = await back.receive_json()
                assert (resumed["type"], resumed["last_client_seq"]) == ("session.resumed", 5)
                await back.send_bytes(_chunk(6, 10))
                frames = await read_until(back, "input_audio.received", client_seq=6)
                assert [f for f in frames if f.get("type") == "error"] == []
            finally:
                await back.cut()
            nursery.cancel_scope.cancel()
