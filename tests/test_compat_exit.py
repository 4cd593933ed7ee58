"""The drop-in needs no start or stop: a program that never closes it still exits,
and it refuses to serve a second event loop."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from supervisor.compat import DuplexSessionAttachmentRegistry
from tests.asyncio_support import Wire, duplex_threads

#: A seed program with its import line changed. It uses the registry, leaves a
#: send hanging, checks that the actors really run (on its loop, no thread of
#: theirs), and exits without closing.
#: ``KEEP``: the registry is a module global (alive at exit) or a local of main().
PROGRAM = """
import asyncio
import sys
import threading

from supervisor.compat import DuplexSessionAttachmentRegistry

KEEP = sys.argv[1] == "module"
kept = DuplexSessionAttachmentRegistry(replay_ttl_s=30, replay_max_bytes_per_session=1 << 20)


async def main() -> None:
    registry = kept if KEEP else DuplexSessionAttachmentRegistry(
        replay_ttl_s=30, replay_max_bytes_per_session=1 << 20
    )
    frames = []
    hang = asyncio.Event()

    async def send(frame):
        frames.append(frame)

    async def hung_send(frame):
        await hang.wait()

    async def close(reason):
        pass

    created = await registry.create("s1", send=send, close=close)
    await registry.send_event("s1", {"n": 1})
    assert await registry.detach("s1")
    await registry.resume(
        "s1",
        resume_token=created.resume_token.plaintext,
        last_received_server_event_seq=0,
        send=send,
        close=close,
        activation_payload_factory=lambda token, generation: {"type": "resumed"},
    )
    await registry.create("s2", send=hung_send, close=close)
    asyncio.get_running_loop().create_task(registry.send_event("s2", {"n": 1}))
    await asyncio.sleep(0)
    threads = [t for t in threading.enumerate() if t.name.startswith("duplex-")]
    assert threads == [], threads  # the actors run on this loop
    live = registry.stats().live
    print("frames", len(frames), "live", live)


asyncio.run(main())
print("leaving without closing", kept)
"""


@pytest.mark.parametrize("where", ["module", "local"])
def test_a_program_that_never_closes_the_registry_exits(where: str) -> None:
    done = subprocess.run(  # noqa: S603 - our own constant program
        [sys.executable, "-c", PROGRAM, where],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "frames 3 live 2" in done.stdout
    assert "leaving without closing" in done.stdout
    assert "Traceback" not in done.stderr, done.stderr


def test_one_registry_serves_one_loop_only() -> None:
    before = set(duplex_threads())
    reg = DuplexSessionAttachmentRegistry(replay_ttl_s=30, replay_max_bytes_per_session=1 << 20)
    wire = Wire()
    first = asyncio.new_event_loop()
    try:
        created = first.run_until_complete(reg.create("s1", send=wire.send, close=wire.close))

        async def from_another_loop() -> None:
            with pytest.raises(RuntimeError, match="bound to the event loop of its first call"):
                await reg.send_event("s1", {"n": 1})
            with pytest.raises(RuntimeError):
                await reg.create("s2", send=wire.send, close=wire.close)

        asyncio.run(from_another_loop())
        # Its own loop is still served, and the refusals left nothing behind.
        entry = first.run_until_complete(reg.send_event("s1", {"n": 1}))
        assert entry is not None and entry.sequence == 1
        assert wire.seqs() == [1]
        assert reg.session_ids() == ["s1"]
        assert created.attachment_generation == 1
        ours = [t for t in duplex_threads() if t not in before]
        assert ours == []  # its actors run on the loop of its first call
    finally:
        first.run_until_complete(reg.aclose())
        first.close()
    assert [t.name for t in ours if t.is_alive()] == []


def test_a_drop_in_that_became_garbage_stops_its_sessions() -> None:
    # A session actor holds its last message until the next one; that
    # message's reply must not keep the registry (and so its finalizer) alive.
    import gc
    import threading

    async def scenario() -> None:
        registry = DuplexSessionAttachmentRegistry(
            replay_ttl_s=30, replay_max_bytes_per_session=1 << 20
        )
        wire = Wire()
        await registry.create("garbage", send=wire.send, close=wire.close)
        await registry.send_event("garbage", {"n": 1})
        registry.send_event_nowait("garbage", {"n": 2})
        await registry.send_event("garbage", {"n": 3})

    asyncio.run(scenario())
    gc.collect()
    assert [t for t in threading.enumerate() if t.name.startswith("duplex-")] == []
