"""``serve --redis URL``: gateway processes sharing one real redis-server (or the
local Redis Cluster, with ``--redis-durability replicas=1``).

A client whose process was killed (SIGKILL) resumes on another process and
gets every event journaled after the last one it saw, in order, once; that
process's engine adopts the session and live events follow.
"""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest
import trio

from supervisor.cli._wire_client import WireClient
from tests.gateway_support import LIMIT, read_until
from tests.redis_cluster_support import LocalCluster
from tests.redis_support import RedisServer, free_port
from tests.test_cli import _env, _serve_process

MODULE = [sys.executable, "-m", "supervisor"]


def test_serve_with_an_unreachable_redis_exits_2_with_a_message() -> None:
    url = f"redis://:hunter2secret@127.0.0.1:{free_port()}/0"
    result = subprocess.run(  # noqa: S603 - our own command line
        [*MODULE, "serve", "--port", "0", "--redis", url],
        capture_output=True,
        text=True,
        timeout=60,
        env=_env(),
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert "unavailable" in result.stderr
    assert "Traceback" not in result.stderr
    assert "hunter2secret" not in result.stderr


def test_serve_refuses_a_redis_durability_that_is_not_replicas_k() -> None:
    result = subprocess.run(  # noqa: S603 - our own command line
        [*MODULE, "serve", "--port", "0", "--redis-durability", "2"],
        capture_output=True,
        text=True,
        timeout=60,
        env=_env(),
        check=False,
    )
    assert result.returncode == 2
    assert "expected replicas=K" in result.stderr


@pytest.fixture(params=["redis", "cluster"])
def store_flags(request: pytest.FixtureRequest) -> list[str]:
    """``--redis`` on one redis-server, or on the local Redis Cluster with each
    commit acknowledged by a replica."""
    if request.param == "cluster":
        cluster: LocalCluster = request.getfixturevalue("redis_cluster")
        return ["--redis", cluster.url, "--redis-durability", "replicas=1"]
    server: RedisServer = request.getfixturevalue("redis_server")
    return ["--redis", server.url]


async def test_a_client_of_a_killed_process_resumes_on_another(store_flags: list[str]) -> None:
    serve = [*MODULE, "serve", "--port", "0", "--event-rate", "200", *store_flags]
    with trio.fail_after(LIMIT * 2):
        async with _serve_process(serve) as first, _serve_process(serve) as second:
            client = await WireClient.connect(first.url)
            await client.send_json({"type": "session.open"})
            created = (await read_until(client, "session.created"))[-1]
            client_frames = await read_until(client, "response.output_text.delta")
            seen = [f["server_event_seq"] for f in client_frames if "server_event_seq" in f]
            await client.cut()
            await trio.sleep(0.2)  # the engine journals more while the client is away
            first.process.send_signal(signal.SIGKILL)
            await first.process.wait()

            other = await WireClient.connect(second.url)
            try:
                await other.send_json(
                    {
                        "type": "session.resume",
                        "session_id": created["session_id"],
                        "resume_token": created["resume_token"],
                        "last_received_server_event_seq": seen[-1],
                    }
                )
                resumed = (await read_until(other, "session.resumed"))[-1]
                replay: list[object] = []
                expected = resumed.get("replay_count", resumed.get("replayed"))
                while expected is None or len(replay) < int(str(expected)):
                    with trio.move_on_after(2) as idle:
                        frame = await other.receive_json()
                    if idle.cancelled_caught:
                        break
                    if "server_event_seq" in frame:
                        replay.append(frame["server_event_seq"])
                # This process's engine adopted the session: live events follow.
                await other.send_json({"type": "ack", "server_event_seq": replay[-1]})
                live = await read_until(other, "response.output_text.delta")
                live_seqs = [f["server_event_seq"] for f in live if "server_event_seq" in f]
            finally:
                await other.cut()
                second.process.send_signal(signal.SIGINT)
            assert replay, resumed
            assert replay == list(
                range(int(str(seen[-1])) + 1, int(str(seen[-1])) + 1 + len(replay))
            )
            assert live_seqs[0] == int(str(replay[-1])) + 1, live
