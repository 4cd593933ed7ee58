"""The chaos clients against a real gateway: cuts, resumes, nothing lost or repeated."""

from __future__ import annotations

import os

import pytest
import trio
from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, RejectConnection, Request

from supervisor.cli._chaos import ChaosConfig, Targets, _Client, run_chaos
from supervisor.cli._wire_client import WireClient, WireRejectedError
from supervisor.gateway._engine import EngineConfig
from supervisor.gateway._server import GatewayConfig
from tests.attack_support import reset_on_close
from tests.gateway_support import LIMIT, running_gateway


async def test_chaos_clients_lose_and_repeat_nothing() -> None:
    # 100 events/s and up to 0.3 s away: a cut client comes back to a replay.
    engine = EngineConfig(event_rate_hz=100)
    chaos = ChaosConfig(
        clients=8,
        duration_s=3.0,
        drop_rate=2.0,
        max_reconnect_delay_s=0.3,
        input_rate_hz=2.0,
        ack_every=5,
        audio_rate_hz=20.0,
        seed=20240611,
    )
    with trio.fail_after(LIMIT):
        async with running_gateway(GatewayConfig(port=0), engine=engine) as harness:
            report = await run_chaos(harness.url, chaos)
            totals = report.totals
            assert (totals.lost, totals.duplicated, totals.errors) == (0, 0, 0), totals
            assert totals.error_codes == {}
            assert report.ok
            assert totals.sessions == 8
            assert totals.disconnects > 0
            assert totals.resumes == totals.disconnects
            assert totals.replayed > 0
            assert totals.inputs > 0
            assert totals.answered == totals.inputs
            assert totals.events_delivered > totals.replayed
            # Upstream: binary audio chunks, each received exactly once through the cuts.
            assert totals.client_events_sent > 0
            assert totals.client_events_received_once == totals.client_events_sent
            assert (totals.lost_upstream, totals.duplicated_upstream) == (0, 0)
            assert [c.sessions for c in report.clients] == [1] * 8

            # The gateway's view agrees: nothing refused. (A resume whose socket
            # was cut before its activation went out is rolled back, not counted:
            # the client resumes again with the same token.)
            counters = harness.gateway.counters
            stats = harness.gateway.registry.stats()
            assert counters.sessions_opened == 8
            assert counters.errors == {}
            assert 0 < counters.resumes <= stats.resumes <= totals.resumes
            assert counters.resumes + stats.rollbacks == stats.resumes
            assert stats.invalid_tokens == stats.gap_errors == stats.sessions_failed == 0
            # Every client closed its session at the end.
            with trio.move_on_after(2):
                while harness.gateway.registry.session_ids():
                    await trio.sleep(0.02)
            assert harness.gateway.registry.session_ids() == []


async def test_a_refused_open_is_counted_as_an_error_not_raised() -> None:
    config = GatewayConfig(port=0, shared_secret="s3cret")
    with trio.fail_after(LIMIT):
        async with running_gateway(config) as harness:
            report = await run_chaos(
                harness.url, ChaosConfig(clients=3, duration_s=0.5, drop_rate=0.0)
            )
    assert report.totals.errors == 3
    assert report.totals.error_codes == {"unauthorized": 3}
    assert report.totals.sessions == 0
    assert not report.ok


async def _dying_process(
    targets: Targets, index: int, upgrade: bool, task_status: trio.TaskStatus[str]
) -> None:
    """A gateway process SIGKILLed while it upgraded one connection (as the
    demos do, marked down first; the others live): the stream just ends
    (a FIN, no answer), or ``upgrade``: it answers 101, then the socket is
    reset before the resume arrives."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    host, port = listeners[0].socket.getsockname()[:2]
    task_status.started(f"ws://{host}:{port}/v1")
    stream = await listeners[0].accept()
    ws = WSConnection(ConnectionType.SERVER)
    while not any(isinstance(event, Request) for event in ws.events()):
        ws.receive_data(await stream.receive_some())
    targets.down = {index}
    if upgrade:
        # No checkpoint between the 101 and the reset (send_all would yield):
        # the client reads its 101 with the reset already in.
        os.write(stream.socket.fileno(), ws.send(AcceptConnection()))
        reset_on_close(stream)
    stream.socket.close()
    await listeners[0].aclose()


async def _refusing_process(task_status: trio.TaskStatus[str]) -> None:
    """A live gateway process that refuses every upgrade with HTTP 503."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    host, port = listeners[0].socket.getsockname()[:2]
    task_status.started(f"ws://{host}:{port}/v1")
    async with listeners[0]:
        while True:
            async with await listeners[0].accept() as stream:
                ws = WSConnection(ConnectionType.SERVER)
                while not any(isinstance(event, Request) for event in ws.events()):
                    ws.receive_data(await stream.receive_some())
                await stream.send_all(ws.send(RejectConnection(status_code=503)))


