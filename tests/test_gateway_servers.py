"""The gateway on every server ``serve --server`` offers, end to end on loopback.

Real server processes (``duplex-supervisor serve --server trio | asgi-uvicorn
| asgi-hypercorn``), real clients: the chaos crowd (cuts and resumes, counts
every event), the third-party ``websockets`` client, plain HTTP for the
health and metrics endpoints, and SIGTERM sent to the process.
"""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path

import pytest
import trio
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from supervisor.cli._chaos import ChaosConfig, run_chaos
from supervisor.cli._wire_client import WireClient, WireRejectedError
from tests.attack_support import ServerProcess, http_get, make_certificate, server_process
from tests.gateway_support import Frame, contiguous, read_until, read_until_closed, seq_of

SERVERS = ["trio", "asgi-uvicorn", "asgi-hypercorn"]
ASGI = ["asgi-uvicorn", "asgi-hypercorn"]
#: Every client comes from 127.0.0.1.
CROWD = ["--max-connections-per-address", "512", "--max-sessions-per-address", "512"]
LIMIT = 60.0


def _url(server: ServerProcess) -> str:
    return f"ws://{server.host}:{server.port}{server.path}"


@pytest.mark.parametrize("server", SERVERS)
async def test_chaos_loses_and_repeats_nothing(server: str) -> None:
    with trio.fail_after(LIMIT):
        async with server_process("--server", server, "--event-rate", "50", *CROWD) as process:
            config = ChaosConfig(clients=8, duration_s=3, drop_rate=1.5, seed=11)
            report = await run_chaos(_url(process), config)
    totals = report.totals
    assert (totals.lost, totals.duplicated, totals.errors) == (0, 0, 0), totals
    assert totals.sessions == 8
    assert totals.resumes > 0 and totals.events_delivered > 0, totals
    assert totals.answered == totals.inputs, totals


async def _recv(ws: ClientConnection) -> Frame:
    message = await ws.recv()
    assert isinstance(message, str)
    frame = json.loads(message)
    assert isinstance(frame, dict)
    return frame


async def _journey(url: str) -> dict[str, object]:
    """Open, stream, input, cut, resume, repeat the input, close: what was seen."""
    seen: dict[str, object] = {}
    async with asyncio.timeout(LIMIT - 10):
        ws = await connect(url, proxy=None, open_timeout=5, close_timeout=2)
        await ws.send(json.dumps({"type": "session.open"}))
        created = await _recv(ws)
        seen["created"] = created["type"]
        await ws.send(json.dumps({"type": "input", "client_event_id": "i1", "text": "hi"}))
        seqs: list[int] = []
        while True:
            frame = await _recv(ws)
            if (seq := seq_of(frame)) is not None:
                seqs.append(seq)
            if frame.get("type") == "response.done" and len(seqs) >= 3:
                break
        ws.transport.abort()  # a cut: no close frame
        await asyncio.sleep(0.2)
        ws = await connect(url, proxy=None, open_timeout=5, close_timeout=2)
        await ws.send(
            json.dumps(
                {
                    "type": "session.resume",
                    "session_id": created["session_id"],
                    "resume_token": created["resume_token"],
                    "last_received_server_event_seq": seqs[-1],
                }
            )
        )
        resumed = await _recv(ws)
        seen["resumed"] = resumed["type"]
        seen["generation"] = resumed["attachment_generation"]
        await ws.send(json.dumps({"type": "input", "client_event_id": "i1", "text": "hi"}))
        after: list[int] = []
        while True:
            frame = await _recv(ws)
            if (seq := seq_of(frame)) is not None:
                after.append(seq)
            if frame.get("type") == "input.duplicate":
                seen["duplicate"] = frame["client_event_id"]
                break
        seen["contiguous"] = contiguous(1, seqs + after)
        await ws.send(json.dumps({"type": "session.close"}))
        try:
            while True:
                await _recv(ws)
        except ConnectionClosed as closed:
            seen["close"] = (
                closed.rcvd.code if closed.rcvd else None,
                closed.rcvd and closed.rcvd.reason,
            )
    return seen


@pytest.mark.parametrize("server", SERVERS)
async def test_the_websockets_client_cuts_resumes_and_closes(server: str) -> None:
    with trio.fail_after(LIMIT):
        async with server_process("--server", server, "--event-rate", "50") as process:
            url = _url(process)
            seen = await trio.to_thread.run_sync(lambda: asyncio.run(_journey(url)))
    assert seen == {
        "created": "session.created",
        "resumed": "session.resumed",
        "generation": 2,
        "duplicate": "i1",
        "contiguous": True,
        "close": (1000, "session_closed"),
    }


