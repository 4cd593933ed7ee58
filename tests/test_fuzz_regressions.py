"""What the soak and the fuzzers found, pinned down one example each.

Each of these took the whole gateway down (the connection handlers share one
nursery, so one handler's exception ended every connection), or crashed a
session, before the fix beside it:

* a peer that left while the gateway answered it (an ``error`` or an
  ``input.duplicate`` reply whose send raised ``ConnectionClosed``): found by
  the soak, a chaos client resending an input just before its cut;
* a peer that stopped reading while answered (the reply ran into the send
  timeout, ``SendTimeoutError``);
* lone surrogates (``"\\ud800"`` is valid JSON, not UTF-8): an ``input`` id
  echoed in ``input.duplicate`` failed to encode on the way out, and its
  ``response.done`` could not be journaled (the engine stopped that session);
  a ``secret`` raised in the shared-secret check. (A token: see
  ``test_security.py``.)
"""

from __future__ import annotations

import json

import pytest
import trio

from supervisor._faults import FaultPlan
from supervisor.cli._wire_client import WireClient
from supervisor.gateway._engine import EngineConfig
from supervisor.gateway._server import Gateway, GatewayConfig
from tests.soak_support import (
    Frame,
    contiguous,
    fresh_address,
    open_session,
    read_until_closed,
    seqs,
    serving,
)

#: No background stream: a session's sends are exactly its answers, so a
#: transport fault can be aimed at the n-th one.
QUIET = EngineConfig(event_rate_hz=0, deltas_per_answer=2)
LIMIT = 20.0


async def _answered(client: WireClient, client_event_id: str) -> list[Frame]:
    await client.send_json({"type": "input", "client_event_id": client_event_id, "text": "hi"})
    frames: list[Frame] = []
    while not (
        frames
        and frames[-1].get("type") == "response.done"
        and frames[-1].get("client_event_id") == client_event_id
    ):
        frames.append(await client.receive_json())
    return frames


async def _detached(gw: Gateway, session_id: str) -> None:
    while await gw.registry.has_attachment(session_id):
        await trio.sleep(0.01)


async def _still_serving(gw: Gateway, neighbour: WireClient, created: Frame, last: int) -> None:
    """Other sessions answer, new ones open, and the one hit resumes where it was."""
    frames = await _answered(neighbour, "n2")
    assert contiguous(4, seqs(frames)), frames  # n1 had 1-3
    fresh, _ = await open_session(gw.url)
    await fresh.cut()
    client = await WireClient.connect(gw.url, local_address=fresh_address())
    await client.send_json(
        {
            "type": "session.resume",
            "session_id": created["session_id"],
            "resume_token": created["resume_token"],
            "last_received_server_event_seq": last,
        }
    )
    resumed = await client.receive_json()
    assert resumed["type"] == "session.resumed", resumed
    await client.cut()


@pytest.mark.parametrize("answer", ["error", "input.duplicate"])
async def test_a_peer_gone_while_answered_ends_only_its_own_connection(answer: str) -> None:
    plan = FaultPlan()
    with trio.fail_after(LIMIT):
        async with serving(GatewayConfig(port=0), engine=QUIET, faults=plan) as gw:
            neighbour, _ = await open_session(gw.url)
            assert seqs(await _answered(neighbour, "n1")) == [1, 2, 3]
            client, created = await open_session(gw.url)
            session_id = str(created["session_id"])
            assert seqs(await _answered(client, "q1")) == [1, 2, 3]
            # Sends so far: session.created and q1's three events; the answer is the 5th.
            plan.delay_send(session_id, nth=5, seconds=0.3)
            if answer == "error":
                await client.send_json({"type": "ack", "server_event_seq": "three"})
            else:
                await client.send_json({"type": "input", "client_event_id": "q1", "text": "hi"})
            await client.cut()  # gone before the answer goes out
            await _detached(gw, session_id)
            assert plan.fired["send.delay"] == 1
            await _still_serving(gw, neighbour, created, 3)
            await neighbour.cut()


async def test_a_peer_that_stops_reading_while_answered_ends_only_its_own_connection() -> None:
    plan = FaultPlan()
    config = GatewayConfig(port=0, send_timeout_s=0.3)
    with trio.fail_after(LIMIT):
        async with serving(config, engine=QUIET, faults=plan) as gw:
            neighbour, _ = await open_session(gw.url)
            assert seqs(await _answered(neighbour, "n1")) == [1, 2, 3]
            client, created = await open_session(gw.url)
            session_id = str(created["session_id"])
            plan.hang_send(session_id, nth=2)  # its answer to the next frame never leaves
            await client.send_json({"type": "ack", "server_event_seq": -1})
            frames, closed = await read_until_closed(client)
            await client.cut()
            assert frames == []
            assert (closed.code, closed.reason) == (1011, "send_timeout")
            await _detached(gw, session_id)
            await _still_serving(gw, neighbour, created, 0)
            await neighbour.cut()


async def test_a_lone_surrogate_input_id_is_a_bad_request_and_the_session_goes_on() -> None:
    with trio.fail_after(LIMIT):
        async with serving(GatewayConfig(port=0), engine=QUIET) as gw:
            neighbour, _ = await open_session(gw.url)
            client, _ = await open_session(gw.url)
            frame = {"type": "input", "client_event_id": "\ud800", "text": "hi"}
            for _ in range(2):  # the second would have been echoed as a duplicate
                await client.send_text(json.dumps(frame))
                error = await client.receive_json()
                assert (error["type"], error["code"]) == ("error", "bad_request"), error
            # Its own stream goes on: the next input is answered, from sequence 1.
            assert seqs(await _answered(client, "q1")) == [1, 2, 3]
            assert seqs(await _answered(neighbour, "n1")) == [1, 2, 3]
            assert gw.counters.errors == {"bad_request": 2}
            for c in (client, neighbour):
                await c.cut()


@pytest.mark.parametrize("secret", ["\ud800", "s3cr\udfffet"])
async def test_a_lone_surrogate_secret_is_a_bad_request(secret: str) -> None:
    with trio.fail_after(LIMIT):
        async with serving(GatewayConfig(port=0, shared_secret="s3cret"), engine=QUIET) as gw:
            client = await WireClient.connect(gw.url)
            await client.send_text(json.dumps({"type": "session.open", "secret": secret}))
            frames, closed = await read_until_closed(client)
            await client.cut()
            assert [f.get("code") for f in frames] == ["bad_request"]
            assert closed.code == 4400
            good = await WireClient.connect(gw.url)
            await good.send_json({"type": "session.open", "secret": "s3cret"})
            assert (await good.receive_json())["type"] == "session.created"
            await good.cut()