async def test_a_resume_a_live_process_refuses_is_an_error_not_a_cut() -> None:
    # Its own process is dead, so a broken resume is a cut; but a live
    # process's HTTP refusal is an answer, counted by run(), never retried
    # for ever (it was, once the resume's sends were treated as cuts).
    with trio.fail_after(LIMIT):
        async with (
            running_gateway(GatewayConfig(port=0)) as harness,
            trio.open_nursery() as nursery,
        ):
            refusing = await nursery.start(_refusing_process)
            targets = Targets([harness.url, refusing])
            client = _Client(0, targets, ChaosConfig(clients=1, max_reconnect_delay_s=0.0))
            targets.mark_down(1)
            ws = await client.open()
            targets.down = {0}  # its process died; only the refusing one lives
            with pytest.raises(WireRejectedError) as refused:
                await client._come_back(ws, trio.current_time() + 5)
            assert refused.value.status == 503
            nursery.cancel_scope.cancel()


@pytest.mark.parametrize("upgrade", [False, True], ids=["mid-upgrade", "after-upgrade"])
async def test_a_resume_its_process_dies_under_goes_on_elsewhere_with_no_error(
    upgrade: bool,
) -> None:
    # The demos SIGKILL a process: a client resuming on it that very moment
    # must try another, as it does when its live connection breaks.
    with trio.fail_after(LIMIT):
        async with (
            running_gateway(GatewayConfig(port=0)) as harness,
            trio.open_nursery() as nursery,
        ):
            targets = Targets([harness.url, "ws://unused"])
            dying = await nursery.start(_dying_process, targets, 1, upgrade)
            targets.urls = (harness.url, dying)
            client = _Client(0, targets, ChaosConfig(clients=1, max_reconnect_delay_s=0.0))
            targets.mark_down(1)
            ws = await client.open()
            await client.send_input(ws)  # owed: each resume sends it again
            # The live one looks down a moment: the resume picks the dying one.
            targets.down = {0}
            ws = await client._come_back(ws, trio.current_time() + 5)
            assert (client.process, targets.down) == (0, {1})
            assert (client.report.errors, client.report.resumes) == (0, 1), client.report
            while client.unanswered:
                client.on_frame(await ws.receive_json())
            assert client.report.answered == 1, client.report
            await ws.close()


async def test_an_open_whose_first_frame_breaks_cuts_its_connection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Connected, then the session.open frame's send broke (its process died
    # that moment): the connection is the client's to cut, not the garbage
    # collector's (whose "unclosed socket" warning would land in some later test).
    connected: list[WireClient] = []
    connect = _Client.connect

    async def recording_connect(self: _Client) -> WireClient:
        ws = await connect(self)
        connected.append(ws)
        return ws

    async def broken_send(self: WireClient, frame: dict[str, object]) -> None:
        raise trio.BrokenResourceError("the process died")

    monkeypatch.setattr(_Client, "connect", recording_connect)
    monkeypatch.setattr(WireClient, "send_json", broken_send)
    with trio.fail_after(LIMIT):
        async with running_gateway(GatewayConfig(port=0)) as harness:
            client = _Client(0, Targets([harness.url]), ChaosConfig(clients=1))
            await client.run(trio.current_time() + 1)
    assert client.report.error_codes == {"BrokenResourceError": 1}
    assert len(connected) == 1
    stream = connected[0]._stream
    assert isinstance(stream, trio.SocketStream)
    assert stream.socket.fileno() == -1  # closed
