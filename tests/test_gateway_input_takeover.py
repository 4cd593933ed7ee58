"""An input whose answer was in flight when its process stopped answering
(SIGKILLed, or taken over), with later client events handled meanwhile: a
resume on another process answers the input once and handles the later
events once (the stored watermark stops below the unanswered input, and the
events handled above it are repeats there)."""

from __future__ import annotations

import functools

import trio

from supervisor._options import RegistryOptions
from supervisor.cli._wire_client import WireClient
from supervisor.gateway._engine import DemoEngine, EngineConfig, EngineSession
from supervisor.gateway._protocol import binary_event
from supervisor.gateway._server import Gateway, GatewayConfig, serve_gateway
from supervisor.stores._memory import MemoryStore
from tests.gateway_support import LIMIT, read_until, resume_elsewhere

QUIET = EngineConfig(event_rate_hz=0)


class _AnswersNever(DemoEngine):
    """The killed process: it took the input and never got to journal its answer."""

    def __init__(self) -> None:
        super().__init__(QUIET)
        self.answering: list[str] = []

    async def answer(self, session: EngineSession, client_event_id: str, text: str) -> None:
        self.answering.append(client_event_id)
        await trio.sleep_forever()


def _chunk(seq: int) -> bytes:
    return binary_event({"type": "input_audio.append", "client_seq": seq}, bytes(10))


def _input(seq: int) -> dict[str, object]:
    return {"type": "input", "client_seq": seq, "client_event_id": "q1", "text": "hi"}


async def _serve(store: MemoryStore, engine: DemoEngine, nursery: trio.Nursery) -> Gateway:
    options = RegistryOptions(replay_ttl_s=60, replay_max_bytes_per_session=1 << 20, store=store)
    gateway: Gateway = await nursery.start(
        functools.partial(
            serve_gateway, GatewayConfig(port=0), engine=engine, registry_options=options
        )
    )
    return gateway


async def test_an_input_in_flight_on_a_stopped_process_is_answered_once_after_a_resume() -> None:
    with trio.fail_after(LIMIT):
        async with trio.open_nursery() as nursery:
            store = MemoryStore()
            stuck = _AnswersNever()
            first = await _serve(store, stuck, nursery)
            second = await _serve(store, DemoEngine(QUIET), nursery)
            client = await WireClient.connect(first.url)
            try:
                await client.send_json({"type": "session.open"})
                created = await client.receive_json()
                await client.send_json(_input(1))
                await client.send_bytes(_chunk(2))  # handled before the input's answer
                frames = await read_until(client, "input_audio.received", client_seq=2)
                while stuck.answering != ["q1"]:
                    await trio.sleep(0.01)
            finally:
                await client.cut()
            other = await resume_elsewhere(second.url, created, frames)
            try:
                resumed = await other.receive_json()
                # Below the unanswered input: the client sends it again.
                assert (resumed["type"], resumed["last_client_seq"]) == ("session.resumed", 0)
                await other.send_json(_input(1))
                await other.send_bytes(_chunk(2))  # handled on the first process: a repeat
                await other.send_bytes(_chunk(3))
                later = await read_until(other, "input_audio.received", client_seq=3)
                later += await read_until(other, "response.done", client_event_id="q1")
                received = [f["client_seq"] for f in later if f["type"] == "input_audio.received"]
                assert received == [3]
                assert second.service.counters.client_events_repeated == 1
                # The watermark is past everything handled, the input included.
                session_id = str(created["session_id"])
                with trio.move_on_after(LIMIT / 2):
                    while store.client_watermark(session_id).last_client_seq != 3:
                        await trio.sleep(0.01)
                assert store.client_watermark(session_id).last_client_seq == 3
            finally:
                await other.cut()
            nursery.cancel_scope.cancel()


class _ClaimFailsOnce(MemoryStore):
    """A store whose first input claim fails with an error of its own (as a
    Redis node lacking the claim's script once did during a failover)."""

    def __init__(self) -> None:
        super().__init__()
        self.failed = False

    def claim_input(self, session_id: str, claimant: str, key: str) -> bool | None:
        if not self.failed:
            self.failed = True
            raise RuntimeError("the store failed this claim")
        return super().claim_input(session_id, claimant, key)


async def test_an_input_whose_failed_claim_is_left_unmarked_and_answered_after_a_resume() -> None:
    """The claim's failure is the store's, not the engine's: the input was never
    answered, so it must stay below the watermark for the client to send again."""
    with trio.fail_after(LIMIT):
        async with trio.open_nursery() as nursery:
            store = _ClaimFailsOnce()
            first = await _serve(store, DemoEngine(QUIET), nursery)
            second = await _serve(store, DemoEngine(QUIET), nursery)
            client = await WireClient.connect(first.url)
            try:
                await client.send_json({"type": "session.open"})
                created = await client.receive_json()
                session_id = str(created["session_id"])
                await client.send_json(_input(1))
                while not store.failed:
                    await trio.sleep(0.01)
                await client.send_bytes(_chunk(2))
                frames = await read_until(client, "input_audio.received", client_seq=2)
                while not store.client_watermark(session_id).handled(2):
                    await trio.sleep(0.01)
            finally:
                await client.cut()
            assert store.client_watermark(session_id).last_client_seq == 0
            other = await resume_elsewhere(second.url, created, frames)
            try:
                resumed = await other.receive_json()
                assert (resumed["type"], resumed["last_client_seq"]) == ("session.resumed", 0)
                await other.send_json(_input(1))
                answer = await read_until(other, "response.done", client_event_id="q1")
                assert any(f["type"] == "response.output_text.delta" for f in answer)
            finally:
                await other.cut()
            nursery.cancel_scope.cancel()
