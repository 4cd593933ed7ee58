"""A browser's credential: in the opening frame (no header, nothing in a URL),
seen by the ``authenticate`` hook; and query strings kept out of log lines."""

from __future__ import annotations

import logging

import pytest
import trio

from supervisor.cli._wire_client import WireClient
from supervisor.gateway import GatewayConfig, bearer_secret
from supervisor.gateway._logs import redact_query_strings
from tests.gateway_support import LIMIT, errors, read_until_closed
from tests.test_gateway_auth import gateway

SECRET = "s3cret-in-frame"


async def test_the_hook_sees_the_opening_frames_secret() -> None:
    config = GatewayConfig(port=0, authenticate_on_first_frame=True)
    with trio.fail_after(LIMIT):
        async with gateway(config, bearer_secret(SECRET)) as gw:
            client = await WireClient.connect(gw.url)
            await client.send_json({"type": "session.open", "secret": SECRET})
            created = await client.receive_json()
            assert created["type"] == "session.created"
            await client.cut()

            # A resume carries it too (the hook's identity must match the opener's).
            again = await WireClient.connect(gw.url)
            await again.send_json(
                {
                    "type": "session.resume",
                    "session_id": created["session_id"],
                    "resume_token": created["resume_token"],
                    "last_received_server_event_seq": 0,
                    "secret": SECRET,
                }
            )
            assert (await again.receive_json())["type"] == "session.resumed"
            await again.cut()

            opens: list[dict[str, object]] = [
                {"type": "session.open"},
                {"type": "session.open", "secret": "no"},
            ]
            for frame in opens:
                refused = await WireClient.connect(gw.url)
                await refused.send_json(frame)
                frames, closed = await read_until_closed(refused)
                await refused.cut()
                assert (errors(frames), closed.code) == (["unauthorized"], 4401)


def test_a_servers_log_line_names_a_path_without_its_query(
    caplog: pytest.LogCaptureFixture,
) -> None:
    redact_query_strings()
    with caplog.at_level(logging.INFO, logger="uvicorn.error"):
        logging.getLogger("uvicorn.error").info(
            '%s - "WebSocket %s" [accepted]', "127.0.0.1:5", "/v1?token=hunter2"
        )
        logging.getLogger("uvicorn.error").info("%(path)s", {"path": "/v1?token=hunter2"})
    assert "hunter2" not in caplog.text
    assert '"WebSocket /v1" [accepted]' in caplog.text