async def _http_get(process: ServerProcess, path: str) -> tuple[int, str]:
    return await http_get(process.host, process.port, path)


@pytest.mark.parametrize("server", SERVERS)
async def test_health_readiness_and_metrics(server: str) -> None:
    with trio.fail_after(LIMIT):
        async with server_process("--server", server, "--event-rate", "50") as process:
            client = await WireClient.connect(_url(process))
            await client.send_json({"type": "session.open"})
            await read_until(client, "response.output_text.delta")
            await client.cut()
            resumer = await WireClient.connect(_url(process))
            await resumer.send_json(
                {
                    "type": "session.resume",
                    "session_id": "sess_unknown",
                    "resume_token": "x",
                    "last_received_server_event_seq": 0,
                }
            )
            await read_until_closed(resumer)
            await resumer.cut()
            assert await _http_get(process, "/healthz") == (200, "ok\n")
            assert await _http_get(process, "/readyz") == (200, "ready\n")
            status, metrics = await _http_get(process, "/metrics")
            # Every server says what it speaks.
            assert (await _http_get(process, "/nowhere"))[0] == 426
    assert status == 200
    lines = metrics.splitlines()
    assert 'duplex_sessions{state="live"} 1.0' in lines, metrics
    assert 'duplex_resumes_total{outcome="unknown_session"} 1.0' in lines, metrics
    assert any(line.startswith("duplex_events_journaled_total ") for line in lines)
    for name in (
        "duplex_events_delivered_total",
        "duplex_journal_refusals_total",
        "duplex_session_crashes_total",
        "duplex_session_restarts_total",
        "duplex_outbox_sends_in_progress",
        "duplex_outbox_frames_queued",
        "duplex_send_latency_seconds_bucket",
    ):
        assert any(line.startswith(name) for line in lines), name
    journaled = next(ln for ln in lines if ln.startswith("duplex_events_journaled_total "))
    assert float(journaled.split()[1]) > 0


@pytest.mark.parametrize("server", SERVERS)
async def test_sigterm_closes_every_client_going_away_and_exits_0(server: str) -> None:
    with trio.fail_after(LIMIT):
        async with server_process("--server", server, "--event-rate", "50") as process:
            clients = []
            for _ in range(3):
                client = await WireClient.connect(_url(process))
                await client.send_json({"type": "session.open"})
                await read_until(client, "response.output_text.delta")
                clients.append(client)
            process.process.send_signal(signal.SIGTERM)
            closes = []
            for client in clients:
                _, closed = await read_until_closed(client)
                closes.append((closed.code, closed.reason))
                await client.cut()
            assert await process.process.wait() == 0
    assert closes == [(1001, "going_away")] * 3
    assert process.log_count("SIGTERM: closing every connection") == 1


@pytest.mark.parametrize("server", SERVERS)
async def test_the_protocol_core_rules_every_server(server: str) -> None:
    """The same answers from the one core, whichever shell carries the bytes."""
    # Long enough that a loaded machine does not turn a prompt first frame into a
    # handshake_timeout; short enough to wait for one in the test.
    flags = ["--server", server, "--event-rate", "0", "--handshake-timeout", "2"]
    flags += ["--max-inputs-per-second", "2", "--resume-failures", "1"]
    with trio.fail_after(LIMIT):
        async with server_process(*flags) as process:
            url = _url(process)

            async def refused(*frames: Frame) -> tuple[list[object], int | None]:
                client = await WireClient.connect(url)
                for frame in frames:
                    await client.send_json(frame)
                got, closed = await read_until_closed(client)
                await client.cut()
                return [f.get("code") for f in got], closed.code

            assert await refused({"type": "ack", "server_event_seq": 1}) == (["bad_request"], 4400)
            assert await refused() == (["handshake_timeout"], 4408)
            client = await WireClient.connect(url)
            await client.send_json({"type": "session.open"})
            created = await client.receive_json()
            for n in range(3):  # a burst of 2 a second: the third is refused
                await client.send_json({"type": "input", "client_event_id": f"i{n}", "text": "x"})
            answers: dict[str, str] = {}
            while len(answers) < 3:
                frame = await client.receive_json()
                if frame.get("type") in ("response.done", "error"):
                    answers[str(frame["client_event_id"])] = str(frame.get("code", frame["type"]))
            assert answers == {"i0": "response.done", "i1": "response.done", "i2": "rate_limited"}
            await client.cut()
            resume = {
                "type": "session.resume",
                "session_id": created["session_id"],
                "resume_token": "wrong",
                "last_received_server_event_seq": 0,
            }
            assert await refused(resume) == (["invalid_resume_token"], 4403)
            assert await refused(resume) == (["resume_throttled"], 4429)
            resume["resume_token"] = created["resume_token"]  # never refused by the throttle
            owner = await WireClient.connect(url)
            await owner.send_json(resume)
            assert (await owner.receive_json())["type"] == "session.resumed"
            await owner.send_json({"type": "input", "client_event_id": "i0", "text": "x"})
            assert await read_until(owner, "input.duplicate")
            await owner.send_json({"type": "session.close"})
            _, closed = await read_until_closed(owner)
            await owner.cut()
            assert (closed.code, closed.reason) == (1000, "session_closed")


