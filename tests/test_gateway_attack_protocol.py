"""Protocol violations get their close code, and frames glued to the upgrade count.

Against a real server process: a WebSocket protocol error is closed 1002, a
text frame that is not UTF-8 1007, a message past the cap 1009 (each a close
frame, not a bare TCP close); a request that is not a WebSocket upgrade gets
an HTTP status; and a ``session.open`` (or ``session.resume``) sent in the
same TCP write as the upgrade request is answered at once.
"""

from __future__ import annotations

import pytest
import trio
from wsproto.events import CloseConnection

from tests.attack_support import (
    BINARY,
    CLOSE,
    LIMIT,
    TEXT,
    RawClient,
    ServerProcess,
    every_shell,  # noqa: F401
    json_frame,
    masked_frame,
    server_process,
    unmasked_frame,
)

#: The first frame must come quickly: a glued frame left unread would be 4408.
FLAGS = ["--handshake-timeout", "2", "--max-frame-bytes", "1024", "--event-rate", "0"]

VIOLATIONS = {
    "unmasked": (unmasked_frame(TEXT, b'{"type": "ack"}'), 1002),
    "reserved_bit": (masked_frame(TEXT, b"{}", rsv1=True), 1002),
    "unknown_opcode": (masked_frame(0x3, b"{}"), 1002),
    "fragmented_control": (masked_frame(0x9, b"ping", fin=False), 1002),
    "continuation_first": (masked_frame(0x0, b"{}"), 1002),
    "bad_close_code": (masked_frame(CLOSE, b"\x03\xe7"), 1002),
    "text_not_utf8": (masked_frame(TEXT, b'{"type": "\xff\xfe"}'), 1007),
    "split_utf8_not_utf8": (masked_frame(TEXT, b"\xe2\x82", fin=False), 1007),
    "too_big": (masked_frame(BINARY, b"x" * 5000), 1009),
}


async def _in_session(server: ServerProcess) -> RawClient:
    client, created = await server.open_session()
    assert created["type"] == "session.created", created
    return client


@pytest.mark.parametrize("violation", list(VIOLATIONS))
async def test_a_protocol_violation_is_closed_with_its_code(violation: str) -> None:
    data, code = VIOLATIONS[violation]
    if violation == "split_utf8_not_utf8":
        data += masked_frame(0x0, b"\x28")  # the continuation breaks the sequence
    with trio.fail_after(LIMIT):
        async with server_process(*FLAGS) as server:
            client = await _in_session(server)
            try:
                await client.send(data)
                frames, closed = await client.until_closed()
                assert isinstance(closed, CloseConnection), (frames, closed)
                assert closed.code == code, closed
                await server.serves()
            finally:
                await client.aclose()


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (b"GET /v1 HTTP/1.1\r\nHost: x\r\n\r\n", 426),
        (b"POST /v1 HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n", 405),
        (b"NOT HTTP AT ALL\r\n\r\n", 400),
        # Headers that never end: refused once past 16 KiB, not buffered for ever.
        (b"GET /v1 HTTP/1.1\r\nHost: x\r\n" + b"X-Pad: " + b"a" * 20_000, 431),
    ],
    ids=["plain_get", "post", "garbage", "huge_headers"],
)
async def test_a_request_that_is_no_upgrade_gets_an_http_status(
    request_bytes: bytes, status: int
) -> None:
    with trio.fail_after(LIMIT):
        async with server_process(*FLAGS) as server:
            stream = await server.stream()
            try:
                await stream.send_all(request_bytes)
                answer = b""
                while chunk := await stream.receive_some(4096):
                    answer += chunk
                assert answer.startswith(b"HTTP/1.1 %d " % status), answer
                await server.serves()
            finally:
                await stream.aclose()


async def test_open_glued_to_the_upgrade_is_answered_at_once() -> None:
    with trio.fail_after(LIMIT):
        async with server_process(*FLAGS) as server:
            client = await server.client()
            try:
                await client.send(server.request(client) + json_frame({"type": "session.open"}))
                await client.accepted()
                created = await client.frame()
                assert isinstance(created, dict) and created["type"] == "session.created", created
                # And a second frame in the same write as both, too.
                other = await server.client()
                glued = json_frame({"type": "session.open"}) + json_frame(
                    {"type": "input", "client_event_id": "q", "text": "?"}
                )
                await other.send(server.request(other) + glued)
                await other.accepted()
                frames: list[dict[str, object]] = []
                while not frames or frames[-1].get("type") != "response.done":
                    frame = await other.frame()
                    assert isinstance(frame, dict), frame
                    frames.append(frame)
                assert frames[0]["type"] == "session.created"
                await other.aclose()
                # A resume glued to its upgrade, too.
                await client.aclose()
                resumed_client, resumed = await server.resume(
                    str(created["session_id"]), str(created["resume_token"]), 0
                )
                assert isinstance(resumed, dict) and resumed["type"] == "session.resumed", resumed
                await resumed_client.aclose()
            finally:
                await client.aclose()
