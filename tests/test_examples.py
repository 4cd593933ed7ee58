"""``examples/fastapi_app.py`` run as a user would: ``uvicorn examples.fastapi_app:app``.

A real uvicorn process serves the FastAPI app with the gateway mounted at
``/gateway``; the ``websockets`` client opens a session as one user, gets
the example engine's greeting and spelled answer, is refused resuming as
another user (4401: the identity is bound to the session), and resumes as
itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import trio
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from tests.gateway_support import Frame

ROOT = Path(__file__).resolve().parent.parent
LIMIT = 40.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


async def _recv(ws: ClientConnection) -> Frame:
    frame = json.loads(await ws.recv())
    assert isinstance(frame, dict)
    return frame


async def _resume(base: str, user: str, created: Frame, last: int) -> ClientConnection:
    ws = await connect(f"{base}/gateway/v1?user={user}", proxy=None, open_timeout=5)
    resume = {
        "type": "session.resume",
        "session_id": created["session_id"],
        "resume_token": created["resume_token"],
        "last_received_server_event_seq": last,
    }
    await ws.send(json.dumps(resume))
    return ws


async def _conversation(base: str) -> dict[str, object]:
    seen: dict[str, object] = {}
    async with asyncio.timeout(LIMIT - 10):
        ws = await connect(f"{base}/gateway/v1?user=ada", proxy=None, open_timeout=5)
        await ws.send(json.dumps({"type": "session.open"}))
        created = await _recv(ws)
        hello = await _recv(ws)
        seen["hello"] = (hello["type"], hello["user"], hello["server_event_seq"])
        await ws.send(json.dumps({"type": "input", "client_event_id": "q1", "text": "hey"}))
        letters: list[str] = []
        while (frame := await _recv(ws))["type"] == "letter":
            letters.append(str(frame["letter"]))
        seen["answer"] = ("".join(letters), frame["type"], frame["client_event_id"])
        ws.transport.abort()
        await asyncio.sleep(0.2)
        intruder = await _resume(base, "bob", created, 1)
        try:
            await _recv(intruder)
            await _recv(intruder)
        except ConnectionClosed as closed:
            seen["intruder"] = closed.rcvd.code if closed.rcvd else None
        owner = await _resume(base, "ada", created, 1)
        resumed = await _recv(owner)
        replay = [(await _recv(owner))["type"] for _ in range(4)]
        seen["owner"] = (resumed["type"], replay)
        await owner.close()
    return seen


@contextlib.asynccontextmanager
async def _uvicorn(app: str, cwd: Path) -> AsyncIterator[str]:
    """``python -m uvicorn APP`` run from ``cwd`` on a free port: its base ws:// URL."""
    port = _free_port()
    command = [sys.executable, "-m", "uvicorn", app, "--port", str(port)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    process = await trio.lowlevel.open_process(
        command, cwd=str(cwd), stderr=subprocess.PIPE, env=env
    )
    assert process.stderr is not None
    try:
        log = b""
        while b"Uvicorn running on" not in log:
            chunk = await process.stderr.receive_some()
            assert chunk, log.decode()
            log += chunk
        yield f"ws://127.0.0.1:{port}"
    finally:
        process.send_signal(signal.SIGINT)
        with trio.CancelScope(shield=True):
            await process.wait()
            await process.stderr.aclose()


async def _get(base: str, path: str) -> bytes:
    port = int(base.rsplit(":", 1)[1])
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        request = f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        await stream.send_all(request.encode())
        answer = b""
        while chunk := await stream.receive_some():
            answer += chunk
    return answer


async def test_the_fastapi_example_serves_its_engine_under_uvicorn() -> None:
    with trio.fail_after(LIMIT):
        async with _uvicorn("examples.fastapi_app:app", ROOT) as base:
            seen = await trio.to_thread.run_sync(lambda: asyncio.run(_conversation(base)))
            health = await _get(base, "/gateway/healthz")
    assert seen == {
        "hello": ("hello", "ada", 1),
        "answer": ("hey", "response.done", "q1"),
        "intruder": 4401,
        "owner": ("session.resumed", ["letter", "letter", "letter", "response.done"]),
    }
    assert health.startswith(b"HTTP/1.1 200")


def _readme_embedding() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Embedding the gateway", 1)[1].split("\n## ", 1)[0]
    blocks = [b for b in re.findall(r"```python\n(.*?)```", section, re.S) if "FastAPI(" in b]
    assert len(blocks) == 1, blocks
    return str(blocks[0])


async def _bearer_session(base: str) -> tuple[str, int | None, str]:
    async with asyncio.timeout(LIMIT - 10):
        url = f"{base}/gateway/v1"
        refused = await connect(url, proxy=None, open_timeout=5)
        try:  # refused as it connects: maybe before session.open is even sent
            await refused.send(json.dumps({"type": "session.open"}))
            await refused.recv()
            await refused.recv()
        except ConnectionClosed as closed:
            code = closed.rcvd.code if closed.rcvd else None
        headers = {"Authorization": "Bearer change-me"}
        ws = await connect(url, proxy=None, open_timeout=5, additional_headers=headers)
        await ws.send(json.dumps({"type": "session.open"}))
        created = await _recv(ws)
        event = await _recv(ws)
        await ws.close()
    return str(created["type"]), code, str(event["type"])


async def test_the_readmes_fastapi_embedding_runs_as_written(tmp_path: Path) -> None:
    (tmp_path / "app.py").write_text(_readme_embedding(), encoding="utf-8")
    with trio.fail_after(LIMIT):
        async with _uvicorn("app:app", tmp_path) as base:
            seen = await trio.to_thread.run_sync(lambda: asyncio.run(_bearer_session(base)))
            index = await _get(base, "/")
    assert seen == ("session.created", 4401, "response.output_text.delta")
    assert index.startswith(b"HTTP/1.1 200") and b'"/gateway/v1"' in index
