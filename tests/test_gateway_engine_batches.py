"""An engine's ``session.send_many``: one batch, journaled all or none, in order;
the same endings as ``send`` (a closed session, an overflowing journal)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import trio

from supervisor import open_session_registry
from supervisor.gateway._engine import EngineSession, SessionEnded
from supervisor.gateway._sessions import EngineWork

LIMIT = 10


class _Batches:
    """Sends each of ``batches`` with ``send_many``; records how each ended."""

    def __init__(self, batches: Sequence[Sequence[Mapping[str, object]]]) -> None:
        self.batches = batches
        self.ended: list[str] = []
        self.done = trio.Event()

    async def start(self, session: EngineSession) -> None:
        try:
            for batch in self.batches:
                await session.send_many(batch)
            self.ended.append("sent")
        except SessionEnded:
            self.ended.append("session_ended")
            raise
        finally:
            self.done.set()

    async def answer(self, session: EngineSession, client_event_id: str, text: str) -> None:
        return None

    def stop(self, session_id: str) -> None:
        self.ended.append("stopped")


async def _run(
    engine: _Batches, *, max_bytes: int, close_first: bool = False
) -> tuple[list[dict[str, object]], list[str]]:
    frames: list[dict[str, object]] = []
    overflowed: list[str] = []

    async def send(frame: dict[str, object]) -> None:
        frames.append(frame)

    async def close(reason: str) -> None:
        return None

    with trio.fail_after(LIMIT):
        async with (
            open_session_registry(
                replay_ttl_s=60.0, replay_max_bytes_per_session=max_bytes
            ) as registry,
            trio.open_nursery() as nursery,
        ):
            await registry.create("s1", send=send, close=close)
            if close_first:
                await registry.close("s1")
            work = EngineWork(
                registry,
                engine,
                nursery,
                max_inputs_per_session=10,
                max_inputs_in_flight=2,
                on_overflow=overflowed.append,
            )
            work.start("s1", None)
            await engine.done.wait()
    return frames, overflowed


def _deltas(*texts: str) -> list[Mapping[str, object]]:
    return [{"type": "delta", "delta": text} for text in texts]


async def test_a_batch_is_journaled_and_delivered_in_order_with_consecutive_sequences() -> None:
    engine = _Batches([_deltas("a", "b", "c"), _deltas("d")])
    frames, _ = await _run(engine, max_bytes=1 << 20)
    assert [(f["delta"], f["server_event_seq"]) for f in frames] == [
        ("a", 1),
        ("b", 2),
        ("c", 3),
        ("d", 4),
    ]
    assert engine.ended == ["sent"]


async def test_a_batch_to_a_closed_session_ends_the_engine_quietly() -> None:
    engine = _Batches([_deltas("a")])
    frames, _ = await _run(engine, max_bytes=1 << 20, close_first=True)
    assert frames == []
    # The work is stopped (the engine hears stop), then the send raises.
    assert engine.ended == ["stopped", "session_ended"]


async def test_a_batch_over_the_journal_cap_records_none_and_stops_the_work() -> None:
    # "a" (49 bytes) fits, so would "b" after it (102), but not "c" too (155):
    # the second batch is refused whole.
    engine = _Batches([_deltas("a"), _deltas("bbbbb", "ccccc")])
    frames, overflowed = await _run(engine, max_bytes=110)
    assert [f["delta"] for f in frames] == ["a"]
    assert overflowed == ["s1"]
    assert engine.ended == ["stopped", "session_ended"]
