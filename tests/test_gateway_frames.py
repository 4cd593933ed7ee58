"""Bad frames get the right error (and close code where fatal), and touch no one else.

Every test runs a neighbouring session that streams in the background through
the whole mischief; at the end its sequences must still be 1, 2, 3, ... with
no error frame and the stream still flowing.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
import trio

from supervisor.cli._wire_client import WireClient
from supervisor.gateway._engine import EngineConfig
from supervisor.gateway._protocol import CLOSE_CODES
from supervisor.gateway._server import GatewayConfig
from tests.gateway_support import (
    LIMIT,
    Frame,
    contiguous,
    errors,
    read_until,
    read_until_closed,
    running_gateway,
    seqs,
)

MAX_FRAME = 1024


async def _send_bad(client: WireClient, kind: str, *, first: bool = False) -> None:
    """One malformed frame of ``kind``; ``first``: as the connection's first frame."""
    if kind == "binary":
        await client.send_bytes(b'{"type": "ack", "server_event_seq": 1}')
    elif kind == "oversize":
        text = "x" * (MAX_FRAME + 1)
        await client.send_text(json.dumps({"type": "input", "client_event_id": "i", "text": text}))
    elif kind == "oversize_in_utf8":
        # Fewer characters than the limit, more bytes: the limit is in bytes.
        # Valid but for its size (an extra field is ignored).
        frame = {"type": "session.open" if first else "ack", "server_event_seq": 0}
        frame["pad"] = "\u00e9" * (MAX_FRAME // 2 + 1)
        text = json.dumps(frame, ensure_ascii=False)
        assert len(text) < MAX_FRAME < len(text.encode())
        await client.send_text(text)
    else:
        await client.send_text(BAD_TEXT[kind])


BAD_TEXT = {
    "not_json": '{"type": "ack", ',
    "not_object": '["session.open"]',
    "unknown_type": '{"type": "session.pause"}',
    "no_type": '{"server_event_seq": 1}',
    "ack_seq_string": '{"type": "ack", "server_event_seq": "3"}',
    "ack_seq_bool": '{"type": "ack", "server_event_seq": true}',
    "ack_seq_negative": '{"type": "ack", "server_event_seq": -1}',
    "input_id_int": '{"type": "input", "client_event_id": 7, "text": "hi"}',
    "input_text_missing": '{"type": "input", "client_event_id": "i"}',
    "resume_token_null": (
        '{"type": "session.resume", "session_id": "s", "resume_token": null,'
        ' "last_received_server_event_seq": 0}'
    ),
    "secret_int": '{"type": "session.open", "secret": 42}',
}
KINDS = [*BAD_TEXT, "binary", "oversize", "oversize_in_utf8"]


def _config(**overrides: Any) -> GatewayConfig:
    return dataclasses.replace(GatewayConfig(port=0, max_frame_bytes=MAX_FRAME), **overrides)


@pytest.mark.parametrize("kind", [*KINDS, "ack_ahead_of_head", "second_open"])
async def test_bad_frame_in_a_session_is_answered_and_the_session_streams_on(kind: str) -> None:
    with trio.fail_after(LIMIT):
        async with running_gateway(_config()) as harness:
            neighbour = await harness.neighbour()
            opened = await harness.open()
            client = opened.client
            before = await read_until(client, "response.output_text.delta")
            if kind == "ack_ahead_of_head":
                await client.send_json({"type": "ack", "server_event_seq": 10**6})
            elif kind == "second_open":  # out of order: the session is already open
                await client.send_json({"type": "session.open"})
            else:
                await _send_bad(client, kind)
            during = await read_until(client, "error")
            assert during[-1]["code"] == "bad_request", during[-1]
            assert isinstance(during[-1]["message"], str) and during[-1]["message"]
            # The connection stays, and its own stream goes on without a hole.
            after = await read_until(client, "response.output_text.delta")
            for _ in range(3):
                after += await read_until(client, "response.output_text.delta")
            received = seqs(before + during + after)
            assert contiguous(1, received), received
            assert errors(before + during + after) == ["bad_request"]
            assert harness.gateway.counters.errors == {"bad_request": 1}
            await neighbour.check_undisturbed()


@pytest.mark.parametrize("kind", [*KINDS, "ack_first", "input_first", "close_first"])
async def test_bad_first_frame_is_fatal_with_4400(kind: str) -> None:
    with trio.fail_after(LIMIT):
        async with running_gateway(_config()) as harness:
            neighbour = await harness.neighbour()
            client = await harness.connect()
            if kind == "ack_first":
                await client.send_json({"type": "ack", "server_event_seq": 0})
            elif kind == "input_first":
                await client.send_json({"type": "input", "client_event_id": "i", "text": "t"})
            elif kind == "close_first":
                await client.send_json({"type": "session.close"})
            else:
                await _send_bad(client, kind, first=True)
            frames, closed = await read_until_closed(client)
            assert errors(frames) == ["bad_request"], frames
            assert (closed.code, closed.reason) == (4400, "bad_request")
            assert harness.gateway.registry.session_ids() == [neighbour.opened.session_id]
            await neighbour.check_undisturbed()


async def test_a_flood_past_the_websocket_cap_ends_only_that_connection() -> None:
    with trio.fail_after(LIMIT):
        async with running_gateway(_config()) as harness:
            neighbour = await harness.neighbour()
            opened = await harness.open()
            # Bad frames whose error answers meet a connection the library
            # closed (1009) for the flood right behind them.
            for _ in range(5):
                await opened.client.send_text("null")
            flood = "x" * (4 * MAX_FRAME + 1)  # past the library's own cap
            await opened.client.send_json({"type": "input", "client_event_id": "i", "text": flood})
            frames, closed = await read_until_closed(opened.client)
            assert closed.code == 1009, (closed.code, closed.reason)
            assert set(errors(frames)) <= {"bad_request"}
            await neighbour.check_undisturbed()
            assert (await harness.open()).generation == 1  # still serving


async def test_resume_of_an_unknown_session_is_4404() -> None:
    with trio.fail_after(LIMIT):
        async with running_gateway(_config()) as harness:
            neighbour = await harness.neighbour()
            client = await harness.resume("sess_nobody", "a-token", 0)
            frames, closed = await read_until_closed(client)
            assert errors(frames) == ["unknown_session"], frames
            assert (closed.code, closed.reason) == (4404, "unknown_session")
            # Even the neighbour's own id with someone else's token gets nowhere.
            client = await harness.resume(neighbour.opened.session_id, "not-its-token", 0)
            frames, closed = await read_until_closed(client)
            assert errors(frames) == ["invalid_resume_token"]
            assert closed.code == CLOSE_CODES["invalid_resume_token"]
            await neighbour.check_undisturbed()


async def test_resume_past_expired_events_is_a_journal_gap_4410() -> None:
    with trio.fail_after(LIMIT):
        async with running_gateway(_config(replay_ttl_s=0.2)) as harness:
            neighbour = await harness.neighbour()
            opened = await harness.open()
            received = await read_until(opened.client, "response.output_text.delta")
            await opened.client.cut()
            await harness.wait_detached(opened.session_id)
            await trio.sleep(0.4)  # past the TTL: the oldest events expire...
            await harness.gateway.registry.sweep()  # ...and are pruned now
            client = await harness.resume(opened.session_id, opened.token, 0)
            frames, closed = await read_until_closed(client)
            assert errors(frames) == ["journal_gap"], frames
            assert (closed.code, closed.reason) == (4410, "journal_gap")
            gap = frames[0]
            assert gap["requested"] == 0
            first_retained, head = gap["first_retained"], gap["head"]
            assert isinstance(first_retained, int) and isinstance(head, int)
            assert first_retained > seqs(received)[-1] >= 1
            assert head >= first_retained - 1
            assert isinstance(gap["reason"], str) and gap["reason"]
            # Counted by reason, for /metrics (duplex_resume_gaps_total{reason}).
            assert harness.gateway.counters.gap_reasons == {gap["reason"]: 1}
            metrics = harness.gateway.service.metrics.render().decode()
            assert f'duplex_resume_gaps_total{{reason="{gap["reason"]}"}} 1.0' in metrics
            await neighbour.check_undisturbed()


@pytest.mark.parametrize("secret", [None, "", "wrong", "s3cret-but-longer"])
async def test_open_without_the_shared_secret_is_4401(secret: str | None) -> None:
    with trio.fail_after(LIMIT):
        async with running_gateway(_config(shared_secret="s3cret")) as harness:
            good = await harness.open(secret="s3cret")
            client = await harness.connect()
            frame: Frame = {"type": "session.open"}
            if secret is not None:
                frame["secret"] = secret
            await client.send_json(frame)
            frames, closed = await read_until_closed(client)
            assert errors(frames) == ["unauthorized"], frames
            assert (closed.code, closed.reason) == (4401, "unauthorized")
            assert harness.gateway.registry.session_ids() == [good.session_id]
            assert harness.gateway.counters.sessions_opened == 1


async def test_no_first_frame_in_time_is_4408() -> None:
    with trio.fail_after(LIMIT):
        async with running_gateway(_config(handshake_timeout_s=1.0)) as harness:
            neighbour = await harness.neighbour()
            client = await harness.connect()
            frames, closed = await read_until_closed(client)
            assert errors(frames) == ["handshake_timeout"], frames
            assert (closed.code, closed.reason) == (4408, "handshake_timeout")
            await neighbour.check_undisturbed()


async def test_input_repeated_after_a_resume_is_answered_once() -> None:
    engine = EngineConfig(event_rate_hz=0, deltas_per_answer=3)
    with trio.fail_after(LIMIT):
        async with running_gateway(_config(), engine=engine) as harness:
            opened = await harness.open()
            await opened.client.send_json({"type": "input", "client_event_id": "q1", "text": "hi"})
            # Cut after the answer's first delta: the rest and its response.done
            # are journaled while detached and replayed.
            first = await read_until(opened.client, "response.output_text.delta")
            await opened.client.cut()
            await harness.wait_detached(opened.session_id)
            last = seqs(first)[-1]
            client = await harness.resume(opened.session_id, opened.token, last)
            await client.send_json({"type": "input", "client_event_id": "q1", "text": "hi"})
            await client.send_json({"type": "input", "client_event_id": "q2", "text": "ho"})
            frames = await read_until(client, "response.done", client_event_id="q2")
            with trio.move_on_after(0.3):  # a second answer to q1 would come by now
                while True:
                    frames.append(await client.receive_json())
            assert frames[0]["type"] == "session.resumed"
            everything = first + frames
            done = [f.get("client_event_id") for f in everything if f["type"] == "response.done"]
            assert sorted(map(str, done)) == ["q1", "q2"], done
            duplicates = [f for f in everything if f["type"] == "input.duplicate"]
            assert duplicates == [{"type": "input.duplicate", "client_event_id": "q1"}]
            # One answer each: 3 deltas and a done, 8 events, 1..8 once each.
            assert contiguous(1, seqs(everything)), seqs(everything)
            assert seqs(everything)[-1] == 8
            assert harness.gateway.registry.stats().events_journaled == 8