@pytest.mark.parametrize("server", ASGI)
async def test_an_asgi_server_refuses_before_the_upgrade_as_the_trio_server(server: str) -> None:
    flags = ["--server", server, "--allowed-origin", "https://ok.example"]
    flags += ["--max-connections-per-address", "1"]
    with trio.fail_after(LIMIT):
        async with server_process(*flags) as process:
            base = f"ws://{process.host}:{process.port}"
            statuses = []
            for path, origin in [("/elsewhere", "https://ok.example"), ("/v1", "https://evil")]:
                status = 429
                # Counted at accept: the refused connection before this one
                # holds the address's one place until the server has closed it.
                while status == 429:
                    try:
                        client = await WireClient.connect(base + path, headers={"Origin": origin})
                    except WireRejectedError as rejected:
                        status = rejected.status
                    else:
                        await client.cut()
                        status = 101
                    if status == 429:
                        await trio.sleep(0.05)
                statuses.append(status)
            while True:
                try:
                    held = await WireClient.connect(
                        base + "/v1", headers={"Origin": "https://ok.example"}
                    )
                    break
                except WireRejectedError as rejected:  # the last refused one is still closing
                    assert rejected.status == 429, rejected
                    await trio.sleep(0.05)
            try:
                await WireClient.connect(base + "/v1", headers={"Origin": "https://ok.example"})
            except WireRejectedError as rejected:
                statuses.append(rejected.status)
            finally:
                await held.cut()
    # The trio server's statuses: no such path, a foreign origin, the address's cap.
    assert statuses == [404, 403, 429]


@pytest.mark.parametrize("server", ASGI)
async def test_an_asgi_server_serves_wss(server: str, tmp_path: Path) -> None:
    cert, key = make_certificate(tmp_path)
    with trio.fail_after(LIMIT):
        async with server_process("--server", server, "--event-rate", "50", tls=(cert, key)) as p:
            url = f"wss://127.0.0.1:{p.port}{p.path}"
            client = await WireClient.connect(url, ca_file=cert)
            try:
                await client.send_json({"type": "session.open"})
                assert (await client.receive_json())["type"] == "session.created"
                assert seq_of(await client.receive_json()) == 1
            finally:
                await client.cut()


def _gauge(metrics: str, name: str) -> float:
    line = next(ln for ln in metrics.splitlines() if ln.startswith(f"{name} "))
    return float(line.split()[1])


@pytest.mark.parametrize("server", SERVERS)
async def test_serve_passivate_after_parks_an_idle_detached_session(server: str) -> None:
    flags = ("--server", server, "--event-rate", "0", "--passivate-after", "0")
    with trio.fail_after(LIMIT):
        async with server_process(*flags) as process:
            stays = await WireClient.connect(_url(process))
            await stays.send_json({"type": "session.open"})
            assert (await stays.receive_json())["type"] == "session.created"
            leaves = await WireClient.connect(_url(process))
            await leaves.send_json({"type": "session.open"})
            assert (await leaves.receive_json())["type"] == "session.created"
            await leaves.cut()
            # The registry sweeps once a second: the detached one parks at a sweep.
            while True:
                metrics = (await _http_get(process, "/metrics"))[1]
                if _gauge(metrics, 'duplex_sessions{state="parked"}') >= 1:
                    break
                await trio.sleep(0.1)
            await stays.cut()
    assert _gauge(metrics, 'duplex_sessions{state="parked"}') == 1
    assert _gauge(metrics, 'duplex_sessions{state="live"}') == 1
    assert _gauge(metrics, 'duplex_sessions{state="attached"}') == 1
